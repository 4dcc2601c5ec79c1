"""jax.vmap of a numba_cuda_kernel: batched launches, in one place.

Under ``jax.vmap`` numbax launches the unbatched kernel once per slice of
the batch, all from one handler call (C++, kernel_handler.cc), or once for
the whole batch, *folded*: a generated kernel (compilers/fold.py) takes the
batched arrays, picks slice ``blockIdx.<axis>`` of each (slice 0 of a
broadcast input) and calls the user's kernel body, compiled as a device
function, on those slices. The two are the same computation exactly when
nothing in the body can tell the slices' blocks apart from one launch's:

* the unbatched launch leaves a grid axis at extent 1 (``z``, else ``y``)
  for the batch to use;
* the body never reads that axis (``blockIdx``/``gridDim`` of it, through
  ``cuda.grid``/``cuda.gridsize`` or directly), so every slice sees the
  block indices of its own launch;
* the kernel does not synchronise its grid (a cooperative launch would then
  wait on every slice's blocks, and is limited to what fits at once);
* the op was not made with ``vmap_method='sequential'``, which asks for
  one slice at a time (its slices are launched one after another from one
  handler call, as every batch that does not fold is).

:func:`decide` applies that rule and returns a :class:`FoldDecision` with
the reason. What the code reads comes from the kernel's compiler (the fold
reader, Compiler.grid_reads: its compiled PTX or MLIR, which include every
device function it calls; in Numba's simulator, its bytecode), counting
anything it cannot follow as a read of every axis (no fold). Slices run in
one launch share nothing but the read-only inputs: outputs and aliased
buffers are per slice.

Here too: the op's decisions per signature (:func:`fold_for`, kept in the
op's :class:`FoldCache`, which only this module reads), the batching rule
of the kernel primitive (:func:`batch_rule`) and nested vmaps, whose
levels flatten into one batch of every level's slices (:func:`_flatten`);
the flat batch holds nothing but unbatched calls, so the same decision
holds at any depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
from jax.interpreters import batching

from ..compilers import fold
from ..compilers.grid_reads import AXIS_NAMES
from ..runtime import numba_bridge
from ..trace import scalar_args
from ..trace.vmap import batch_size
from .primitive import numbax_kernel_p


def check_fold_args(op: str, args) -> None:
    """Refuses (TypeError naming the op) vmap_fold of scalars alone, which
    jax.vmap cannot batch (it maps arrays; a scalar goes by value to every
    slice): since scalars are passed by value, vmap_fold(1.0) gave a verdict
    (the third reliability pass refused it, as a 0-d input). A 0-d array
    alone is refused alike: it is a traced scalar, with no axis to batch."""
    if args and all(scalar_args.is_scalar(a) or getattr(a, "ndim", None) == 0
                    for a in args):
        kinds = ", ".join(type(a).__name__ for a in args)
        raise TypeError(
            f"{op}: vmap_fold: every input is a scalar ({kinds}), and "
            "jax.vmap batches arrays only (a scalar is passed by value to "
            "every slice): pass the call's unbatched array inputs, as "
            "arrays or jax.ShapeDtypeStructs, with its scalars beside them")


# Grid axes the batch may take, in order of preference; CUDA allows 65535
# blocks on each, so larger batches are split into several launches.
FOLD_AXES = (2, 1)
MAX_SLICES_PER_LAUNCH = 65535


@dataclass(frozen=True)
class FoldDecision:
    """How ``jax.vmap`` launches a kernel for one signature.

    The same decision holds for nested vmaps, whose levels flatten into
    one batch: :meth:`launches` and :meth:`explain` say what it means for
    given level sizes.

    Attributes:
      folds: True when the whole batch runs in one launch (or one per
        65535 slices); False when each slice is a launch of its own.
      axis: the grid axis (``'y'`` or ``'z'``) that indexes the slice when
        ``folds``, else None.
      reason: why, in words.
    """
    folds: bool
    axis: str | None
    reason: str

    def __str__(self):
        if self.folds:
            return f"one launch per batch (slice = blockIdx.{self.axis})"
        return f"one launch per slice: {self.reason}"

    def launches(self, *batch_shape: int) -> int:
        """Launches one call makes for nested vmaps of these sizes.

        ``batch_shape`` holds each vmap level's size, outermost first
        (``launches(16, 16)`` for ``vmap(vmap(op))`` over 16 x 16). Every
        level flattens into one batch of their product, decided as for one
        level (the decision depends on the unbatched kernel only): a
        folded batch takes one launch per 65535 slices, any other one
        launch per slice, all from one handler call.
        """
        total = 1
        for size in batch_shape:
            total *= int(size)
        if total <= 0:
            return 0
        if self.folds:
            return -(-total // MAX_SLICES_PER_LAUNCH)
        return total

    def explain(self, *batch_shape: int) -> str:
        """This decision in words for nested vmaps of these sizes."""
        total = 1
        for size in batch_shape:
            total *= int(size)
        shape = " x ".join(str(int(s)) for s in batch_shape) or "1"
        levels = len(batch_shape)
        how = (f"{levels} nested vmap levels flatten into" if levels > 1
               else "one vmap level gives")
        n = self.launches(*batch_shape)
        word = "launch" if n == 1 else "launches"
        if self.folds:
            return (f"{how} one batch of {shape} = {total} slices: {n} "
                    f"{word} (slice = blockIdx.{self.axis}), since "
                    f"{self.reason}")
        return (f"{how} one batch of {shape} = {total} slices: {n} {word}, "
                f"one per slice in order from one call, since {self.reason}")


def axis_index(decision: FoldDecision) -> int:
    """The grid axis (0-2) a folding decision gives the batch."""
    assert decision.axis is not None, decision
    return AXIS_NAMES.index(decision.axis)


def fallback(reason: str) -> FoldDecision:
    return FoldDecision(False, None, reason)


def decide(*, vmap_method, grid, cooperative: bool,
           axes_read: frozenset | None, unreadable: str | None = None
           ) -> FoldDecision:
    """Fold or fall back, and why: the whole rule, in order.

    Args:
      vmap_method: the op's ``vmap_method``.
      grid: the unbatched launch's grid, 3 ints.
      cooperative: the kernel synchronises its grid.
      axes_read: grid axes (0-2) whose ``blockIdx``/``gridDim`` the compiled
        code reads; None when they could not be determined.
      unreadable: why the code could not be read (with ``axes_read=None``).
    """
    if vmap_method == "sequential":
        return fallback("vmap_method='sequential' asks for one slice at a "
                        "time")
    if cooperative:
        return fallback("the kernel synchronises its grid (cooperative "
                        "launch): the batch's blocks would wait on each other")
    free = [a for a in FOLD_AXES if grid[a] == 1]
    if not free:
        return fallback(f"the launch uses all three grid axes {tuple(grid)}")
    if axes_read is None:
        return fallback(f"numbax cannot read the compiled code ({unreadable})")
    for axis in free:
        if axis not in axes_read:
            return FoldDecision(True, AXIS_NAMES[axis],
                                f"grid axis {AXIS_NAMES[axis]} is free and "
                                "the kernel never reads it")
    names = "/".join(AXIS_NAMES[a] for a in free)
    return fallback(f"the kernel reads grid axis {names} itself "
                    "(blockIdx, gridDim, cuda.grid or cuda.gridsize)")


# -- the op's decisions, one per signature ------------------------------------

class FoldCache:
    """One op's vmap state, kept by the op (``op.fold_cache``) and read and
    written only here: its fold decisions and the batched kernels compiled
    for its folded launches. Both live as long as the op: a decision
    depends on the kernel and the signature only, and a batched kernel
    keeps its compiled code."""

    __slots__ = ("decisions", "batched_kernels")

    def __init__(self):
        # (unbatched argument types, grid) -> FoldDecision.
        self.decisions: dict[tuple, FoldDecision] = {}
        # (arguments, broadcast per parameter, axis, frozen globals' id,
        # scalar positions) -> the generated batched kernel.
        self.batched_kernels: dict[tuple, object] = {}


def static_fold(op, grid) -> FoldDecision | None:
    """The decision when it does not depend on the compiled code."""
    if op.vmap_method == "sequential" or all(grid[a] != 1 for a in FOLD_AXES):
        return decide(vmap_method=op.vmap_method, grid=grid,
                      cooperative=False, axes_read=frozenset())
    return None


def fold_for(op, argtypes, grid, compiled=None, n_in=None) -> FoldDecision:
    """The FoldDecision for unbatched `argtypes` launched over `grid`,
    decided once per op (`compiled`: the kernel compiled for them, if the
    caller has it)."""
    key = (argtypes, tuple(grid))
    decision = op.fold_cache.decisions.get(key)
    if decision is not None:
        return decision
    decision = static_fold(op, grid)
    if decision is None:
        cooperative, read, why = op.compiler.grid_reads(
            op.kernel, lambda: compiled or op.compile_kernel(argtypes, n_in))
        decision = decide(
            vmap_method=op.vmap_method, grid=grid, cooperative=cooperative,
            axes_read=read, unreadable=why)
        # The simulator reads globals live, batched or not.
        if decision.folds and not numba_bridge.simulator_enabled():
            why = fold.unknown_globals_reason(op.kernel, argtypes)
            if why:
                decision = fallback(why)
    op.fold_cache.decisions[key] = decision
    return decision


def _batched_kernel(op, num_args, broadcast, decision, argtypes, scalars,
                    traced=()):
    """The generated kernel for a folded launch (one per broadcast
    pattern, scalar and traced scalar positions and set of frozen
    globals); with `decision` None, the unbatched kernel of a call with
    traced scalars."""
    frozen = (None if numba_bridge.simulator_enabled() or argtypes is None
              else fold.frozen_globals(op.kernel, tuple(argtypes)))
    axis = None if decision is None else decision.axis
    # The frozen values live as long as the kernel: their id is stable.
    # (A key without traced scalars is the one it always was.)
    key = (num_args, broadcast, axis,
           id(frozen) if frozen else None, tuple(scalars)) + (
               (tuple(traced),) if traced else ())
    kernel = op.fold_cache.batched_kernels.get(key)
    if kernel is None:
        kernel = op.compiler.batched_kernel(
            op.kernel, num_args, broadcast,
            None if decision is None else axis_index(decision), frozen,
            tuple(scalars), **({"traced": tuple(traced)} if traced else {}))
        op.fold_cache.batched_kernels[key] = kernel
    return kernel


def traced_kernel(op, argtypes, scalars, traced):
    """The generated kernel a call with traced scalars launches unbatched
    (or per slice): it reads each traced scalar from its 1-element buffer
    and calls the kernel's body with it (compilers/fold.py). `argtypes`:
    the body's (op.kernel_argtypes with `traced`), compiled first by the caller,
    so that the body reads the globals the kernel was compiled with."""
    positions = tuple(s.position for s in scalars)
    return _batched_kernel(op, len(argtypes), (False,) * len(argtypes),
                           None, argtypes, positions, traced)


def compiled_traced(op, argtypes, avals, batch, scalars, traced, formals):
    """traced_kernel compiled for the buffers (`avals`) as one slice sees
    them, each scalar passed by value typed as `formals` give it."""
    tys = scalar_args.merge(op.kernel_argtypes(avals, batch), scalars,
                            list(formals))
    return op.compiler.compile_batched(
        op.kernel, traced_kernel(op, argtypes, scalars, traced), tuple(tys),
        op.label)


def folded(op, argtypes, grid, batch, broadcast, compiled=None, scalars=(),
           traced=()):
    """(decision, batched kernel or None) for a batched call.
    `broadcast` has a flag per input buffer; `scalars` sit among them;
    `traced`: the positions of traced scalars (buffers)."""
    if batch <= 0:
        return None, None
    decision = fold_for(op, argtypes, grid, compiled)
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
        return decision, _batched_kernel(op, n_args, per_param, decision,
                                         argtypes, positions, traced)
    except Exception as exc:  # e.g. a body Numba refuses as a device fn
        return refuse_fold(op, argtypes, grid, "build", exc), None


def refuse_fold(op, argtypes, grid, what: str, exc) -> FoldDecision:
    """Records that the batched kernel for `argtypes` did not `what`
    ('build', 'compile'): those calls launch per slice."""
    decision = fallback(f"the batched kernel did not {what} "
                        f"({type(exc).__name__}: {exc})")
    op.fold_cache.decisions[(argtypes, tuple(grid))] = decision
    return decision


def fold_spec(op, avals, batch, broadcast, call) -> str:
    """'axis:max slices per launch' for a folded vmapped call, else ''."""
    if batch <= 0:
        return ""
    argtypes = op.kernel_argtypes(list(avals) + call.out_avals(batch), batch,
                            call.scalars, call.traced)
    decision, batched = folded(op, argtypes, call.grid, batch, broadcast,
                               scalars=call.scalars, traced=call.traced)
    if batched is None or not decision.folds:
        return ""
    # ":" not "/": "/" separates the parts of a key (runtime/keys.py).
    return f"{decision.axis}:{MAX_SLICES_PER_LAUNCH}"


def summary(op) -> str:
    """How vmap launches the op, in words, as far as decided (repr)."""
    static = (None if op.dims_fn is not None
              else static_fold(op, op.fixed_launch()[0]))
    if static is not None:
        return str(static)
    decisions = list(op.fold_cache.decisions.values())
    if not decisions:
        return "one launch per batch if the compiled kernel allows " \
            "(op.vmap_fold(*args) tells)"
    if len(set(decisions)) == 1:
        return str(decisions[0])
    return "; ".join(
        "(" + ", ".join(str(t) for t in types) + ")"
        + (f" grid {g}" if op.dims_fn is not None else "") + f": {d}"
        for (types, g), d in op.fold_cache.decisions.items())


# -- the batching rule of numbax_kernel_p -------------------------------------

def batch_rule(args, dims, *, op, out_shapes, batch, broadcast, call):
    # `call` (the resolved outs, launch and scalars of one unbatched call)
    # is the same for every slice: scalars passed by value are never
    # batched (a traced scalar is a 1-element buffer, batched as any).
    if batch:  # a vmap around a vmap: one batch of every level's slices
        return _flatten(args, dims, op=op, out_shapes=out_shapes,
                        batch=batch, broadcast=broadcast, call=call)
    size = batch_size(args, dims)
    if size == 0:  # no slice to launch: empty outputs
        outs = [jnp.zeros((0,) + tuple(s), d) for s, d in out_shapes]
        return outs, [0] * len(outs)
    # Every vmap_method batches the call; 'sequential' never folds (decide),
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
                                batch=size, broadcast=tuple(flags),
                                call=call)
    return outs, [0] * len(outs)


def _flatten(args, dims, *, op, out_shapes, batch: int, broadcast,
             call) -> tuple[list, list]:
    """Batching rule for a call that is already batched (``batch`` > 0).

    Args:
      args, dims: the batched call's inputs and the axis the new (outer)
        vmap maps over in each, or None.
      op, out_shapes, batch, broadcast, call: the batched call's
        parameters; ``out_shapes`` include the leading ``batch`` axis,
        ``call`` (the unbatched call's outs, launch and scalars) is passed
        on unchanged.

    Returns:
      (outputs, out_dims) as JAX batching rules do: every output with the
      outer axis first, then the inner batch axis.
    """
    outer = batch_size(args, dims)
    if outer == 0:  # no slice at this level: nothing is launched
        outs = [jnp.zeros((0,) + tuple(s), d) for s, d in out_shapes]
        return outs, [0] * len(outs)
    total = outer * batch
    new_args, flags = [], []
    for a, d, shared in zip(args, dims, broadcast):
        if d is None and shared:
            # Shared by every slice of every level: stays one slice.
            new_args.append(a)
            flags.append(True)
            continue
        if d is None:
            # Batched inside, shared outside: every outer slice reads the
            # same `batch` slices.
            a = jnp.broadcast_to(a[None], (outer,) + a.shape)
        else:
            a = jnp.moveaxis(a, d, 0)
            if shared:
                # Batched outside, shared inside: each outer slice's one
                # slice serves all of its inner slices.
                a = jnp.broadcast_to(a, (outer, batch) + a.shape[2:])
        new_args.append(a.reshape((total,) + a.shape[2:]))
        flags.append(False)
    flat_shapes = tuple(((total,) + tuple(s)[1:], d) for s, d in out_shapes)
    outs = numbax_kernel_p.bind(*new_args, op=op, out_shapes=flat_shapes,
                                batch=total, broadcast=tuple(flags),
                                call=call)
    outs = [o.reshape((outer, batch) + tuple(s)[1:])
            for o, (s, _) in zip(outs, out_shapes)]
    return outs, [0] * len(outs)


batching.primitive_batchers[numbax_kernel_p] = batch_rule
