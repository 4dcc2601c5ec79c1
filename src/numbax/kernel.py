"""numba_cuda_kernel: one compiled Numba kernel, launched from C++ with no Python per call."""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from . import (_batching, _checks, _compat, _core, _fast_launch, _fold, _mlir,
               _nested_vmap, _numba, _registry, _signatures)

# Per rank: 1-D launches use threads_per_block instead.
_DEFAULT_BLOCKS: dict[int, tuple[int, ...]] = {2: (16, 16), 3: (8, 8, 4)}

# Serialises Numba's kernel loads at plan time (NumbaCudaKernel._load).
_NUMBA_LOAD_LOCK = threading.Lock()


# Simulator launchers kept per op (one per unbatched/batched call shape).
MAX_LAUNCHERS = 256

# CUDA's launch limits, the same on every device Numba CUDA supports.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_SHARED_MEM = 2**31 - 1


def _as_dims(value, what: str) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)):
        dims = (value,)
    else:
        try:
            dims = tuple(value)
        except TypeError:
            raise ValueError(
                f"{what} must be an int or a sequence of 1 to 3 ints, got "
                f"{type(value).__name__}: {value!r}") from None
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 axes, got {len(dims)}: "
                         f"{value!r}")
    out = []
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise ValueError(f"{what} must hold ints, got {value!r}")
        if d < 0:
            raise ValueError(f"{what} has a negative extent: {value!r}")
        out.append(int(d))
    return tuple(out)


def _pad3(dims):
    return tuple(dims) + (1,) * (3 - len(dims))


def check_launch_limits(grid, block, origin: str) -> None:
    """ValueError, naming the fix, for a launch CUDA would refuse."""
    grid, block = _pad3(grid), _pad3(block)
    if 0 in grid or 0 in block:
        return  # nothing is launched
    for axis, (n, limit) in enumerate(zip(block, MAX_BLOCK)):
        if n > limit:
            raise ValueError(
                f"{origin}: block {block} has {n} threads on axis {axis}; CUDA "
                f"allows at most {limit} there: use smaller blocks and a "
                "larger grid")
    if math.prod(block) > MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"{origin}: block {block} has {math.prod(block)} threads; CUDA "
            f"allows at most {MAX_THREADS_PER_BLOCK} per block: use smaller "
            "blocks and a larger grid")
    for axis, (n, limit) in enumerate(zip(grid, MAX_GRID)):
        if n > limit:
            raise ValueError(
                f"{origin}: grid {grid} has {n} blocks on axis {axis}; CUDA "
                f"allows at most {limit} there: use larger blocks, or loop "
                "inside the kernel (a grid-stride loop)")


def _signature_str(argtypes) -> str:
    return "(" + ", ".join(str(t) for t in argtypes) + ")"


def _is_device_function(kernel) -> bool:
    options = getattr(kernel, "targetoptions", None)
    if isinstance(options, dict) and options.get("device"):
        return True
    return bool(getattr(kernel, "_device", False))  # the simulator's kernels


def launch_config(launch_dims, threads_per_block):
    """(grid, block) for `launch_dims` extents, as numbax documents it."""
    if len(launch_dims) == 1:
        n = launch_dims[0]
        block = (max(1, min(threads_per_block, n)),)
    else:
        block = tuple(max(1, min(b, n)) for b, n in
                      zip(_DEFAULT_BLOCKS[len(launch_dims)], launch_dims))
    grid = tuple(-(-n // b) for n, b in zip(launch_dims, block))
    return _pad3(grid), _pad3(block)


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


numbax_kernel_p = _compat.eager_primitive("numbax_kernel")


@numbax_kernel_p.def_abstract_eval
def _abstract_eval(*args, op, out_shapes, batch, broadcast):
    return [_compat.shaped_array(s, d) for s, d in out_shapes]


def _lower(ctx, *args, op, out_shapes, batch, broadcast, platform):
    avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_in]
    if platform == "cuda":
        outs = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out]
        key = op._gpu_key(avals, outs, batch, broadcast)
        target = _registry.KERNEL_TARGET
    else:
        key = op._simulator_key(avals, out_shapes, batch, broadcast)
        target = _registry.CALLABLE_TARGET
    if (getattr(ctx.module_context.lowering_parameters, "for_export", False)
            and _registry.is_ambiguous(key)):
        raise _registry.ambiguous_export_error(op._label, key, op.name)
    aliases = op.input_output_aliases or {}
    return jax.ffi.ffi_lowering(
        target,
        operand_output_aliases=dict(aliases),
    )(ctx, *args, key=key)


mlir.register_lowering(numbax_kernel_p, partial(_lower, platform="cuda"),
                       platform="cuda")
mlir.register_lowering(numbax_kernel_p, partial(_lower, platform="cpu"),
                       platform="cpu")


def _batch_rule(args, dims, *, op, out_shapes, batch, broadcast):
    if batch:  # a vmap around a vmap: one batch of every level's slices
        return _nested_vmap.flatten(
            numbax_kernel_p.bind, args, dims, op=op, out_shapes=out_shapes,
            batch=batch, broadcast=broadcast)
    size = _batching.batch_size(args, dims)
    if size == 0:  # no slice to launch: empty outputs
        outs = [jnp.zeros((0,) + tuple(s), d) for s, d in out_shapes]
        return outs, [0] * len(outs)
    # Every vmap_method batches the call; 'sequential' never folds (_fold),
    # so its slices are launched one after another from one handler call.
    aliased_inputs = set((op.input_output_aliases or {}).keys())
    new_args, flags = [], []
    for i, (a, d) in enumerate(zip(args, dims)):
        if d is None:
            a, reuse = a[None], True
        else:
            a = jnp.moveaxis(a, d, 0)
            reuse = a.shape[0] == 1 and size != 1
        if reuse and i in aliased_inputs:
            # Written in place: every slice needs its own copy, of the
            # input's own dtype (`+ 0` made a bool int32, which XLA's alias
            # then refused). The broadcast is a new value; XLA copies an
            # aliased operand that is still read elsewhere.
            a, reuse = jnp.broadcast_to(a, (size,) + a.shape[1:]), False
        new_args.append(a)
        flags.append(reuse)
    out_batched = tuple(((size,) + tuple(s), d) for s, d in out_shapes)
    outs = numbax_kernel_p.bind(*new_args, op=op, out_shapes=out_batched,
                                batch=size, broadcast=tuple(flags))
    return outs, [0] * len(outs)


batching.primitive_batchers[numbax_kernel_p] = _batch_rule


def _jvp_rule(primals, tangents, *, op, **params):
    # Only called with a tangent that is not a symbolic zero: stop_gradient
    # around every input still lets the op run under jax.grad.
    del primals, tangents, params
    raise _checks.not_differentiable(op._label, "the kernel")


def _transpose_rule(cotangents, *args, op, **params):
    # jax.linear_transpose treats the op as linear in an input: it is not.
    del cotangents, args, params
    raise _checks.not_differentiable(op._label, "the kernel")


# Name the user's op (JAX's own refusals name numbax's shared primitive).
ad.primitive_jvps[numbax_kernel_p] = _jvp_rule
ad.primitive_transposes[numbax_kernel_p] = _transpose_rule


class NumbaCudaKernel:
    """The function of JAX arrays returned by :func:`numba_cuda_kernel`."""

    def __init__(self, kernel, outs, *, grid, block, launch_dims,
                 threads_per_block, shared_mem, vmap_method,
                 input_output_aliases, name):
        self.kernel = kernel
        self.out_specs, self.out_tree = _checks.normalize_outs(
            outs, op=f"numba_cuda_kernel("
            f"{_registry.base_name(getattr(kernel, 'py_func', kernel))})")
        self.launch_dims = launch_dims
        self.grid = grid
        self.block = block
        self.threads_per_block = threads_per_block
        self.shared_mem = shared_mem
        self.vmap_method = vmap_method
        self.input_output_aliases = input_output_aliases
        self.name = name
        # Simulator launchers, kept alive here (the registry refers to them
        # weakly), most recently used last, at most MAX_LAUNCHERS: one per
        # batch size would grow without bound. An evicted one is made again
        # when a program needs it; instantiated call sites hold their own.
        self._launchers: OrderedDict = OrderedDict()
        self._arities_checked: set = set()
        # Unbatched argument types -> FoldDecision (see _fold.py), and the
        # batched kernels compiled for folded launches.
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
            num_outputs=len(self.out_specs))

    @property
    def _label(self) -> str:
        """How error messages name the op."""
        return f"numbax.numba_cuda_kernel({_registry.base_name(self._py_func)})"

    def __repr__(self):
        return f"{self._label[:-1]}, vmap: {self._vmap_summary()})"

    def _vmap_summary(self) -> str:
        static = self._static_fold()
        if static is not None:
            return str(static)
        decisions = list(self._fold_decisions.values())
        if not decisions:
            return "one launch per batch if the compiled kernel allows " \
                "(op.vmap_fold(*args) tells)"
        if len(set(decisions)) == 1:
            return str(decisions[0])
        return "; ".join(f"{_signature_str(t)}: {d}"
                         for t, d in self._fold_decisions.items())

    def _static_fold(self):
        """The decision when it does not depend on the compiled code."""
        grid, _, _ = self._launch()
        if self.vmap_method == "sequential" or all(
                grid[a] != 1 for a in _fold.FOLD_AXES):
            return _fold.decide(vmap_method=self.vmap_method, grid=grid,
                                cooperative=False, axes_read=frozenset())
        return None

    def vmap_fold(self, *args) -> "_fold.FoldDecision":
        """How ``jax.vmap`` launches this kernel for unbatched inputs like ``args``.

        ``args`` are the inputs of one unbatched call (arrays or
        ``jax.ShapeDtypeStruct``). Returns a :class:`FoldDecision`: ``folds``
        (the batch runs in one launch), ``axis`` (the grid axis indexing the
        slice) and ``reason``. On a GPU this compiles the kernel for those
        types, as a call would.
        """
        # The checks a call runs: what a call refuses gets no verdict.
        inputs = self._checked_inputs(args, shapes=True)
        avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in inputs]
        outs = [(tuple(o.shape), np.dtype(o.dtype)) for o in self.out_specs]
        return self._fold_for(self._argtypes(avals + outs, 0),
                              n_in=len(inputs))

    def _fold_for(self, argtypes, compiled=None, n_in=None):
        """The FoldDecision for unbatched `argtypes`, decided once."""
        decision = self._fold_decisions.get(argtypes)
        if decision is not None:
            return decision
        decision = self._static_fold()
        if decision is None:
            grid, _, _ = self._launch()
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
                read, why = _fold.axes_read_by_compiled(compiled)
            decision = _fold.decide(
                vmap_method=self.vmap_method, grid=grid,
                cooperative=cooperative, axes_read=read, unreadable=why)
        self._fold_decisions[argtypes] = decision
        return decision

    def _batched_kernel(self, num_args, broadcast, decision):
        """The generated kernel for a folded launch (one per broadcast pattern)."""
        key = (num_args, broadcast, decision.axis)
        kernel = self._batched_kernels.get(key)
        if kernel is None:
            make = (_mlir.make_batched_kernel if self._mlir
                    else _fold.make_batched_kernel)
            kernel = make(
                self.kernel, num_args, broadcast,
                _fold.AXIS_NAMES.index(decision.axis))
            self._batched_kernels[key] = kernel
        return kernel

    def _folded(self, argtypes, batch, broadcast, compiled=None):
        """(decision, batched kernel or None) for a batched call."""
        if batch <= 0:
            return None, None
        decision = self._fold_for(argtypes, compiled)
        if not decision.folds:
            return decision, None
        n_args = len(argtypes)
        flags = tuple(broadcast) + (False,) * (n_args - len(broadcast))
        try:
            return decision, self._batched_kernel(n_args, flags, decision)
        except Exception as exc:  # e.g. a body Numba refuses as a device fn
            decision = _fold.fallback(
                f"the batched kernel did not build ({type(exc).__name__}: "
                f"{exc})")
            self._fold_decisions[argtypes] = decision
            return decision, None

    def _value_identity(self):
        """What makes two ops the same op, or None where it is unhashable.

        The op is a static parameter of numbax_kernel_p, so JAX's caches key
        compiled programs on it: ops re-created with the same kernel, outs
        and launch configuration (a helper that builds the op per call) must
        compare equal, or every call compiles, and keeps, a new program.
        """
        aliases = self.input_output_aliases
        if isinstance(aliases, dict):
            aliases = tuple(sorted(aliases.items(), key=repr))
        identity = (
            self.kernel,
            tuple((tuple(s.shape), np.dtype(s.dtype).str)
                  for s in self.out_specs),
            self.out_tree, self.launch_dims, self.grid, self.block,
            self.threads_per_block, self.shared_mem, self.vmap_method,
            aliases, self.name)
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
        """(grid, block, empty) of one unbatched launch."""
        if self.launch_dims is not None:
            grid, block = launch_config(self.launch_dims, self.threads_per_block)
            empty = 0 in self.launch_dims
        else:
            grid, block = _pad3(self.grid), _pad3(self.block)
            empty = 0 in grid or 0 in block
        return grid, block, empty

    # -- GPU: the plan C++ launches from ----------------------------------
    def _argtypes(self, avals, batch):
        if self._mlir:
            return _mlir.argtypes(avals, batch, self._label)
        from numba import types
        tys = []
        for shape, dtype in avals:
            ndim = len(shape) - (1 if batch else 0)
            tys.append(types.Array(_numba.numba_type_for(dtype), ndim, "C"))
        return tuple(tys)

    def _compile(self, argtypes, n_in=None):
        if self._mlir:
            return _mlir.compile_kernel(self.kernel, argtypes, self._label)
        # A kernel compiled for explicit signatures: the version Numba's own
        # launch would pick, or a TypeError (never another type's code).
        compiled = _signatures.select(self.kernel, argtypes, self._label,
                                      n_in)
        if compiled is not None:
            return self._refuse_debug(compiled)
        try:
            compiled = self.kernel.compile(argtypes)
        except Exception as exc:
            raise type(exc)(
                f"{self._label}: Numba could not compile the kernel for argument "
                f"types {argtypes}: {exc}") from exc
        return self._refuse_debug(compiled)

    def _refuse_debug(self, compiled):
        if getattr(compiled, "debug", False):
            raise ValueError(
                f"{self._label}: kernels compiled with debug=True report errors "
                "through Numba's own launcher; launch them from a "
                "numba_cuda_callable instead, or compile without debug")
        return compiled

    def _config(self) -> str:
        """What the op was created with, as its key spells it."""
        grid, block, _ = self._launch()
        outs = _registry.avals_text(
            (tuple(o.shape), o.dtype) for o in self.out_specs)
        dims = lambda d: "x".join(map(str, d))  # noqa: E731
        return (f"kernel;outs={outs};grid={dims(grid)};block={dims(block)}"
                f";smem={self.shared_mem}")

    @staticmethod
    def _call_spec(avals, batch, broadcast, fold: str = "") -> str:
        flags = "".join("1" if b else "0" for b in broadcast)
        spec = (f"in={_registry.avals_text(avals)};batch={int(batch)}"
                f";bcast={flags}")
        # How a vmapped call launches (axis/slices per launch) is decided
        # anew from the compiled kernel wherever the key is resolved; it is
        # in the key so that a program built under another chunk limit
        # never shares an entry with this one.
        spec += f";fold={fold}" if fold else ""
        assert "/" not in spec, spec  # "/" separates a key's parts
        return spec

    def _fold_spec(self, avals, batch, broadcast) -> str:
        """'axis:max slices per launch' for a folded vmapped call, else ''."""
        if batch <= 0:
            return ""
        argtypes = self._argtypes(list(avals) + self._out_avals(batch), batch)
        decision, batched = self._folded(argtypes, batch, broadcast)
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
        return avals, batch, broadcast

    def _out_avals(self, batch):
        lead = (batch,) if batch else ()
        return [(lead + tuple(o.shape), np.dtype(o.dtype))
                for o in self.out_specs]

    def _entry_for_call(self, key, call, platform):
        """The registry entry of a key this process did not trace (a
        deserialised or cached program): built from the call spec, the
        kernel compiled here once per key."""
        avals, batch, broadcast = self._parse_call(call)
        if platform == "cpu":
            launcher = self._simulator_launcher(
                avals, self._out_avals(batch), batch, broadcast)
            return _registry.CallableEntry(
                key, _registry.weak_ref_to(launcher), len(avals),
                len(self.out_specs), 0)
        # On XLA's instantiating thread: compile with device 0's primary
        # context bound for the call (as a trace on the main thread would),
        # so that Numba does not push a context of its own onto XLA's thread.
        return _core.call_on_device(
            0, lambda: self._kernel_entry(key, avals, batch, broadcast))

    def _kernel_entry(self, key, avals, batch, broadcast):
        out_avals = self._out_avals(batch)
        dtypes = [d for _, d in list(avals) + out_avals]
        if _numba.has_bfloat16(dtypes):
            _numba.check_bfloat16_devices(repr(self))
        # The kernel's arguments are the inputs then the outputs.
        all_avals = list(avals) + list(out_avals)
        argtypes = self._argtypes(all_avals, batch)
        compiled = self._compile(argtypes, len(avals))
        grid, block, empty = self._launch()
        decision, batched = self._folded(argtypes, batch, broadcast, compiled)
        fold_axis = -1
        if batched is not None:
            try:
                tys = self._argtypes(all_avals, 0)
                compiled = (_mlir.compile_kernel(batched, tys, self._label)
                            if self._mlir else batched.compile(tys))
                fold_axis = _fold.AXIS_NAMES.index(decision.axis)
            except Exception as exc:
                self._fold_decisions[argtypes] = _fold.fallback(
                    f"the batched kernel did not compile "
                    f"({type(exc).__name__}: {exc})")
        n_in = len(avals)
        max_slices = _fold.MAX_SLICES_PER_LAUNCH
        # The registry keeps `plan` but must not keep the op alive: the plan
        # refers to it weakly, and the C++ call site that asks for the plan
        # holds the op (the plan's owner) for as long as it lives.
        op_ref = weakref.ref(self)

        def plan():
            from numba import cuda
            op = op_ref()
            if op is None:
                raise LookupError("the numba_cuda_kernel op was collected")
            functions: list[Any] = []
            # compute capability -> Numba's kernel handle, and for
            # cooperative kernels (capability, SMs) -> the grid limit.
            handles: dict = {}
            for ordinal in range(len(cuda.gpus)):
                functions.append(
                    _mlir.function_on(compiled, ordinal, op.shared_mem,
                                      op._label) if op._mlir else
                    op._function_on(compiled, grid, block, ordinal, handles))
            # By keyword: a field that C++ (csrc/launch_plan.h) and this
            # call do not agree on fails here, at construction.
            return _core.LaunchPlan(
                owner=op, functions=functions, num_inputs=n_in,
                num_outputs=len(op.out_specs), grid=grid, block=block,
                shared_mem=op.shared_mem,
                cooperative=bool(compiled.cooperative),
                empty_launch=bool(empty or batch < 0), batch=int(batch),
                broadcast=[bool(b) for b in broadcast], fold_axis=fold_axis,
                max_slices=max_slices, abi=_mlir.MEMREF_ABI if op._mlir else 0)

        return _registry.KernelEntry(key, plan, op_ref)

    def _gpu_key(self, avals, out_avals, batch, broadcast):
        if [tuple(s) for s, _ in out_avals] != [
                s for s, _ in self._out_avals(batch)]:
            raise ValueError(f"{self!r}: outputs {out_avals} do not match "
                             f"outs {self.out_specs} (batch {batch})")
        # Compiled now, at trace time, so that compile errors surface here.
        entry = self._kernel_entry("", avals, batch, broadcast)

        def make_entry(key):
            entry.key = key
            return entry
        return _registry.program_key(
            self.kernel, self._group,
            self._call_spec(avals, batch, broadcast,
                            self._fold_spec(avals, batch, broadcast)),
            make_entry)

    def _function_on(self, compiled, grid, block, ordinal, handles):
        """The CUfunction of `compiled` in device `ordinal`'s primary context.

        Numba keys compiled code by compute capability and loads it as a
        context-independent library, so every device of one capability gets
        the same kernel handle; but Numba's load on a second device wraps
        that library in a second module, and both modules unload it when
        Numba flushes its pending deallocations (at exit, or cuda.close()):
        a double unload inside the driver, which aborted processes on two
        H200s. So Numba loads each kernel once per compute capability, and
        further devices get their function from the same handle (module
        setup callbacks run only in Numba's bind(), at compile time, never
        per device). A cooperative kernel's grid limit depends on the
        device's capability and multiprocessor count: it is computed once
        per pair, through Numba, and a device that brings a new pair loads
        through Numba (_numba.hold_deallocations_at_exit covers that)."""
        from numba import cuda
        device = cuda.gpus[ordinal]
        capability = tuple(device.compute_capability)
        handle = handles.get(capability)
        if compiled.cooperative:
            limit = handles.get(
                (capability, int(device.MULTIPROCESSOR_COUNT)))
            if limit is None:
                handle = None
            else:
                self._check_cooperative_grid(grid, limit, ordinal)
        if handle is not None:
            return _core.kernel_function(handle, ordinal, self.shared_mem)
        return _core.call_on_device(
            ordinal, lambda: self._load(compiled, grid, block, ordinal,
                                        handles, capability))

    def _load(self, compiled, grid, block, ordinal, handles, capability):
        from numba import cuda

        def capability_of(device_id):
            try:
                return tuple(cuda.gpus[device_id].compute_capability)
            except Exception:  # noqa: BLE001 - a device id Numba no longer lists
                return None

        def sm_count_of(device_id):
            return int(cuda.gpus[device_id].MULTIPROCESSOR_COUNT)

        # XLA may instantiate programs on several threads at once, and
        # Numba's get_cufunc checks its per-device cache, then loads: two
        # threads could both load, two modules over one library in one
        # context, unloaded twice later. Every step that may load (the
        # cooperative limit too) runs under the lock.
        with _NUMBA_LOAD_LOCK:
            # The trace compiled (and so loaded) the kernel in whatever
            # context was current then, maybe another device's: reuse that
            # load for every device of its capability.
            loaded = {d: h for d, h in
                      _numba.loaded_kernel_handles(compiled).items()
                      if capability_of(d) == capability}
            if loaded:
                handle = next(iter(loaded.values()))
            else:
                handle = int(compiled._codelibrary.get_cufunc().handle)
                loaded = {ordinal: handle}
            limit = None
            if compiled.cooperative:
                sm_count = sm_count_of(ordinal)
                # Numba computes the limit from its function in the current
                # context: ask on a device where it is loaded that has this
                # SM count (so the same limit). Only a device with an SM
                # count no loaded device has makes Numba load it here, a
                # second module (numbax holds Numba's unloads at exit).
                where = next(
                    (d for d in loaded if sm_count_of(d) == sm_count), None)
                if where is None or where == ordinal:
                    limit = compiled.max_cooperative_grid_blocks(
                        block, self.shared_mem)
                else:
                    limit = _core.call_on_device(
                        where, lambda: compiled.max_cooperative_grid_blocks(
                            block, self.shared_mem))
        handles.setdefault(capability, handle)
        if limit is not None:
            handles[(capability, sm_count)] = limit
            self._check_cooperative_grid(grid, limit, ordinal)
        return _core.kernel_function(handles[capability], ordinal,
                                     self.shared_mem)

    def _check_cooperative_grid(self, grid, limit, ordinal):
        if math.prod(grid) > limit:
            raise ValueError(
                f"{self._label}: the kernel synchronises its grid, so it is "
                f"launched cooperatively, but grid {grid} has "
                f"{math.prod(grid)} blocks and device {ordinal} can run "
                f"at most {limit} at once; shrink the grid (or launch_dims)")

    # -- CPU: the same launch through Numba's simulator -------------------
    def _simulator_launcher(self, avals, out_shapes, batch, broadcast):
        """The function the CPU handler calls: the launch(es) in the simulator."""
        if self._mlir:
            raise _mlir.no_simulator_error(self._label)
        grid, block, empty = self._launch()
        n_in = len(avals)
        all_avals = list(avals) + [(tuple(s), np.dtype(d)) for s, d in out_shapes]
        decision, batched = self._folded(
            self._argtypes(all_avals, batch), batch, broadcast)
        fold_axis = (-1 if batched is None
                     else _fold.AXIS_NAMES.index(decision.axis))
        max_slices = _fold.MAX_SLICES_PER_LAUNCH if batched is not None \
            else None
        signature = (n_in, batch, tuple(broadcast), fold_axis, max_slices)
        launcher = self._launchers.get(signature)
        if launcher is None:
            launcher = self._make_simulator_launcher(
                n_in, grid, block, empty, batch, broadcast, batched, fold_axis,
                max_slices)
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

    def _simulator_key(self, avals, out_shapes, batch, broadcast):
        n_in = len(avals)
        launcher = self._simulator_launcher(avals, out_shapes, batch, broadcast)

        def make_entry(key):
            return _registry.CallableEntry(
                key, _registry.weak_ref_to(launcher), n_in,
                len(self.out_specs), 0)
        return _registry.program_key(
            self.kernel, self._group,
            self._call_spec(avals, batch, broadcast,
                            self._fold_spec(avals, batch, broadcast)),
            make_entry)

    def _make_simulator_launcher(self, n_in, grid, block, empty, batch,
                                 broadcast, batched, fold_axis, max_slices):
        """The simulator's version of the C++ launch (same slicing, same
        chunks of at most MAX_SLICES_PER_LAUNCH slices when folded)."""
        kernel, shared_mem = self.kernel, self.shared_mem

        def launcher(*args):
            *arrays, stream = args
            if empty:
                # As the GPU handler: outputs are zero-filled, except one
                # aliased to an input, which keeps the input's values.
                inputs = {a._ary.__array_interface__["data"][0]
                          for a in arrays[:n_in]}
                for out in arrays[n_in:]:
                    if out._ary.__array_interface__["data"][0] not in inputs:
                        out._ary.fill(0)
                return None
            if batched is not None:
                for start in range(0, batch, max_slices):
                    count = min(max_slices, batch - start)
                    chunk = [a[0:1] if (i < n_in and broadcast[i])
                             else a[start:start + count]
                             for i, a in enumerate(arrays)]
                    chunk_grid = list(grid)
                    chunk_grid[fold_axis] = count
                    batched[tuple(chunk_grid), block, stream, shared_mem](*chunk)
                return None
            slices = range(batch) if batch else [None]
            for s in slices:
                if s is None:
                    view = arrays
                else:
                    view = [a[0] if (i < n_in and broadcast[i]) else a[s]
                            for i, a in enumerate(arrays)]
                kernel[grid[:3], block[:3], stream, shared_mem](*view)
            return None
        launcher.__module__ = getattr(
            self._py_func, "__module__", None)  # type: ignore[assignment]
        launcher.__qualname__ = (
            getattr(self._py_func, "__qualname__", "kernel") + ".simulator")
        return launcher

    def _checked_inputs(self, args, shapes=False):
        """The call's inputs, checked as a call checks them (arrays, or with
        `shapes` ShapeDtypeStructs): dtypes, ranks, arity, aliases."""
        op = self._label
        inputs = _checks.as_input_arrays(args, op, shapes=shapes)
        nargs = len(inputs) + len(self.out_specs)
        if nargs not in self._arities_checked:
            _checks.check_arity(
                self._py_func, nargs, op,
                _checks.arg_layout(len(inputs), len(self.out_specs)),
                what="kernel")
            self._arities_checked.add(nargs)
        _checks.check_aliases(self.input_output_aliases, inputs,
                              self.out_specs, op)
        return inputs

    def __call__(self, *args):
        inputs = self._checked_inputs(args)
        outs = numbax_kernel_p.bind(
            *inputs, op=self,
            out_shapes=tuple((tuple(s.shape), np.dtype(s.dtype))
                             for s in self.out_specs),
            batch=0, broadcast=tuple(False for _ in inputs))
        return jax.tree_util.tree_unflatten(self.out_tree, list(outs))


#: The vmap_method values numba_cuda_kernel accepts: those of
#: jax.ffi.ffi_call, and None. All but 'sequential' batch the same way.
VMAP_METHODS = (None, "expand_dims", "broadcast_all", "legacy_vectorized",
                "sequential")


def _int_in(value, low: int, high: int) -> bool:
    """An int (not a bool) from `low` to `high`."""
    return (not isinstance(value, bool)
            and isinstance(value, (int, np.integer))
            and low <= int(value) <= high)


def check_launch_configuration(*, grid, block, launch_dims, threads_per_block,
                               shared_mem, vmap_method):
    """(grid, block, launch_dims) checked; ValueError for a bad configuration.

    Pure: needs neither the kernel nor Numba.
    """
    _checks.check_vmap_method(vmap_method, "numba_cuda_kernel", VMAP_METHODS)
    if not _int_in(threads_per_block, 1, MAX_THREADS_PER_BLOCK):
        raise ValueError(
            f"threads_per_block must be an int from 1 to "
            f"{MAX_THREADS_PER_BLOCK} (CUDA's limit), got {threads_per_block!r}")
    if not _int_in(shared_mem, 0, MAX_SHARED_MEM):
        raise ValueError(
            f"shared_mem must be an int >= 0 bytes (below 2**31), got "
            f"{shared_mem!r}")
    explicit = grid is not None or block is not None
    if explicit and launch_dims is not None:
        raise ValueError(
            "give either grid and block, or launch_dims, not both")
    if explicit and (grid is None or block is None):
        raise ValueError(
            "grid and block go together: give both (or use launch_dims)")
    if not explicit and launch_dims is None:
        raise ValueError(
            "numba_cuda_kernel needs a launch configuration: grid=..., "
            "block=... or launch_dims=...")
    if explicit:
        if vmap_method is not None:
            raise ValueError(
                "an explicit grid cannot be combined with vmap_method: use "
                "launch_dims, or leave vmap_method=None")
        grid, block = _as_dims(grid, "grid"), _as_dims(block, "block")
        check_launch_limits(grid, block, "numba_cuda_kernel")
    else:
        launch_dims = _as_dims(launch_dims, "launch_dims")
        dims_grid, dims_block = launch_config(launch_dims, threads_per_block)
        check_launch_limits(dims_grid, dims_block,
                            f"numba_cuda_kernel(launch_dims={launch_dims})")
    return grid, block, launch_dims


def numba_cuda_kernel(
    kernel: Any,
    outs: Any,
    *,
    grid: int | Sequence[int] | None = None,
    block: int | Sequence[int] | None = None,
    launch_dims: int | Sequence[int] | None = None,
    threads_per_block: int = 256,
    shared_mem: int = 0,
    vmap_method: str | None = None,
    input_output_aliases: dict[int, int] | None = None,
    name: str | None = None,
) -> NumbaCudaKernel:
    """Wrap one ``@cuda.jit`` kernel as a JAX function, launched from C++.

    The kernel's arguments are the inputs, then the outputs (all arrays).
    It is compiled for the argument types when traced; each call then packs
    the arguments in the compiler's kernel ABI (numba-cuda's, or
    numba-cuda-mlir's memrefs) and launches on XLA's stream from C++, with
    no Python and no GIL, and XLA may capture it in CUDA graphs.

    Launch configuration: ``grid`` and ``block`` (int or up to 3 ints), or
    ``launch_dims`` (1-3 extents; 1-D blocks of ``min(threads_per_block, n)``,
    2-D 16x16, 3-D 8x8x4, grid rounded up). A zero extent launches nothing and
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
        result has the same structure.
      grid: blocks per grid, an int or 1-3 ints; with ``block``.
      block: threads per block, an int or 1-3 ints; with ``grid``.
      launch_dims: 1-3 extents to cover with one thread each, instead of
        ``grid`` and ``block``; numbax picks the blocks as described above.
      threads_per_block: the 1-D block size used with ``launch_dims``
        (default 256).
      shared_mem: bytes of dynamic shared memory per block (default 0).
      vmap_method: ``None``, ``'expand_dims'``, ``'broadcast_all'`` or
        ``'legacy_vectorized'`` (all batch as described above), or
        ``'sequential'`` (one launch per slice, in order). Needs
        ``launch_dims`` unless ``None``.
      input_output_aliases: ``{input index: output index}``: the output is
        written in the input's buffer (same shape and dtype).
      name: optional stable name for the op's key, a non-empty str
        (default: the kernel's module and qualified name).

    Returns:
      A function of JAX arrays (the inputs) returning the outputs, usable
      eagerly and inside ``jax.jit`` and ``jax.vmap``.

    Raises:
      ValueError: an invalid launch configuration (both or neither of
        ``grid``/``block`` and ``launch_dims``, extents out of CUDA's limits,
        a bad ``threads_per_block`` or ``shared_mem``, an explicit grid with
        a ``vmap_method``, or an unknown ``vmap_method``), checked first,
        before the kernel or Numba; and, when
        called, a 0-d input, a dtype Numba cannot use, or aliased buffers of
        different shapes or dtypes.
      ImportError: Numba with CUDA support is not installed.
      TypeError: ``kernel`` is not a Numba CUDA dispatcher, or is a device
        function; ``name`` is not a str (a blank one is a ValueError);
        when traced, arrays that none of the signatures the kernel was
        compiled for takes.
    """
    # The launch configuration first, purely (as the reference system does):
    # its errors do not depend on the kernel or on Numba being installed.
    grid, block, launch_dims = check_launch_configuration(
        grid=grid, block=block, launch_dims=launch_dims,
        threads_per_block=threads_per_block, shared_mem=shared_mem,
        vmap_method=vmap_method)
    _checks.check_name(name, "numba_cuda_kernel")
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
        name=name)
    if op._identity is None:
        return op
    # One object per distinct op while it lives: its compiled kernels,
    # simulator launchers and registry entries are shared by every re-creation.
    return _interned.setdefault(op._identity, op)


# Ops by value (see NumbaCudaKernel._value_identity); an entry goes with its op.
_interned: "weakref.WeakValueDictionary[tuple, NumbaCudaKernel]" = \
    weakref.WeakValueDictionary()
