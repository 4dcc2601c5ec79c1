"""numbax_cpu_kernel_p: the JAX primitive every numba_kernel call binds.

Abstract evaluation gives the declared outputs; the lowering (platform
'cpu' only) asks the op for the call's key, which compiles the call's
wrapper (op.py, wrapper.py), and emits the custom call of numbax's fixed
target ``numbax_cpu_kernel`` with the key as attribute, named after the op
in HLO. A call XLA may split (the op's sharding rule, or jax.vmap's axis in
a program of several devices: trace/sharding_rules.py) lowers to the
``*_batch`` twin. Its batching rule is in vmap.py.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.interpreters import mlir

from ..runtime import compat, keys, registry, targets
from ..trace import checks, profile_names, sharding_rules

numbax_cpu_kernel_p = compat.eager_primitive("numbax_cpu_kernel")


@numbax_cpu_kernel_p.def_abstract_eval
def _abstract_eval(*avals, op, out_shapes, scalars, aliases, batched,
                   batch_ndim, rule, vmap_only):
    return [compat.shaped_array(s, d) for s, d in out_shapes]


def _lower(ctx, *args, op, out_shapes, scalars, aliases, batched,
           batch_ndim, rule, vmap_only):
    avals_in = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_in]
    key = op.call_key(avals_in, list(out_shapes), scalars, aliases, batched,
                  batch_ndim)
    compat.keep_alive(ctx, op)
    if (getattr(ctx.module_context.lowering_parameters, "for_export", False)
            and keys.is_ambiguous(key)):
        raise registry.ambiguous_export_error(op.label, key, op.name)
    split = sharding_rules.split_for(ctx, rule, vmap_only, op.label,
                                     aliases=aliases)
    if split is None:
        with profile_names.named(ctx, op.profile_name):
            return jax.ffi.ffi_lowering(
                targets.CPU_KERNEL_TARGET,
                operand_output_aliases=dict(aliases))(ctx, *args, key=key)
    return sharding_rules.lower_split(
        ctx, args, target=targets.CPU_KERNEL_BATCH_TARGET, split=split,
        key=registry.with_lead(key, split.lead_spec()), aliases=aliases,
        profile_name=op.profile_name)


def _lower_elsewhere(ctx, *args, op, **params):
    del ctx, args, params
    raise NotImplementedError(
        f"{op.label}: numba_kernel runs @njit kernels on JAX's CPU backend "
        "only, and this program is placed on another platform. Put the "
        "call on the CPU (jax.jit(..., device=jax.devices('cpu')[0]) or "
        "JAX_PLATFORMS=cpu), or use numba_cuda_kernel with a @cuda.jit "
        "kernel on a GPU")


mlir.register_lowering(numbax_cpu_kernel_p, _lower, platform="cpu")
mlir.register_lowering(numbax_cpu_kernel_p, _lower_elsewhere)


checks.refuse_differentiation(numbax_cpu_kernel_p, "the kernel")
