"""A numba_cuda_kernel's calls on a GPU: compiled, and loaded for C++.

At trace time (:func:`key`) or when XLA instantiates a program whose key
this process did not trace (op.entry_for_call), the kernel is compiled by
its compiler for the call's argument types (and, for a folded vmap, the
generated batched kernel too), and the registry gets an entry whose
``resolve()`` builds the LoadedKernel C++ launches from (loaded.py). The
CUDA platform's lowering of the kernel primitive is registered here: the shared
body (primitive.lower) with numbax's kernel target and :func:`key`.
"""

from __future__ import annotations

import weakref
from functools import partial

import numpy as np
from jax.interpreters import mlir

from ..runtime import numba_bridge, registry, targets
from ..trace import checks, scalar_args
from . import calls, primitive, sharding, vmap
from .launch_config import Call
from .loaded import builder


def entry(op, key, avals, batch, broadcast, aliases=(),
          call: Call | None = None, units=((), ())) -> registry.KernelEntry:
    """The registry entry of one call: the kernel compiled now, loaded on
    every device when XLA instantiates the program."""
    call = call if call is not None else op.fixed_call()
    out_avals = call.out_avals(batch)
    dtypes = [d for _, d in list(avals) + out_avals]
    if numba_bridge.has_bfloat16(dtypes):
        numba_bridge.check_bfloat16_devices(repr(op))
    # The kernel's arguments are the inputs then the outputs, with the
    # scalars at their positions among the inputs.
    all_avals = list(avals) + list(out_avals)
    scalars, traced = call.scalars, call.traced
    # The body's types: a traced scalar as the value it holds.
    argtypes = op.kernel_argtypes(all_avals, batch, scalars, traced)
    n_in = len(avals) + len(scalars)
    try:
        compiled = op.compile_kernel(argtypes, n_in)
    except Exception as exc:
        named = None if not traced else checks.renamed(exc, (
            f"{exc}; inputs {', '.join(map(str, traced))} are traced "
            "scalars (0-d arrays: jax.jit traces a Python scalar argument "
            "into one), which the kernel receives as values: where it reads "
            "an array, pass a 1-element array (x.reshape(1))"))
        if named is None:
            raise
        raise named from exc
    formals = op.scalar_formals(argtypes, scalars, n_in)
    params = op.scalar_params(scalars, formals)
    if traced:
        _check_traced_formals(op, argtypes, traced, n_in)
    grid, block, empty = call.grid, call.block, call.empty
    decision, batched = vmap.folded(op, argtypes, grid, batch, broadcast,
                                    compiled, scalars, traced)
    fold_axis = -1
    if batched is not None:
        try:
            # The batched kernel takes the whole buffers, and each
            # scalar as the version that runs types it.
            tys = scalar_args.merge(
                op.kernel_argtypes(all_avals, 0), scalars, list(formals))
            compiled = op.compiler.compile_batched(
                op.kernel, batched, tuple(tys), op.label)
            fold_axis = vmap.axis_index(decision)
        except Exception as exc:
            vmap.refuse_fold(op, argtypes, grid, "compile", exc)
    if fold_axis < 0 and traced:
        # Launched unbatched (or per slice): the generated kernel that
        # reads the traced scalars and calls the body.
        compiled = vmap.compiled_traced(op, argtypes, all_avals, batch,
                                        scalars, traced, formals)
    # The registry keeps `load` but must not keep the op alive: `load`
    # refers to it weakly, and the C++ call site that asks for the loaded
    # kernel holds the op (its owner) for as long as it lives.
    op_ref = weakref.ref(op)
    load = builder(op_ref, compiled, grid, block, empty, batch, broadcast,
                   len(avals), fold_axis, vmap.MAX_SLICES_PER_LAUNCH, aliases,
                   units, sharding.grid_from(op, avals, batch,
                                             call.out_shapes),
                   num_outputs=call.num_outputs, scalars=params,
                   name=call.name)
    return registry.KernelEntry(key, load, op_ref)


def _check_traced_formals(op, argtypes, traced, n_in):
    """Refuses a traced scalar whose type is not the one the kernel's
    explicit signature gives its parameter: the generated kernel passes the
    value as it is (a launch by value converts; a buffer's element is not
    converted)."""
    formals = op.compiler.parameter_types(op.kernel, argtypes, op.label,
                                           n_in)
    for p in traced:
        if formals[p] != argtypes[p]:
            raise TypeError(
                f"{op.label}: input {p} is a traced scalar of type "
                f"{argtypes[p]} (jax.jit traces a Python scalar argument "
                "into a 0-d array), but the kernel's signature has "
                f"{formals[p]} there, and numbax passes a traced value "
                f"unconverted; cast it (jnp.{formals[p]}(value)), or make "
                f"it static: jax.jit(op, static_argnums={p}) or a value "
                "closed over")


def key(op, avals, out_avals, batch, broadcast, call: Call | None = None,
        split=None) -> str:
    """The key of a call lowered for a GPU; the kernel is compiled now, at
    trace time, so that compile errors surface here."""
    call = call if call is not None else op.fixed_call()
    if [tuple(s) for s, _ in out_avals] != [
            s for s, _ in call.out_avals(batch)]:
        raise ValueError(f"{op!r}: outputs {out_avals} do not match "
                         f"outs {list(call.outs)} (batch {batch})")
    aliases = op.alias_pairs()
    units = (split.buffer_units() if split is not None
             else ((), ()))
    made = entry(op, "", avals, batch, broadcast, aliases, call, units)

    def make_entry(key):
        made.key = key
        return made
    return calls.program_key(op, avals, batch, broadcast, call, split,
                            make_entry)


def _lowered_key(ctx, op, avals, out_shapes, batch, broadcast, call,
                 split) -> str:
    # The outputs as XLA lowers them, which key() checks against the call's.
    del out_shapes
    outs = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out]
    return key(op, avals, outs, batch, broadcast, call, split)


mlir.register_lowering(
    primitive.numbax_kernel_p,
    partial(primitive.lower, targets.KERNEL_TARGET, _lowered_key),
    platform="cuda")
