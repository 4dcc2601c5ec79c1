"""The JAX primitive behind an XLACustomKernel: abstract eval and lowering.

The primitive's output shapes come from the ``outs`` of each call. Its
lowering asks the op's kernel table for the kernel of the call's backend
(the generator runs once per static arguments and ``outs``), made with the
op's sharding rule, and traces what that returns inline, so the program
holds numbax's own custom calls, or whatever jnp code the kernel is.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Callable, Protocol

from jax.interpreters import mlir

from ..runtime import compat, ops
from ..trace import checks
from .kernels import KernelTable
from .outs import check_outputs
from .sharding import ShardingRule


class Lowered(Protocol):
    """What this module needs of an XLACustomKernel."""
    name: str
    kernels: KernelTable
    sharding: ShardingRule

# The lowering platforms JAX uses, and the platforms users name for them.
_LOWERING_PLATFORMS = {"cpu": "cpu", "cuda": "gpu"}


def kernel_for(op: Lowered, platform: str, backend: str | None, outs,
               out_tree, static) -> Callable:
    """The function a call of `op` runs on `platform`: what the generator of
    `backend` returned (once per static arguments and outs), made with the
    call's sharding rule where it is a numbax op."""
    fn = op.kernels.generate(platform, backend, outs, out_tree, static)
    return op.sharding.with_rule(fn, outs, out_tree, static)


def create(op: Lowered) -> Any:
    """`op`'s primitive, named after it, with its abstract eval and lowering."""
    prim = compat.eager_primitive(op.name)
    prim.def_abstract_eval(partial(_abstract_eval, op))
    for platform in ("cpu", "cuda", "rocm"):
        mlir.register_lowering(
            prim, partial(lower, op, lowering_platform=platform),
            platform=platform)
    return prim


def _abstract_eval(op: Lowered, *avals, outs, **params):
    del params
    # jax.export's symbolic extents reach here through jax.vmap's batch
    # axis too (a direct call is refused in XLACustomKernel.__call__).
    checks.check_concrete_avals(avals, repr(op))
    return [compat.shaped_array(shape, dtype) for shape, dtype in outs]


def lower(op: Lowered, ctx, *args, outs, out_tree, backends, static,
          lowering_platform):
    """The op's lowering: the kernel of the call's backend, traced inline."""
    platform = _LOWERING_PLATFORMS.get(lowering_platform)
    if platform is None:
        raise NotImplementedError(
            f"{op!r}: platform '{lowering_platform}' is not supported; "
            "numbax runs on NVIDIA GPUs and, through Numba's CUDA "
            "simulator, on the CPU")
    backend = dict(backends)[platform]
    fn = kernel_for(op, platform, backend, outs, out_tree, static)
    # numba_kernel takes 0-d inputs (as 0-d Numba arrays); the GPU ops
    # cannot.
    if isinstance(fn, ops.Op) and not getattr(fn, "takes_0d_inputs", False):
        _refuse_scalar_inputs(op, fn, backend, ctx.avals_in)

    # The returned op is traced and lowered inline: it emits numbax's own
    # custom calls (or whatever jnp code it is) into this program. A numbax
    # op without name= of its own is named after this op in this use only
    # (ops.named_use: the op may be shared, by another XLACustomKernel or a
    # plain call); anything else is scoped under this op's name: HLO's
    # op_name reads jit(f)/<name>/<inner op> (profile_names.py).
    named = isinstance(fn, ops.Op) and fn.name is None

    def body(*xs):
        with (ops.named_use(fn, op.name) if named
              else contextlib.nullcontext()):
            result = fn(*xs)
        return check_outputs(
            op, result, outs, out_tree,
            f"the '{backend}' kernel (platform '{platform}')")

    if not named:
        ctx = ctx.replace(name_stack=ctx.name_stack.extend(op.name))
    return mlir.lower_fun(body, multiple_results=True)(ctx, *args)


def _refuse_scalar_inputs(op: Lowered, fn, backend: str, avals) -> None:
    """ValueError naming the op and the static keyword way for a 0-d input
    (a Python scalar the op made an array, or a 0-d array) of a numbax op,
    whose inputs are buffers of at least one dimension: its own message
    names the inner kernel and says "pass a Python scalar", which the user
    did."""
    for i, aval in enumerate(avals):
        if len(getattr(aval, "shape", (0,))) == 0:
            raise ValueError(
                f"{op!r}: input {i} is 0-d (a Python scalar or a 0-d "
                f"array), but the '{backend}' kernel its generator returned "
                f"({fn!r}) takes arrays of at least one dimension. Pass a "
                "value known when tracing as a static keyword argument, "
                "op(x, outs=..., alpha=2.0): the kernel generator receives "
                "it (generator(*, alpha, outs)) and may pass it on by value "
                "(return lambda x: kernel_op(x, alpha)), and every rule "
                "receives it too; pass a value known only when the program "
                "runs as a 1-element array, jnp.reshape(value, (1,)), and "
                "read a[0] in the kernel")
