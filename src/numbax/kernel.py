"""numba_cuda_kernel: one compiled Numba kernel, launched from C++ with no Python per call.

The op class and the public function. The launch configuration's checks are
in _launch_config.py, the primitive every op binds in _kernel_primitive.py,
the launch plan C++ launches from in _kernel_plan.py, and the launch on the
CPU through Numba's simulator in _kernel_simulator.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from collections import OrderedDict
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import (_checks, _core, _fast_launch, _fold, _kernel_cache,
               _kernel_plan, _kernel_simulator, _mlir, _numba, _profile,
               _registry, _scalars, _shape_fns, _sharding_rule, _signatures)
# numbax.kernel's names for the launch configuration and the primitive.
from ._kernel_primitive import numbax_kernel_p
from ._launch_config import (MAX_BLOCK, MAX_GRID,  # noqa: F401
                             MAX_SHARED_MEM, MAX_THREADS_PER_BLOCK,
                             VMAP_METHODS, as_dims, check_launch_configuration,
                             check_launch_limits, launch_config, pad3)

# Simulator launchers kept per op (one per unbatched/batched call shape).
MAX_LAUNCHERS = 256


def _signature_str(argtypes) -> str:
    return "(" + ", ".join(str(t) for t in argtypes) + ")"


def _is_device_function(kernel) -> bool:
    options = getattr(kernel, "targetoptions", None)
    if isinstance(options, dict) and options.get("device"):
        return True
    return bool(getattr(kernel, "_device", False))  # the simulator's kernels


def _is_dispatcher(kernel) -> bool:
    if _mlir.is_kernel(kernel):  # numba-cuda-mlir's (_mlir.py)
        return True
    try:
        from numba.cuda.dispatcher import CUDADispatcher
        if isinstance(kernel, CUDADispatcher):
            return True
    except ImportError:
        pass
    try:
        from numba.cuda.simulator.kernel import FakeCUDAKernel
        return isinstance(kernel, FakeCUDAKernel)
    except ImportError:
        return False


class _LauncherRef:
    """The registry's reference to one of an op's simulator launchers.

    Weak, as the registry's references are (neither the launcher nor the op
    is kept alive by it); the op keeps its launchers, at most MAX_LAUNCHERS,
    and numbax.clear_caches() drops them all, at any time, also between a
    trace and XLA's instantiate stage in another thread. Called, it returns
    the launcher (a strong reference), made again from the op (as for a
    deserialised program) when it was dropped; None only once the op is
    gone.
    """

    __slots__ = ("_op", "_spec", "_launcher")

    def __init__(self, op, spec, launcher=None):
        self._op = weakref.ref(op)
        # (avals, out_shapes, batch, broadcast, aliases, _Call, grid_from)
        self._spec = spec
        self._launcher = (weakref.ref(launcher) if launcher is not None
                          else lambda: None)

    def alive(self) -> bool:
        """Whether a call would return a launcher (without making one)."""
        return self._launcher() is not None or self._op() is not None

    def __call__(self):
        launcher = self._launcher()
        if launcher is None:
            op = self._op()
            if op is None:
                return None
            launcher = op._simulator_launcher(*self._spec)
            self._launcher = weakref.ref(launcher)
        return launcher


@dataclasses.dataclass(frozen=True)
class _Call:
    """What one call of an op launches, resolved when it is traced: its
    outputs (unbatched), grid and block, and the scalars passed by value.
    A parameter of numbax_kernel_p (hashable, compared by value), and what
    the call part of the op's key spells where it is not fixed."""
    outs: tuple  # ((shape, np.dtype), ...)
    grid: tuple  # 3 ints
    block: tuple  # 3 ints
    scalars: tuple = ()  # _scalars.Scalar, by position

    @property
    def empty(self) -> bool:
        return 0 in self.grid or 0 in self.block

    @property
    def num_outputs(self) -> int:
        return len(self.outs)

    def out_avals(self, batch: int) -> list:
        lead = (batch,) if batch else ()
        return [(lead + tuple(s), np.dtype(d)) for s, d in self.outs]


def _out_shapes(call: _Call) -> list:
    """The unbatched output shapes of a call."""
    return [tuple(s) for s, _ in call.outs]


def _rule_with_shape_fns_error(op: str, batch_partitionable: bool):
    what = ("batch_partitionable=True" if batch_partitionable
            else "sharding_rule=")
    return ValueError(
        f"{op}: {what} cannot be combined with outs= or launch_dims= given "
        "as a function of the call's arguments: the rule ties the launch to "
        "fixed outputs and launch dimensions. Give outs and launch_dims as "
        "values (one op per shape), or use numba_cuda_callable, whose rules "
        "take shape functions (docs/errors.md)")


class NumbaCudaKernel:
    """The function of JAX arrays returned by :func:`numba_cuda_kernel`."""

    def __init__(self, kernel, outs, *, grid, block, launch_dims,
                 threads_per_block, shared_mem, vmap_method,
                 input_output_aliases, name, batch_partitionable=False,
                 sharding_rule=None):
        self.kernel = kernel
        self.batch_partitionable = bool(batch_partitionable)
        self.sharding_rule = (
            None if sharding_rule is None else _sharding_rule.parse(
                sharding_rule, f"numbax.numba_cuda_kernel("
                f"{_registry.base_name(getattr(kernel, 'py_func', kernel))})"))
        # outs= and launch_dims= may be functions of the call's arguments
        # (_shape_fns.py): resolved per signature when a call is traced.
        self._outs_fn = outs if _shape_fns.is_function(outs) else None
        self._dims_fn = (launch_dims if _shape_fns.is_function(launch_dims)
                         else None)
        if self._has_rule() and (self._outs_fn is not None
                                 or self._dims_fn is not None):
            raise _rule_with_shape_fns_error(
                f"numbax.numba_cuda_kernel("
                f"{_registry.base_name(getattr(kernel, 'py_func', kernel))})",
                self.batch_partitionable)
        if self._outs_fn is None:
            self.out_specs, self.out_tree = _checks.normalize_outs(
                outs, op=f"numba_cuda_kernel("
                f"{_registry.base_name(getattr(kernel, 'py_func', kernel))})")
            self._wide_outs = _checks.wide_outputs(self.out_specs)
        else:
            self.out_specs, self.out_tree, self._wide_outs = None, None, ()
        self.launch_dims = launch_dims
        self.grid = grid
        self.block = block
        self.threads_per_block = threads_per_block
        self.shared_mem = shared_mem
        self.vmap_method = vmap_method
        self.input_output_aliases = input_output_aliases
        self.name = name
        # Set by an XLACustomKernel for the ops its generators return
        # (custom_kernel.py): their profile name is the custom kernel's.
        self._profile_tag: str | None = None
        # Simulator launchers, kept alive here (the registry refers to them
        # weakly), most recently used last, at most MAX_LAUNCHERS: one per
        # batch size would grow without bound. An evicted one is made again
        # when a program needs it; instantiated call sites hold their own.
        self._launchers: OrderedDict = OrderedDict()
        self._arities_checked: set = set()
        # Signature -> (_Call, out tree, 64-bit outputs), for ops with shape
        # functions or calls with scalars.
        self._calls = _shape_fns.Memo()
        self._fixed: _Call | None = None  # the _Call of the fixed form
        # (unbatched argument types, grid) -> FoldDecision (see _fold.py),
        # and the batched kernels compiled for folded launches.
        self._fold_decisions: dict = {}
        self._batched_kernels: dict = {}
        self.__name__ = getattr(kernel, "__name__", "numba_cuda_kernel")
        self._mlir = _mlir.is_kernel(kernel)  # launched with memref params
        self._identity = self._value_identity()
        # JAX hashes the op (a primitive parameter) on every eager bind.
        self._hash = id(self) if self._identity is None else hash(
            self._identity)
        # Registered now, not when first traced: a process that only
        # creates the op can run a deserialised program that calls it (the
        # kernel is compiled then, from the shapes and dtypes in the key).
        self._group = _registry.register_op(
            self, kernel, name=name, config=self._config(),
            num_outputs=len(self.out_specs or ()))

    @property
    def _label(self) -> str:
        """How error messages name the op."""
        return f"numbax.numba_cuda_kernel({_registry.base_name(self._py_func)})"

    def __repr__(self):
        return f"{self._label[:-1]}, vmap: {self._vmap_summary()})"

    @property
    def profile_name(self) -> str:
        """The op's name in profiles: its ``name=``, else the kernel's
        qualified name. HLO names the op's custom calls after it (JAX's
        profiler, TensorBoard, XLA dumps) and, on a GPU, each call is an
        NVTX range with this name (docs/profiling.md)."""
        return (self.name or self._profile_tag
                or _profile.qualified_name(self._py_func))

    def _vmap_summary(self) -> str:
        static = (None if self._dims_fn is not None
                  else self._static_fold(self._launch()[0]))
        if static is not None:
            return str(static)
        decisions = list(self._fold_decisions.values())
        if not decisions:
            return "one launch per batch if the compiled kernel allows " \
                "(op.vmap_fold(*args) tells)"
        if len(set(decisions)) == 1:
            return str(decisions[0])
        return "; ".join(
            f"{_signature_str(t)}"
            + (f" grid {g}" if self._dims_fn is not None else "") + f": {d}"
            for (t, g), d in self._fold_decisions.items())

    def _static_fold(self, grid):
        """The decision when it does not depend on the compiled code."""
        if self.vmap_method == "sequential" or all(
                grid[a] != 1 for a in _fold.FOLD_AXES):
            return _fold.decide(vmap_method=self.vmap_method, grid=grid,
                                cooperative=False, axes_read=frozenset())
        return None

    def vmap_fold(self, *args) -> "_fold.FoldDecision":
        """How ``jax.vmap`` launches this kernel for unbatched inputs like ``args``.

        ``args`` are the inputs of one unbatched call (arrays or
        ``jax.ShapeDtypeStruct``, and scalars passed by value). Returns a
        :class:`FoldDecision`: ``folds`` (the batch runs in one launch),
        ``axis`` (the grid axis indexing the slice) and ``reason``. On a
        GPU this compiles the kernel for those types, as a call would.
        """
        # The checks a call runs: what a call refuses gets no verdict.
        inputs, call, _ = self._checked_call(args, shapes=True)
        avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in inputs]
        argtypes = self._argtypes(avals + call.out_avals(0), 0, call.scalars)
        return self._fold_for(argtypes, call.grid, n_in=len(args))

    def _fold_for(self, argtypes, grid, compiled=None, n_in=None):
        """The FoldDecision for unbatched `argtypes` launched over `grid`,
        decided once."""
        key = (argtypes, tuple(grid))
        decision = self._fold_decisions.get(key)
        if decision is not None:
            return decision
        decision = self._static_fold(grid)
        if decision is None:
            if self._mlir:  # no simulator: read its compiled MLIR
                compiled = compiled or self._compile(argtypes)
                cooperative = bool(compiled.cooperative)
                read, why = _mlir.axes_read_by_compiled(compiled, self.kernel)
            elif _numba.simulator_enabled():
                cooperative = False
                read, why = _fold.axes_read_by_python(self._py_func)
            else:
                compiled = compiled or self._compile(argtypes, n_in)
                cooperative = bool(compiled.cooperative)
                if isinstance(compiled, _kernel_cache.CachedKernel):
                    read, why = compiled.axes_read, compiled.why
                else:
                    read, why = _fold.axes_read_by_compiled(compiled)
            decision = _fold.decide(
                vmap_method=self.vmap_method, grid=grid,
                cooperative=cooperative, axes_read=read, unreadable=why)
            # The simulator reads globals live, batched or not.
            if decision.folds and not _numba.simulator_enabled():
                why = _fold.unknown_globals_reason(self.kernel, argtypes)
                if why:
                    decision = _fold.fallback(why)
        self._fold_decisions[key] = decision
        return decision

    def _batched_kernel(self, num_args, broadcast, decision, argtypes=None,
                        scalars=()):
        """The generated kernel for a folded launch (one per broadcast
        pattern, scalar positions and set of frozen globals)."""
        frozen = (None if _numba.simulator_enabled() or argtypes is None
                  else _fold.frozen_globals(self.kernel, tuple(argtypes)))
        # The frozen values live as long as the kernel: their id is stable.
        key = (num_args, broadcast, decision.axis,
               id(frozen) if frozen else None, tuple(scalars))
        kernel = self._batched_kernels.get(key)
        if kernel is None:
            axis = _fold.AXIS_NAMES.index(decision.axis)
            if self._mlir:
                kernel = _mlir.make_batched_kernel(self.kernel, num_args,
                                                   broadcast, axis, frozen)
            else:
                kernel = _fold.make_batched_kernel(
                    self.kernel, num_args, broadcast, axis, frozen,
                    scalars=scalars)
                # What generated it, as numbax's entry in the kernel's Numba
                # cache names it (_kernel_cache).
                source = _fold.batched_source(num_args, broadcast, axis,
                                              scalars)
                kernel._numbax_kind = (
                    "batched", num_args, tuple(broadcast), axis,
                    hashlib.sha256(source.encode()).hexdigest()[:16])
            self._batched_kernels[key] = kernel
        return kernel

    def _folded(self, argtypes, grid, batch, broadcast, compiled=None,
                scalars=()):
        """(decision, batched kernel or None) for a batched call.
        `broadcast` has a flag per input buffer; `scalars` sit among them."""
        if batch <= 0:
            return None, None
        decision = self._fold_for(argtypes, grid, compiled)
        if not decision.folds:
            return decision, None
        n_args = len(argtypes)
        positions = tuple(s.position for s in scalars)
        # A flag per kernel parameter: the buffers' in order, around the
        # scalars (never sliced), then the outputs (never broadcast).
        flags = iter(broadcast)
        per_param = tuple(False if i in positions else next(flags, False)
                          for i in range(n_args))
        try:
            return decision, self._batched_kernel(n_args, per_param, decision,
                                                  argtypes, positions)
        except Exception as exc:  # e.g. a body Numba refuses as a device fn
            decision = _fold.fallback(
                f"the batched kernel did not build ({type(exc).__name__}: "
                f"{exc})")
            self._fold_decisions[(argtypes, tuple(grid))] = decision
            return decision, None

    def _value_identity(self):
        """What makes two ops the same op, or None where it is unhashable.

        The op is a static parameter of numbax_kernel_p, so JAX's caches key
        compiled programs on it: ops re-created with the same kernel, outs
        and launch configuration (a helper that builds the op per call) must
        compare equal, or every call compiles, and keeps, a new program.
        Shape functions count by identity (the same function object).
        """
        aliases = self.input_output_aliases
        if isinstance(aliases, dict):
            aliases = tuple(sorted(aliases.items(), key=repr))
        outs = self._outs_fn if self._outs_fn is not None else tuple(
            (tuple(s.shape), np.dtype(s.dtype).str) for s in self.out_specs)
        identity = (
            self.kernel, outs, self.out_tree, self.launch_dims, self.grid,
            self.block, self.threads_per_block, self.shared_mem,
            self.vmap_method, aliases, self.name, self.batch_partitionable,
            self.sharding_rule)
        try:
            hash(identity)
        except TypeError:
            return None
        return identity

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, NumbaCudaKernel) or self._identity is None:
            return False
        return self._identity == other._identity

    @property
    def _py_func(self):
        return getattr(self.kernel, "py_func", self.kernel)

    def _launch(self):
        """(grid, block, empty) of one unbatched launch, for an op whose
        launch is fixed (not a launch_dims function)."""
        if self.launch_dims is not None:
            grid, block = launch_config(self.launch_dims, self.threads_per_block)
            empty = 0 in self.launch_dims
        else:
            grid, block = pad3(self.grid), pad3(self.block)
            empty = 0 in grid or 0 in block
        return grid, block, empty

    # -- one call: outs, launch and scalars, resolved per signature -------
    def _resolve(self, inputs, scalars):
        """(_Call, out tree, 64-bit outputs) of a call with `inputs` (arrays
        or ShapeDtypeStructs) and `scalars`: the fixed form's, or what the
        shape functions return for them (once per signature)."""
        if self._outs_fn is None and self._dims_fn is None:
            fixed = self._fixed
            if fixed is None:
                grid, block, _ = self._launch()
                outs = tuple((tuple(s.shape), np.dtype(s.dtype))
                             for s in self.out_specs)
                fixed = self._fixed = _Call(outs, grid, block)
            if scalars:
                fixed = dataclasses.replace(fixed, scalars=tuple(scalars))
            return fixed, self.out_tree, self._wide_outs
        sig = _shape_fns.signature(inputs, scalars)
        known = self._calls.get(sig)
        if known is not None:
            return known
        args = _shape_fns.arguments(inputs, scalars)
        op = self._label
        if self._outs_fn is not None:
            specs, tree = _shape_fns.specs_from(self._outs_fn, "outs", args,
                                                op)
        else:
            specs, tree = self.out_specs, self.out_tree
        if self._dims_fn is not None:
            result = _shape_fns.evaluate(self._dims_fn, "launch_dims", args,
                                         op)
            what = _shape_fns.where("launch_dims", args)
            try:
                dims = as_dims(result, what)
                grid, block = launch_config(dims, self.threads_per_block)
                check_launch_limits(grid, block, f"{op}: {what} = {dims}")
            except ValueError as exc:
                message = str(exc)
                if not message.startswith(op):
                    message = f"{op}: {message}"
                raise ValueError(message) from None
        else:
            grid, block, _ = self._launch()
        outs = tuple((tuple(s.shape), np.dtype(s.dtype)) for s in specs)
        resolved = (_Call(outs, tuple(grid), tuple(block), tuple(scalars)),
                    tree, _checks.wide_outputs(specs))
        return self._calls.put(sig, resolved)

    def _checked_call(self, args, shapes=False):
        """(input buffers, _Call, out tree) of a call with `args`, checked as
        a call checks them (arrays, or with `shapes` ShapeDtypeStructs, and
        scalars passed by value): dtypes, ranks, arity, aliases."""
        op = self._label
        arrays, scalars = _scalars.split(args, op)
        if scalars and self._mlir:
            raise TypeError(
                f"{op}: input {scalars[0].position} is a scalar "
                f"({scalars[0].value!r}), but numbax passes scalars by value "
                "to numba-cuda kernels only, not to numba-cuda-mlir ones; "
                "pass it as a 1-element array (jnp.array([value])) and read "
                "a[0] in the kernel")
        positions = None if not scalars else [
            i for i, a in enumerate(args) if not _scalars.is_scalar(a)]
        inputs = _checks.as_input_arrays(arrays, op, shapes=shapes,
                                         positions=positions)
        call, tree, wide = self._resolve(inputs, scalars)
        _checks.check_x64(wide, op)
        nargs = len(args) + call.num_outputs
        if nargs not in self._arities_checked:
            _checks.check_arity(
                self._py_func, nargs, op,
                _checks.arg_layout(len(args), call.num_outputs),
                what="kernel")
            self._arities_checked.add(nargs)
        if self.input_output_aliases is not None:
            specs = self.out_specs if self._outs_fn is None else [
                jax.ShapeDtypeStruct(s, d) for s, d in call.outs]
            _checks.check_aliases(self.input_output_aliases, inputs, specs,
                                  op)
        return inputs, call, tree

    def _checked_inputs(self, args, shapes=False):
        """The call's input buffers, checked as a call checks them."""
        return self._checked_call(args, shapes)[0]

    # -- GPU: the plan C++ launches from ----------------------------------
    def _argtypes(self, avals, batch, scalars=()):
        """The kernel's argument types: arrays for `avals` (the leading axis
        dropped when `batch`), and each scalar's Numba type at its
        position."""
        if self._mlir:
            return _mlir.argtypes(avals, batch, self._label)
        from numba import types
        tys = []
        for shape, dtype in avals:
            ndim = len(shape) - (1 if batch else 0)
            # A float8 buffer is a uint8 array (its bits) to the kernel.
            tys.append(types.Array(_numba.numba_type_for(dtype), ndim, "C"))
        return tuple(_scalars.merge(
            tys, scalars,
            [_scalars.numba_type(s, self._label) for s in scalars]))

    def _formals(self, argtypes, scalars, n_in):
        """The types the kernel's parameters at the scalars' positions have
        in the version that runs: the explicit signature's, or the scalars'
        own."""
        if not scalars:
            return ()
        chosen = None
        if not _numba.simulator_enabled():
            chosen = _signatures.select_signature(self.kernel, argtypes,
                                                  self._label, n_in)
        formals = argtypes if chosen is None else tuple(chosen)
        return tuple(formals[s.position] for s in scalars)

    def _scalar_values(self, scalars, formals):
        """Each scalar as the kernel parameter of type `formals[i]`
        receives it (a NumPy scalar of its dtype)."""
        names = _signatures._parameter_names(self.kernel)
        return [_scalars.converted(
                    s, f, self._label,
                    _signatures.describe_argument(s.position, None, names))
                for s, f in zip(scalars, formals)]

    def _scalar_params(self, scalars, formals):
        """(position, kind, bytes) per scalar, for the LaunchPlan."""
        names = _signatures._parameter_names(self.kernel)
        return [_scalars.parameter(
                    s, f, self._label,
                    _signatures.describe_argument(s.position, None, names))
                for s, f in zip(scalars, formals)]

    def _compile(self, argtypes, n_in=None):
        argtypes = tuple(argtypes)
        if self._mlir:
            # Explicit signatures: the one Numba's launch would choose, or a
            # TypeError (its compile() would build code for any types).
            chosen = _signatures.select_signature(self.kernel, argtypes,
                                                  self._label, n_in)
            if chosen is not None:
                _fold.note_compiled_elsewhere(self.kernel, argtypes)
                return _mlir.compile_kernel(self.kernel, tuple(chosen),
                                            self._label)
            _fold.note_compile(self.kernel, argtypes)
            return _mlir.compile_kernel(self.kernel, argtypes, self._label)
        # A kernel compiled for explicit signatures: the version Numba's own
        # launch would pick, or a TypeError (never another type's code).
        compiled = _signatures.select(self.kernel, argtypes, self._label,
                                      n_in)
        if compiled is not None:
            _fold.note_compiled_elsewhere(self.kernel, argtypes)
            return self._refuse_debug(compiled)
        # Compiled (or loaded) by Numba in this process already: that one,
        # rather than a second copy of its code from numbax's entry.
        compiled = (getattr(self.kernel, "overloads", None) or {}).get(
            argtypes)
        if compiled is not None:
            _fold.note_compiled_elsewhere(self.kernel, argtypes)
            return self._refuse_debug(compiled)
        # The module globals the body reads are frozen into the code now.
        _fold.note_compile(self.kernel, argtypes)
        # A warm start: numbax's entry beside the kernel's Numba cache, if
        # any, spares this process Numba's compile or load (_kernel_cache).
        cached = _kernel_cache.load(self.kernel, (), argtypes)
        if cached is not None:
            return cached
        compiled = self._numba_compile(argtypes)
        _kernel_cache.save(self.kernel, (), argtypes, compiled,
                           lambda: _fold.axes_read_by_compiled(compiled))
        return compiled

    def _numba_compile(self, argtypes):
        compiled = _checks.compiled_naming_op(
            lambda: self.kernel.compile(argtypes),
            f"{self._label}: Numba could not compile the kernel for argument "
            f"types {argtypes}")
        return self._refuse_debug(compiled)

    def _compile_batched(self, batched, tys):
        """The generated batched kernel compiled for `tys`: from numbax's
        entry in the user kernel's Numba cache if there is one."""
        if self._mlir:
            return _mlir.compile_kernel(batched, tys, self._label)
        kind = getattr(batched, "_numbax_kind", None)
        if kind is None:
            return batched.compile(tys)
        cached = _kernel_cache.load(self.kernel, kind, tys, target=batched)
        if cached is not None:
            return cached
        compiled = batched.compile(tys)
        _kernel_cache.save(self.kernel, kind, tys, compiled)
        return compiled

    def _refuse_debug(self, compiled):
        if getattr(compiled, "debug", False):
            raise ValueError(
                f"{self._label}: kernels compiled with debug=True report errors "
                "through Numba's own launcher; launch them from a "
                "numba_cuda_callable instead, or compile without debug")
        return compiled

    def _config(self) -> str:
        """What the op was created with, as its key spells it: 'fn' for a
        shape function (the call part then spells what it returned)."""
        dims = lambda d: "x".join(map(str, d))  # noqa: E731
        if self._outs_fn is not None:
            outs = "fn"
        else:
            outs = _registry.avals_text(
                (tuple(o.shape), o.dtype) for o in self.out_specs)
        if self._dims_fn is not None:
            launch = "grid=fn;block=fn"
        else:
            grid, block, _ = self._launch()
            launch = f"grid={dims(grid)};block={dims(block)}"
        # Only an op with a rule says so: every other op's key stays what it
        # was before rules existed.
        rule = ("" if not self._has_rule() else ";rule=batch"
                if self.batch_partitionable else
                f";rule={str(self.sharding_rule).replace(', ', ',')}")
        return f"kernel;outs={outs};{launch};smem={self.shared_mem}{rule}"

    # -- partitioning: which calls XLA may split, and how -----------------
    # An op with a rule has fixed outs and launch_dims (refused otherwise
    # when created); `outs` is the call's unbatched output shapes (_Call).
    # Scalars are not buffers: rules, units and grid ties count the array
    # inputs and the outputs only.
    def _has_rule(self) -> bool:
        return self.batch_partitionable or self.sharding_rule is not None

    def _unbatched_rule(self, in_shapes, outs):
        """The op's own rule for unbatched inputs of `in_shapes`, or None."""
        if self.batch_partitionable:
            return _sharding_rule.leading_rule(in_shapes, outs)
        return self.sharding_rule

    def _check_rule(self, in_shapes, outs):
        """Refuses, naming the op, a rule that does not fit a call of
        `in_shapes` or a launch that could not follow the split."""
        rule = self._unbatched_rule(in_shapes, outs)
        if rule is None:
            return
        if self.batch_partitionable:
            extents = {int(s[0]) for s in list(in_shapes) + list(outs)}
            if len(extents) > 1:
                raise ValueError(
                    f"{self._label}: batch_partitionable=True declares that "
                    "axis 0 of every input and output is one independent "
                    "batch axis, so their leading extents must be equal; got "
                    f"inputs {[tuple(s) for s in in_shapes]}, outputs "
                    f"{list(outs)}. Give a sharding_rule that says which "
                    "arrays share the axis (e.g. 'i j, j -> i j'), or use "
                    "jax.shard_map")
        split = _sharding_rule.split(rule, in_shapes, outs, self._label,
                                     aliases=self._alias_pairs())
        if self.launch_dims is not None:
            _sharding_rule.launch_ties(self.launch_dims, split, self._label)

    def _grid_from(self, avals, batch, outs):
        """Per grid axis, the axis of output 0 (as the call's buffers have
        it) whose local extent that axis covers, or -1: the op's rule ties
        the leading launch axes to the split factors."""
        if not self._has_rule() or self.launch_dims is None:
            return (-1, -1, -1)
        shapes = [tuple(s)[1:] if batch else tuple(s) for s, _ in avals]
        rule = self._unbatched_rule(shapes, outs)
        split = _sharding_rule.split(rule, shapes, outs, self._label,
                                     aliases=self._alias_pairs())
        ties = _sharding_rule.launch_ties(self.launch_dims, split, self._label)
        shift = 1 if batch else 0
        ties = tuple(t + shift if t >= 0 else -1 for t in ties)
        return ties + (-1,) * (3 - len(ties))

    def _split(self, ctx, avals, batch, broadcast, call):
        """The Split of a lowered call, or None where XLA gets no rule."""
        from . import _partitioning
        in_shapes = [tuple(s) for s, _ in avals]
        outs = _out_shapes(call)
        if batch:
            unbatched = [s[1:] for s in in_shapes]
            base = self._unbatched_rule(unbatched, outs)
            vmap_only = base is None
            if base is None:
                base = _sharding_rule.unshared_rule(unbatched, outs)
            rule = _sharding_rule.vmapped(base, [not b for b in broadcast])
        else:
            rule, vmap_only = self._unbatched_rule(in_shapes, outs), False
        return _partitioning.split_for(ctx, rule, vmap_only, self._label,
                                       aliases=self._alias_pairs())

    def _alias_pairs(self) -> tuple:
        """input_output_aliases as sorted (input, output) int pairs (checked
        by _checked_inputs before any trace)."""
        return tuple(sorted((int(i), int(o)) for i, o in
                            (self.input_output_aliases or {}).items()))

    def _call_spec(self, avals, batch, broadcast, fold: str = "",
                   aliases: tuple = (), call: _Call | None = None,
                   lead: str = "") -> str:
        flags = "".join("1" if b else "0" for b in broadcast)
        spec = (f"in={_registry.avals_text(avals)};batch={int(batch)}"
                f";bcast={flags}")
        spec += _registry.alias_spec(dict(aliases))
        # How a vmapped call launches (axis/slices per launch) is decided
        # anew from the compiled kernel wherever the key is resolved; it is
        # in the key so that a program built under another chunk limit
        # never shares an entry with this one.
        spec += f";fold={fold}" if fold else ""
        if call is not None:
            # What shape functions returned, and the scalars: a process
            # that resolves the key has nothing else to go by.
            if self._outs_fn is not None:
                spec += f";out={_registry.avals_text(call.outs)}"
            if self._dims_fn is not None:
                spec += (f";grid={'x'.join(map(str, call.grid))}"
                         f";block={'x'.join(map(str, call.block))}")
            spec += _scalars.scalars_spec(call.scalars)
        # The leading unit axes of a call XLA may split (a program of
        # several devices, or an op with a rule): C++ drops them first.
        spec += lead
        assert "/" not in spec, spec  # "/" separates a key's parts
        return spec

    def _fold_spec(self, avals, batch, broadcast, call) -> str:
        """'axis:max slices per launch' for a folded vmapped call, else ''."""
        if batch <= 0:
            return ""
        argtypes = self._argtypes(list(avals) + call.out_avals(batch), batch,
                                  call.scalars)
        decision, batched = self._folded(argtypes, call.grid, batch,
                                         broadcast, scalars=call.scalars)
        if batched is None or not decision.folds:
            return ""
        # ":" not "/": "/" separates the parts of a key (_registry.split_key).
        return f"{decision.axis}:{_fold.MAX_SLICES_PER_LAUNCH}"

    def _parse_call(self, call: str):
        fields = _registry.spec_fields(call)
        avals = _registry.parse_avals(fields.get("in", ""))
        batch = int(fields.get("batch", "0") or 0)
        broadcast = tuple(c == "1" for c in fields.get("bcast", ""))
        if len(broadcast) != len(avals):
            raise ValueError(f"{self!r}: malformed call spec {call!r}")
        scalars = _scalars.parse_scalars(fields)
        if self._outs_fn is not None:
            if "out" not in fields:
                raise ValueError(f"{self!r}: call spec {call!r} has no out=")
            outs = tuple((tuple(s), np.dtype(d)) for s, d in
                         _registry.parse_avals(fields["out"]))
        else:
            outs = tuple((tuple(s.shape), np.dtype(s.dtype))
                         for s in self.out_specs)
        if self._dims_fn is not None:
            try:
                grid, block = (tuple(int(n) for n in fields[k].split("x"))
                               for k in ("grid", "block"))
            except (KeyError, ValueError):
                raise ValueError(
                    f"{self!r}: call spec {call!r} has no grid= and "
                    "block=") from None
        else:
            grid, block, _ = self._launch()
        return (avals, batch, broadcast, _registry.parse_aliases(fields),
                _Call(outs, tuple(grid), tuple(block), scalars),
                _sharding_rule.parse_units(fields))

    def _entry_for_call(self, key, call, platform):
        """The registry entry of a key this process did not trace (a
        deserialised or cached program): built from the call spec, the
        kernel compiled here once per key."""
        avals, batch, broadcast, aliases, resolved, units = \
            self._parse_call(call)
        if platform == "cpu":
            return _registry.CallableEntry(
                key, _LauncherRef(self, (
                    avals, resolved.out_avals(batch), batch, broadcast,
                    aliases, resolved,
                    self._grid_from(avals, batch, _out_shapes(resolved)))),
                len(avals), resolved.num_outputs, 0, aliases=aliases,
                name=self.profile_name, units=units if any(units) else ())
        # On XLA's instantiating thread: compile with device 0's primary
        # context bound for the call (as a trace on the main thread would),
        # so that Numba does not push a context of its own onto XLA's thread.
        return _core.call_on_device(
            0, lambda: self._kernel_entry(key, avals, batch, broadcast,
                                          aliases, resolved, units))

    def _fixed_call(self) -> _Call:
        """The _Call of an op without shape functions and scalars."""
        return self._resolve((), ())[0]

    def _kernel_entry(self, key, avals, batch, broadcast, aliases=(),
                      call=None, units=((), ())):
        call = call if call is not None else self._fixed_call()
        out_avals = call.out_avals(batch)
        dtypes = [d for _, d in list(avals) + out_avals]
        if _numba.has_bfloat16(dtypes):
            _numba.check_bfloat16_devices(repr(self))
        # The kernel's arguments are the inputs then the outputs, with the
        # scalars at their positions among the inputs.
        all_avals = list(avals) + list(out_avals)
        scalars = call.scalars
        argtypes = self._argtypes(all_avals, batch, scalars)
        n_in = len(avals) + len(scalars)
        compiled = self._compile(argtypes, n_in)
        formals = self._formals(argtypes, scalars, n_in)
        params = self._scalar_params(scalars, formals)
        grid, block, empty = call.grid, call.block, call.empty
        decision, batched = self._folded(argtypes, grid, batch, broadcast,
                                         compiled, scalars)
        fold_axis = -1
        if batched is not None:
            try:
                # The batched kernel takes the whole buffers, and each
                # scalar as the version that runs types it.
                tys = _scalars.merge(
                    self._argtypes(all_avals, 0), scalars, list(formals))
                compiled = self._compile_batched(batched, tuple(tys))
                fold_axis = _fold.AXIS_NAMES.index(decision.axis)
            except Exception as exc:
                self._fold_decisions[(argtypes, tuple(grid))] = \
                    _fold.fallback(
                        f"the batched kernel did not compile "
                        f"({type(exc).__name__}: {exc})")
        max_slices = _fold.MAX_SLICES_PER_LAUNCH
        # The registry keeps `plan` but must not keep the op alive: the plan
        # refers to it weakly, and the C++ call site that asks for the plan
        # holds the op (the plan's owner) for as long as it lives.
        op_ref = weakref.ref(self)

        plan = _kernel_plan.builder(op_ref, compiled, grid, block, empty,
                                    batch, broadcast, len(avals), fold_axis,
                                    max_slices, aliases, units,
                                    self._grid_from(avals, batch,
                                                    _out_shapes(call)),
                                    num_outputs=call.num_outputs,
                                    scalars=params)
        return _registry.KernelEntry(key, plan, op_ref)

    def _gpu_key(self, avals, out_avals, batch, broadcast, call=None,
                 split=None):
        call = call if call is not None else self._fixed_call()
        if [tuple(s) for s, _ in out_avals] != [
                s for s, _ in call.out_avals(batch)]:
            raise ValueError(f"{self!r}: outputs {out_avals} do not match "
                             f"outs {list(call.outs)} (batch {batch})")
        # Compiled now, at trace time, so that compile errors surface here.
        aliases = self._alias_pairs()
        units = (split.buffer_units() if split is not None
                 else ((), ()))
        entry = self._kernel_entry("", avals, batch, broadcast, aliases, call,
                                   units)

        def make_entry(key):
            entry.key = key
            return entry
        return _registry.program_key(
            self.kernel, self._group,
            self._call_spec(avals, batch, broadcast,
                            self._fold_spec(avals, batch, broadcast, call),
                            aliases, call,
                            split.lead_spec() if split is not None else ""),
            make_entry)

    # -- CPU: the same launch through Numba's simulator -------------------
    def _simulator_launcher(self, avals, out_shapes, batch, broadcast,
                            aliases=(), call=None, grid_from=(-1, -1, -1)):
        """The function the CPU handler calls: the launch(es) in the simulator."""
        if self._mlir:
            raise _mlir.no_simulator_error(self._label)
        call = call if call is not None else self._fixed_call()
        grid, block, empty = call.grid, call.block, call.empty
        n_in = len(avals)
        all_avals = list(avals) + [(tuple(s), np.dtype(d)) for s, d in out_shapes]
        scalars = call.scalars
        argtypes = self._argtypes(all_avals, batch, scalars)
        decision, batched = self._folded(argtypes, grid, batch, broadcast,
                                         scalars=scalars)
        fold_axis = (-1 if batched is None
                     else _fold.AXIS_NAMES.index(decision.axis))
        max_slices = _fold.MAX_SLICES_PER_LAUNCH if batched is not None \
            else None
        signature = (n_in, batch, tuple(broadcast), fold_axis, max_slices,
                     aliases, grid, block, scalars, tuple(grid_from))
        launcher = self._launchers.get(signature)
        if launcher is None:
            formals = self._formals(argtypes, scalars, n_in + len(scalars))
            values = self._scalar_values(scalars, formals)
            launcher = _kernel_simulator.make_launcher(
                self.kernel, self.shared_mem, self._py_func, n_in, grid, block,
                empty, batch, broadcast, batched, fold_axis, max_slices,
                {o for _, o in aliases},
                [(s.position, v) for s, v in zip(scalars, values)],
                tuple(grid_from))
            # Kept alive here: the registry refers to it weakly.
            launcher = self._launchers.setdefault(signature, launcher)
        try:
            self._launchers.move_to_end(signature)
            while len(self._launchers) > max(1, MAX_LAUNCHERS):
                self._launchers.popitem(last=False)
        except KeyError:  # another thread evicted it meanwhile
            pass
        return launcher

    def _forget_launchers(self):
        """numbax.clear_caches(): drop every simulator launcher."""
        self._launchers.clear()

    def _simulator_key(self, avals, out_shapes, batch, broadcast, call=None,
                       split=None):
        call = call if call is not None else self._fixed_call()
        n_in = len(avals)
        aliases = self._alias_pairs()
        grid_from = self._grid_from(avals, batch, _out_shapes(call))
        units = (split.buffer_units() if split is not None
                 else ((), ()))
        # Made now, so that its errors surface at trace time.
        launcher = self._simulator_launcher(avals, out_shapes, batch, broadcast,
                                            aliases, call, grid_from)

        def make_entry(key):
            return _registry.CallableEntry(
                key, _LauncherRef(self, (avals, out_shapes, batch, broadcast,
                                         aliases, call, grid_from), launcher),
                n_in, call.num_outputs, 0, aliases=aliases,
                name=self.profile_name, units=units)
        return _registry.program_key(
            self.kernel, self._group,
            self._call_spec(avals, batch, broadcast,
                            self._fold_spec(avals, batch, broadcast, call),
                            aliases, call,
                            split.lead_spec() if split is not None else ""),
            make_entry)

    def __call__(self, *args):
        inputs, call, tree = self._checked_call(args)
        # A rule that does not fit this call is refused now, naming the op.
        self._check_rule([tuple(x.shape) for x in inputs], _out_shapes(call))
        outs = numbax_kernel_p.bind(
            *inputs, op=self, out_shapes=call.outs, batch=0,
            broadcast=tuple(False for _ in inputs), call=call)
        return jax.tree_util.tree_unflatten(tree, list(outs))


def numba_cuda_kernel(
    kernel: Any,
    outs: Any,
    *,
    grid: int | Sequence[int] | None = None,
    block: int | Sequence[int] | None = None,
    launch_dims: int | Sequence[int] | Callable[..., Any] | None = None,
    threads_per_block: int = 256,
    shared_mem: int = 0,
    vmap_method: str | None = None,
    input_output_aliases: dict[int, int] | None = None,
    name: str | None = None,
    batch_partitionable: bool = False,
    sharding_rule: str | None = None,
) -> NumbaCudaKernel:
    """Wrap one ``@cuda.jit`` kernel as a JAX function, launched from C++.

    The kernel's arguments are the inputs, then the outputs. An input is an
    array, or a Python or NumPy scalar (``bool``, ``int``, ``float``,
    ``complex``, ``np.float32(...)``, ...), which is passed by value into the
    kernel's parameter at that position, typed as Numba types it (``int``:
    int64, ``float``: float64, ``bool``: boolean, NumPy scalars their dtype)
    or converted to the type the kernel's explicit signature gives it. A
    scalar is static, like a static argument of ``jax.jit``: it is part of
    the op's key, so each new value is a new key and launch plan (the
    compiled code depends on its type only), and ``jax.vmap`` never batches
    it. Values only known at run time go in 1-element arrays.
    It is compiled for the argument types when traced; each call then packs
    the arguments in the compiler's kernel ABI (numba-cuda's, or
    numba-cuda-mlir's memrefs) and launches on XLA's stream from C++, with
    no Python and no GIL, and XLA may capture it in CUDA graphs. A kernel
    with ``cache=True`` also gets an entry of numbax's in its Numba cache,
    from which later processes launch it without Numba compiling or loading
    anything (docs/warm_start.md).

    Launch configuration: ``grid`` and ``block`` (int or up to 3 ints), or
    ``launch_dims`` (1-3 extents; 1-D blocks of ``min(threads_per_block, n)``,
    2-D 16x16, 3-D 8x8x4, grid rounded up).

    ``outs`` and ``launch_dims`` may also be functions of the call's
    arguments (arrays as ``jax.ShapeDtypeStruct``, scalars as their values)
    returning what the fixed form takes, e.g. ``outs=lambda x:
    jax.ShapeDtypeStruct(x.shape, x.dtype)``, ``launch_dims=lambda x:
    x.shape[0]``: evaluated when a call is traced, once per signature, so
    one op serves every shape (docs/shapes_and_scalars.md). A zero extent launches nothing and
    the outputs are zero-filled (one aliased to an input keeps its values).
    ``shared_mem`` is dynamic shared memory in bytes.

    Under ``jax.vmap`` every slice runs the unbatched kernel. When the
    compiled kernel cannot tell the difference (a grid axis is free, the
    kernel never reads it, no grid sync) the whole batch runs in one launch;
    otherwise each slice is a launch of its own. ``op.vmap_fold(*args)`` and
    ``repr(op)`` say which, and why (docs/quickstart.md, "vmap of a kernel").
    ``vmap_method='sequential'`` launches one slice at a time. Nested vmaps
    of any depth flatten into one batch, decided the same way.

    Args:
      kernel: a ``@cuda.jit`` kernel (a Numba CUDA dispatcher, not a device
        function), of numba-cuda or of numba-cuda-mlir (GPU only: it has no
        simulator; docs/compilers.md). Its arguments are the op's inputs,
        then its outputs.
      outs: a ``jax.ShapeDtypeStruct`` or a sequence/pytree of them; the
        result has the same structure. Or a function of the call's
        arguments returning one.
      grid: blocks per grid, an int or 1-3 ints; with ``block``.
      block: threads per block, an int or 1-3 ints; with ``grid``.
      launch_dims: 1-3 extents to cover with one thread each, instead of
        ``grid`` and ``block``; numbax picks the blocks as described above.
        Or a function of the call's arguments returning them.
      threads_per_block: the 1-D block size used with ``launch_dims``
        (default 256).
      shared_mem: bytes of dynamic shared memory per block (default 0).
      vmap_method: ``None``, ``'expand_dims'``, ``'broadcast_all'`` or
        ``'legacy_vectorized'`` (all batch as described above), or
        ``'sequential'`` (one launch per slice, in order). Needs
        ``launch_dims`` unless ``None``.
      input_output_aliases: ``{input index: output index}``: the output is
        written in the input's buffer (same shape and dtype). Input indices
        count the array inputs only (scalars are not buffers).
      name: optional stable name for the op's key, a non-empty str
        (default: the kernel's module and qualified name); also the op's
        name in profiles (default there: the kernel's qualified name): its
        HLO custom call and, on a GPU, each call's NVTX range carry it
        (``op.profile_name``; docs/profiling.md).
      batch_partitionable: declare that the kernel treats every index of
        axis 0 of every input and output independently (they must all have
        the same leading extent): under ``jax.jit`` with inputs sharded
        along axis 0, XLA runs the kernel on each device's own rows instead
        of gathering the arrays. ``launch_dims[0]`` must then be that
        extent: each device launches over its own rows (the grid is read
        from the shards the call receives). Same as
        ``sharding_rule="b ..., b ... -> b ..."``. Not with ``outs`` or
        ``launch_dims`` given as functions.
      sharding_rule: which axes of the array inputs and outputs are the
        same factor, in the einsum-like notation of Shardy rules
        (``"i j, j -> i j"``; scalars are not operands of the rule): XLA
        may split the factors that lead every output (each input leading
        with them too, or not naming them), running the kernel on each
        device's shards with whole copies of the other inputs.
        ``launch_dims`` must start with the extents of the split factors,
        in order (each device launches over its shard), or give
        ``grid``/``block`` (kept as given: the kernel must take its sizes
        from its arrays). Not with ``outs`` or ``launch_dims`` given as
        functions. See docs/multi_gpu.md.

    Returns:
      A function of the inputs (JAX arrays and scalars) returning the
      outputs, usable eagerly and inside ``jax.jit`` and ``jax.vmap``.

    Raises:
      ValueError: an invalid launch configuration (both or neither of
        ``grid``/``block`` and ``launch_dims``, extents out of CUDA's limits,
        a bad ``threads_per_block`` or ``shared_mem``, an explicit grid with
        a ``vmap_method``, or an unknown ``vmap_method``), checked first,
        before the kernel or Numba; and, when
        called, a 0-d array input, a dtype Numba cannot use, aliased buffers
        of different shapes or dtypes, a launch a ``launch_dims`` function
        returned that CUDA cannot run, or an int scalar outside the range
        of its parameter's type in an explicit signature.
      ImportError: Numba with CUDA support is not installed.
      TypeError: ``kernel`` is not a Numba CUDA dispatcher, or is a device
        function; ``name`` is not a str (a blank one is a ValueError);
        when traced, arrays or scalars that none of the signatures the
        kernel was compiled for takes (or a scalar of a kind its parameter
        cannot take: a float for an int); a scalar for a numba-cuda-mlir
        kernel.
    """
    # The launch configuration first, purely (as the reference system does):
    # its errors do not depend on the kernel or on Numba being installed.
    grid, block, launch_dims = check_launch_configuration(
        grid=grid, block=block, launch_dims=launch_dims,
        threads_per_block=threads_per_block, shared_mem=shared_mem,
        vmap_method=vmap_method)
    _checks.check_name(name, "numba_cuda_kernel")
    _checks.check_bool(batch_partitionable, "batch_partitionable",
                       "numba_cuda_kernel")
    if sharding_rule is not None and batch_partitionable:
        raise ValueError(
            "numba_cuda_kernel: give sharding_rule or batch_partitionable=True, "
            "not both (batch_partitionable=True is the rule that splits axis 0 "
            "of every array)")
    _numba.require_cuda()
    _fast_launch.install()  # counts the simulator's launches on the CPU
    if not _is_dispatcher(kernel):
        raise TypeError(
            "numba_cuda_kernel: kernel must be a Numba CUDA kernel (a function "
            "decorated with @cuda.jit, from numba.cuda or numba_cuda_mlir), "
            f"got {type(kernel).__name__}; wrap plain Python launch code with "
            "numba_cuda_callable instead")
    if _is_device_function(kernel):
        raise TypeError(
            "numba_cuda_kernel: kernel is a device function "
            "(@cuda.jit(device=True)), which cannot be launched; wrap it in a "
            "@cuda.jit kernel that calls it")
    op = NumbaCudaKernel(
        kernel, outs, grid=grid, block=block, launch_dims=launch_dims,
        threads_per_block=int(threads_per_block), shared_mem=int(shared_mem),
        vmap_method=vmap_method, input_output_aliases=input_output_aliases,
        name=name, batch_partitionable=batch_partitionable,
        sharding_rule=sharding_rule)
    if op._identity is None:
        return op
    # One object per distinct op while it lives: its compiled kernels,
    # simulator launchers and registry entries are shared by every re-creation.
    return _interned.setdefault(op._identity, op)


# Ops by value (see NumbaCudaKernel._value_identity); an entry goes with its op.
_interned: "weakref.WeakValueDictionary[tuple, NumbaCudaKernel]" = \
    weakref.WeakValueDictionary()
