"""numba_cuda_callable: a Python function that launches Numba kernels, as an XLA op.

The op class and the public function; the primitive its traced calls bind
is in primitive.py, what ``vmap_method`` means in vmap.py, and
NUMBAX_CHECK_INPUTS in inputcheck.py. func's launches may take numbax's C++
launch path: each compiler installs it (compilers/).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from .. import compilers
from ..runtime import keys, numba_bridge, ops, registry, targets
from ..trace import (checks, scalar_args, shape_fns,
                     sharding_rules)
# vmap.py gives the primitive its batching rule when imported.
from . import inputcheck, primitive, vmap  # noqa: F401


class _CalledRef:
    """The registry's reference to what a callable key calls when the call
    has scalars (or NUMBAX_CHECK_INPUTS meets outs or scratch given as a
    function): the op's func, with the key's scalars put at their
    positions, made on demand. Refers to the op weakly, as the registry's
    references do; a strong reference to the function it returns is what
    the instantiated call site holds."""

    __slots__ = ("_op", "_num_results", "_scalars")

    def __init__(self, op, num_results: int, scalars: tuple):
        self._op = weakref.ref(op)
        self._num_results = num_results
        self._scalars = scalars

    def alive(self) -> bool:
        return self._op() is not None

    def __call__(self):
        op = self._op()
        return None if op is None else op._target(self._num_results,
                                                  self._scalars)


def _check_leading_axis(inputs, out_specs, op: str) -> None:
    """Every input, output and scratch buffer needs the same axis-0 extent."""
    extents = [(f"input {i}", int(x.shape[0])) for i, x in enumerate(inputs)]
    extents += [(f"output/scratch {i}", int(s.shape[0]))
                for i, s in enumerate(out_specs)]
    if len({n for _, n in extents}) > 1:
        listed = ", ".join(f"{what}: {n}" for what, n in extents)
        raise ValueError(
            f"{op}: batch_partitionable=True declares that axis 0 of every "
            "input, output and scratch buffer is one independent batch axis, "
            f"so their leading extents must be equal; got {listed}. Pass the "
            "other arrays without a batch axis through jax.shard_map, or "
            "give a sharding_rule that says which arrays share the axis "
            "(e.g. 'i j, j -> i j'), or leave batch_partitionable=False")


class NumbaCudaCallable(ops.Op):
    """The function of JAX arrays returned by :func:`numba_cuda_callable`."""

    def __init__(self, func, outs, *, vmap_method, input_output_aliases,
                 scratch, capture, name, batch_partitionable=False,
                 has_side_effect=False, fast_launch=True, sharding_rule=None):
        self.func = func  # strong: the registry refers to it weakly
        # The name= too, where given: a lambda's qualified name says nothing.
        self._label = op = f"numba_cuda_callable({keys.base_name(func)}" + (
            f", name={name!r})" if name is not None else ")")
        # outs= and scratch= may be functions of the call's arguments
        # (shape_fns.py): resolved per signature when a call is traced.
        self._outs_fn = outs if shape_fns.is_function(outs) else None
        self._scratch_fn = (scratch if shape_fns.is_function(scratch)
                            else None)
        if self._outs_fn is None:
            self.out_specs, self.out_tree = checks.normalize_outs(outs, op=op)
            self._wide_outs = checks.wide_outputs(self.out_specs)
        else:
            self.out_specs, self.out_tree, self._wide_outs = None, None, ()
        self.scratch_specs: list | None = (
            [] if self._scratch_fn is None else None)
        if scratch is not None and self._scratch_fn is None:
            self.scratch_specs = checks.normalize_scratch(scratch, op=op)
        self._calls = shape_fns.Memo()
        self.has_side_effect = bool(has_side_effect)
        # What XLA calls: func itself, or func checked for writes to its
        # inputs (NUMBAX_CHECK_INPUTS=1, read when the op is created).
        self._check_inputs = inputcheck.enabled() and not capture
        self._called = func
        if self._check_inputs and self._fixed():
            self._called = inputcheck.checked(
                func, len(self.out_specs) + len(self.scratch_specs or ()), op)
        self.vmap_method = vmap_method
        self.input_output_aliases = input_output_aliases
        self.name = name
        self.capture = bool(capture)
        self.batch_partitionable = bool(batch_partitionable)
        # The op's own rule (None: none, or batch_partitionable's, which is
        # made per call from the shapes).
        self.sharding_rule = (None if sharding_rule is None else
                              sharding_rules.parse(sharding_rule, op))
        self.fast_launch = bool(fast_launch)
        self.__name__ = getattr(func, "__name__", "numba_cuda_callable")
        self.__doc__ = getattr(func, "__doc__", None)
        self._arities_checked: set = set()
        # Registered now, not when first traced: a process that only
        # creates the op can run a deserialised program that calls it.
        self._group = registry.register_op(
            self, func, name=name, config=self._config(),
            num_outputs=len(self.out_specs or ()),
            num_scratch=len(self.scratch_specs or ()))

    def __repr__(self):
        return f"numbax.numba_cuda_callable({keys.base_name(self.func)})"

    @property
    def _function(self):
        return self.func

    def _fixed(self) -> bool:
        """Whether outs and scratch are fixed (not functions)."""
        return self._outs_fn is None and self._scratch_fn is None

    def _config(self) -> str:
        """What the op was created with, as its key spells it ('fn' for a
        shape function: the call part then spells what it returned)."""
        aval = lambda s: (tuple(s.shape), s.dtype)  # noqa: E731
        outs = ("fn" if self._outs_fn is not None else
                keys.avals_text(map(aval, self.out_specs)))
        scratch = ("fn" if self._scratch_fn is not None else
                   keys.avals_text(map(aval, self.scratch_specs or ())))
        return (f"callable;outs={outs}"
                f";scratch={scratch}"
                f";capture={int(self.capture)}"
                # Only a switched-off op says so: every other op's key stays
                # what it was before the switch existed.
                + ("" if self.fast_launch else ";fast=0")
                # Likewise an op that checks its inputs: its entry calls the
                # checking wrapper, never shared with an op that does not.
                + (";check=1" if self._check_inputs else ""))

    def _resolve(self, inputs, scalars):
        """(out specs, scratch specs, out tree, 64-bit outputs) of a call:
        the fixed ones, or what the shape functions return for it (once
        per signature)."""
        if self._fixed():
            return (self.out_specs, self.scratch_specs, self.out_tree,
                    self._wide_outs)
        return self._calls.resolved(inputs, scalars,
                                    self._resolve_by_functions)

    def _resolve_by_functions(self, args):
        """(out specs, scratch specs, out tree, 64-bit outputs) from what
        the shape functions return for the call's `args`."""
        op = self._label
        outs, tree = shape_fns.outs_for(self._outs_fn, self.out_specs,
                                        self.out_tree, args, op)
        if self._scratch_fn is not None:
            result = shape_fns.evaluate(self._scratch_fn, "scratch", args, op)
            scratch: list | None = checks.normalize_scratch(
                result, shape_fns.where("scratch", args), op=op)
        else:
            scratch = self.scratch_specs
        return outs, scratch, tree, checks.wide_outputs(outs)

    def _target(self, num_results: int, scalars: tuple):
        """What XLA calls for a call with `scalars` and `num_results`
        outputs and scratch buffers: func with the scalars put at their
        positions, its inputs checked where NUMBAX_CHECK_INPUTS asks."""
        user = func = self.func
        if scalars:
            values = [s.value for s in scalars]

            @functools.wraps(user)
            def with_scalars(*args):
                *buffers, stream = args
                # The inputs, with each scalar's Python value in its place,
                # then the outputs, scratch and stream.
                return user(*scalar_args.merge(buffers, scalars, values), stream)
            func = with_scalars
        if self._check_inputs:
            func = inputcheck.checked(func, num_results, self._label)
        return func

    def _entry(self, key, n_in, n_out, n_scratch, scalars, aliases, bf16,
               units=(), name=None):
        if scalars or (self._check_inputs and not self._fixed()):
            target = _CalledRef(self, n_out + n_scratch, scalars)
        else:
            # What XLA calls: func, or func checked for input writes.
            target = registry.weak_ref_to(self._called)
        return registry.CallableEntry(
            key, target, n_in, n_out, n_scratch, bfloat16=bf16,
            fast_launch=self.fast_launch,
            aliases=tuple(sorted((aliases or {}).items())),
            name=name or self.profile_name, units=units)

    def _call_spec(self, inputs, aliases, outs, scratch, scalars,
                   name=None) -> str:
        aval = lambda s: (tuple(s.shape), np.dtype(s.dtype))  # noqa: E731
        call = "in=" + keys.avals_text(map(aval, inputs))
        call += keys.alias_spec(aliases)
        # What shape functions returned, and the scalars: a process that
        # resolves the key has nothing else to go by.
        if self._outs_fn is not None:
            call += ";out=" + keys.avals_text(map(aval, outs))
        if self._scratch_fn is not None:
            call += ";scratch=" + keys.avals_text(map(aval, scratch))
        call += scalar_args.scalars_spec(scalars)
        # A use's own name (an XLACustomKernel's, ops.Op.use_name).
        call += keys.profile_spec(name)
        assert "/" not in call, call  # "/" separates a key's parts
        return call

    def _key(self, inputs, aliases=None, outs=None, scratch=None,
             scalars=(), name=None) -> str:
        outs = self.out_specs if outs is None else outs
        scratch = self.scratch_specs if scratch is None else scratch
        call = self._call_spec(inputs, aliases, outs, scratch, scalars, name)
        n_in = len(inputs)
        specs = list(inputs) + list(outs) + list(scratch)
        bf16 = numba_bridge.has_bfloat16(s.dtype for s in specs)

        def entry(key):
            return self._entry(key, n_in, len(outs), len(scratch), scalars,
                               aliases, bf16, name=name)
        return registry.program_key(self.func, self._group, call, entry)

    def entry_for_call(self, key, call, platform):
        """The registry entry of a key this process did not trace (a
        deserialised or cached program), built from its call spec."""
        del platform
        fields = keys.spec_fields(call)
        avals = keys.parse_avals(fields.get("in", ""))
        if self._outs_fn is not None:
            outs = keys.parse_avals(fields.get("out", ""))
        else:
            outs = [(tuple(s.shape), s.dtype) for s in self.out_specs]
        if self._scratch_fn is not None:
            scratch = keys.parse_avals(fields.get("scratch", ""))
        else:
            scratch = [(tuple(s.shape), s.dtype)
                       for s in self.scratch_specs or ()]
        scalars = scalar_args.parse_scalars(fields)
        bf16 = numba_bridge.has_bfloat16(
            [d for _, d in list(avals) + list(outs) + list(scratch)])
        aliases = dict(keys.parse_aliases(fields))
        # A split call's key (registry.with_lead) names its unit axes.
        units = keys.parse_units(fields)
        entry = self._entry(key, len(avals), len(outs), len(scratch), scalars,
                            aliases, bf16, units if any(units) else (),
                            name=keys.parse_profile(fields))
        # A sequential vmap's key names its sliced buffers (vmap.py).
        entry.slices = keys.parse_slices(fields)
        return entry

    def with_sharding_rule(self, rule: str) -> Any:
        # outs and scratch as the op was given them: a shape function stays
        # one.
        outs = self._outs_fn if self._outs_fn is not None else \
            jax.tree_util.tree_unflatten(self.out_tree, self.out_specs)
        scratch = (self._scratch_fn if self._scratch_fn is not None
                   else self.scratch_specs or None)
        return numba_cuda_callable(
            self.func, outs, vmap_method=self.vmap_method,
            input_output_aliases=self.input_output_aliases,
            scratch=scratch, capture=self.capture, name=self.name,
            has_side_effect=self.has_side_effect,
            fast_launch=self.fast_launch, sharding_rule=rule)

    def __call__(self, *args):
        op = self._label
        # func may launch kernels of a compiler whose module was imported
        # after this op was created (numba-cuda-mlir's).
        compilers.install_launch_hooks()
        # A traced scalar (jax.jit made a Python scalar argument a 0-d
        # array) reaches func as a 1-element device array: its value is
        # only known on the device, and a new value is no new key.
        args, traced = scalar_args.with_traced_buffers(
            args, op, aliases=bool(self.input_output_aliases),
            rule=(self.batch_partitionable
                  or self.sharding_rule is not None))
        arrays, scalars = scalar_args.split(args, op)
        positions = None if not scalars else [
            i for i, a in enumerate(args) if not scalar_args.is_scalar(a)]
        inputs = checks.as_input_arrays(arrays, op, positions=positions)
        # Shape functions see a traced scalar as the 0-d array it is.
        out_specs, scratch_specs, out_tree, wide = self._resolve(
            scalar_args.as_passed(inputs, positions, traced), scalars)
        narrow = checks.narrowed_x64(wide, op, self)
        if narrow:
            # x64 off: XLA allocates the 32-bit types, and func gets them.
            out_specs = checks.narrow_specs(out_specs, narrow)
        aliases = checks.check_aliases(self.input_output_aliases, inputs,
                                        out_specs, op)
        nargs = len(args) + len(out_specs) + len(scratch_specs) + 1
        if nargs not in self._arities_checked:
            checks.check_arity(
                self.func, nargs, op,
                checks.arg_layout(len(args), len(out_specs),
                                   len(scratch_specs), stream=True))
            self._arities_checked.add(nargs)
        use = self.use_name()  # an XLACustomKernel's, for this call only
        key = self._key(inputs, aliases, out_specs, scratch_specs, scalars,
                        use)
        target = (targets.CAPTURE_TARGET if self.capture
                  else targets.CALLABLE_TARGET)
        results_specs = list(out_specs) + list(scratch_specs)
        rule = self.sharding_rule
        if self.batch_partitionable:
            _check_leading_axis(inputs, results_specs, op)
            rule = sharding_rules.leading_rule(
                [x.shape for x in inputs], [s.shape for s in results_specs])
        if rule is not None:
            # Refused here, at trace time, naming the op: a rule that does
            # not fit the call, or that leaves nothing to split. The rule
            # covers the array operands only: scalars are not buffers.
            sharding_rules.split(
                rule, [x.shape for x in inputs],
                [s.shape for s in results_specs], op,
                n_free_results=len(scratch_specs),
                aliases=tuple(sorted((aliases or {}).items())))

        # Every call goes through numbax's own primitive, which lowers to
        # the custom call jax.ffi.ffi_call would build (row-major layouts,
        # the aliases, the side effect), named after the op in HLO
        # (profile_names.py). Its batching rule gives vmap_method ffi_call's
        # meaning, except that it broadcasts an unbatched aliased operand
        # (ffi_call's 'expand_dims' gave it a size-1 axis, which XLA's
        # verifier refused against the batched output), refuses jax.vmap
        # of an op without vmap_method naming the op and vmap_method=
        # (ffi_call's refusal names neither), and otherwise makes the
        # batched call one XLA may split along the vmapped axis.
        tracing = any(isinstance(x, jax.core.Tracer) for x in inputs)
        profile_name = use or self.profile_name

        def bind(*xs):
            results = primitive.bind(
                target, xs, results_specs, key=key,
                aliases=aliases, vmap_method=self.vmap_method, rule=rule,
                n_scratch=len(scratch_specs),
                has_side_effect=self.has_side_effect,
                label=primitive.OpLabel.of(op, self),
                profile_name=profile_name)
            return list(results)[:len(out_specs)]

        if tracing:
            # Makes grad name the user's op instead of numbax's shared
            # target. Only when tracing (grad and jit both trace): eager
            # calls of concrete arrays cannot be differentiated, and
            # custom_jvp costs an eager call about 0.25 ms.
            bind = _not_differentiable(bind, op)
            results = _not_transposable(bind(*inputs), op)
        else:
            results = bind(*inputs)
        return jax.tree_util.tree_unflatten(out_tree, list(results))


def _not_differentiable(bind, op: str):
    guarded = jax.custom_jvp(bind)

    def jvp(primals, tangents):
        raise checks.not_differentiable(op, "func")
    guarded.defjvp(jvp)
    return guarded


# jax.linear_transpose inlines custom_jvp, so _not_differentiable cannot
# name the op there; what it then meets first, walking back from the
# results, is this identity of numbax's own, whose transpose names the op
# (under it: numbax's callable primitive, shared by every op, which
# cannot). Only in traced calls (with custom_jvp); it lowers to
# nothing, so the compiled program is the same.
_results_p = Primitive("numbax_callable_results")
_results_p.multiple_results = True
_results_p.def_impl(lambda *xs, op: list(xs))
_results_p.def_abstract_eval(lambda *avals, op: list(avals))
mlir.register_lowering(_results_p, lambda ctx, *xs, op: list(xs))
batching.primitive_batchers[_results_p] = (
    lambda xs, dims, op: (_results_p.bind(*xs, op=op), list(dims)))


# custom_jvp refuses first; the JVP rule is kept for a tangent that gets
# here anyway.
checks.refuse_differentiation(_results_p, "func")


def _not_transposable(results, op: str) -> list:
    return _results_p.bind(*results, op=op)


def numba_cuda_callable(
    func: Callable[..., None],
    outs: Any,
    *,
    vmap_method: str | None = None,
    input_output_aliases: dict[int, int] | None = None,
    scratch: Any = None,
    capture: bool = False,
    name: str | None = None,
    batch_partitionable: bool = False,
    has_side_effect: bool = False,
    fast_launch: bool = True,
    sharding_rule: str | None = None,
) -> Callable[..., Any]:
    """Create a JAX-callable from a Python function that launches Numba CUDA kernels.

    ``func(input_1, ..., output_1, ..., [scratch_1, ...,] stream)`` receives
    Numba CUDA device arrays over XLA's own buffers (zero copy, C-contiguous)
    and a Numba stream over XLA's CUDA stream; it may launch any number of
    kernels on that stream and must return None. On JAX's CPU backend with
    ``NUMBA_ENABLE_CUDASIM=1`` the same ``func`` runs through Numba's CUDA
    simulator over XLA's host buffers. A Python or NumPy scalar input
    reaches ``func`` as its value (static, part of the key); a 0-d array
    input (what ``jax.jit`` makes of a Python scalar argument: a traced
    scalar) as a 1-element device array, so a new value needs no new trace
    (docs/shapes_and_scalars.md).

    Args:
      func: the Python function described above.
      outs: a ``jax.ShapeDtypeStruct`` or a sequence/pytree of them; the
        result has the same structure.
      vmap_method: how ``jax.vmap`` batches the op, with the meaning
        ``jax.ffi.ffi_call`` gives it; ``'sequential'`` calls ``func`` once
        per slice, in order, from one custom call that XLA may split along
        the batch across devices (docs/quickstart.md, "Batching").
      input_output_aliases: ``{input index: output index}``, passed to the
        custom call unchanged (after checking shapes and dtypes), with the
        meaning ``jax.ffi.ffi_call`` gives it.
      scratch: optional ShapeDtypeStruct(s): temporary buffers XLA allocates
        for the call, passed to ``func`` after the outputs (None or an empty
        sequence: none).
      capture: record ``func``'s launches into a CUDA graph and replay it
        without Python. XLA records it into its command buffers where it
        can; elsewhere numbax captures and caches a graph per device and set
        of buffer addresses. ``func`` must then follow the capture rules
        (docs/capture.md): launch only on ``stream``, no host
        synchronisation, no allocation (use ``scratch``), no host reads, and
        the same work for the same shapes.
      name: optional stable name for the op's key (default: the function's
        module and qualified name); also the op's name in profiles
        (default there: the function's qualified name): its HLO custom call
        and, on a GPU, each call's NVTX range carry it
        (``op.profile_name``; docs/profiling.md).
      batch_partitionable: declare that ``func`` treats every index of axis 0
        of every input, output and scratch buffer independently (like
        ``jax.vmap``); they must all have the same leading extent. Under
        ``jax.jit`` with inputs sharded along axis 0, XLA then runs ``func``
        on each device's own rows instead of gathering the whole arrays
        around the call, so ``func`` must take its sizes from the arrays it
        is given. Wrong for anything that mixes rows (a sum, a scan, a
        shift): leave it False there. See docs/multi_gpu.md.
      sharding_rule: which axes of the inputs, outputs and scratch buffers
        are the same factor, in the einsum-like notation of Shardy rules
        (``"i j, j -> i j"``: rows ``i`` of input 0 and of the output, input
        1 whole). XLA may then split the factors that lead every output
        (each input leading with them too, or not naming them): each device
        runs ``func`` on its own shards, and whole copies of the other
        inputs. ``func`` must take its sizes from the arrays. A rule that
        does not fit the call is refused when the op is called.
        Exclusive with ``batch_partitionable`` (the rule
        ``"b ..., b ... -> b ..."``). See docs/multi_gpu.md.
      has_side_effect: declare that ``func`` does more than write its
        outputs (it counts calls, draws host-seeded random numbers, logs,
        or writes memory other than its outputs). Passed to XLA, which then
        never merges two identical calls into one and never drops a call
        whose result is unused. Leave it False for pure functions of their
        inputs, which XLA may then deduplicate and prune.
      fast_launch: let ``func``'s kernel launches skip Numba's Python launch
        (default True): a launch on ``stream`` whose arguments are arrays
        numbax gave ``func`` and plain scalars is packed and launched from
        C++ after its first launch through Numba (or from its first, for a
        ``cache=True`` kernel numbax's cache entry holds; see
        docs/warm_start.md); any other launch goes through Numba
        unchanged. False (or the environment variable
        ``NUMBAX_FAST_LAUNCH=0`` for every op) launches everything through
        Numba. See docs/fast_launch.md.

    The arrays and stream are views valid for one call only: numbax caches
    them per buffer address and hands the same objects to later calls, and
    XLA reuses the memory, so ``func`` must not keep them after it returns
    (the call then fails, naming the argument) nor write its non-aliased
    inputs (read-only in the simulator; ``NUMBAX_CHECK_INPUTS=1`` checks on
    a GPU). See docs/quickstart.md, "What func may keep".

    Returns:
      A function of JAX arrays that works eagerly and inside ``jax.jit``.

    Raises:
      ImportError: Numba with CUDA support is not installed.
      TypeError: ``func`` is not callable, ``outs`` is not
        ShapeDtypeStruct-like, ``capture`` is not a bool or ``name`` not a
        str; (when called) ``func`` cannot take the arguments numbax passes.
      ValueError: an unknown ``vmap_method``; (when called) an input of a
        dtype Numba cannot use. docs/errors.md lists every error.
    """
    numba_bridge.require_cuda()
    # func's launches skip Numba's Python launch where they can
    # (docs/fast_launch.md); installed once, before any func runs.
    compilers.install_launch_hooks()
    if not callable(func):
        raise TypeError(
            f"numba_cuda_callable: func must be callable, got "
            f"{type(func).__name__}: {func!r}; pass the Python function that "
            "launches your kernels, func(inputs..., outputs..., stream)")
    checks.check_vmap_method(vmap_method, "numba_cuda_callable")
    checks.check_bool(capture, "capture", "numba_cuda_callable")
    checks.check_bool(has_side_effect, "has_side_effect", "numba_cuda_callable")
    checks.check_bool(batch_partitionable, "batch_partitionable",
                       "numba_cuda_callable")
    if batch_partitionable and vmap_method == "legacy_vectorized":
        raise ValueError(
            "numba_cuda_callable: batch_partitionable=True cannot be combined "
            "with vmap_method='legacy_vectorized' (deprecated in JAX, and not "
            "a batching numbax's partitionable call implements); use "
            "'expand_dims', 'broadcast_all' or 'sequential'")
    checks.check_bool(fast_launch, "fast_launch", "numba_cuda_callable")
    checks.check_name(name, "numba_cuda_callable",
                      f"numba_cuda_callable({keys.base_name(func)})")
    if sharding_rule is not None and batch_partitionable:
        raise ValueError(
            "numba_cuda_callable: give sharding_rule or "
            "batch_partitionable=True, not both (batch_partitionable=True is "
            "the rule that splits axis 0 of every array)")
    if sharding_rule is not None and vmap_method == "legacy_vectorized":
        raise ValueError(
            "numba_cuda_callable: sharding_rule cannot be combined with "
            "vmap_method='legacy_vectorized' (deprecated in JAX); use "
            "'expand_dims', 'broadcast_all' or 'sequential'")
    return NumbaCudaCallable(func, outs, vmap_method=vmap_method,
                             input_output_aliases=input_output_aliases,
                             scratch=scratch, capture=capture, name=name,
                             batch_partitionable=batch_partitionable,
                             has_side_effect=has_side_effect,
                             fast_launch=bool(fast_launch),
                             sharding_rule=sharding_rule)
