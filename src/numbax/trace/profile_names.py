"""Op names in profiles.

Every numbax op has a profile name (runtime/ops.py, ``Op.profile_name``):
its ``name=``, else the qualified name of its kernel or func (an
XLACustomKernel's generated ops take the custom kernel's name). The
lowering puts it in the custom call's MLIR location, where JAX puts an
equation's name, so XLA names the HLO instruction after it
(``%double.2 = custom-call(...)``) and its ``metadata={op_name=...}`` reads
``jit(f)/<scopes>/double``, with ``op_type`` still numbax's primitive: JAX's
profiler, TensorBoard and XLA dumps show it. On the GPU the C++ handlers
push an NVTX range with the same name around each call (csrc/nvtx.h): the
kernel op's LoadedKernel and the callable's resolve result carry it.

JAX caches the lowering of identical equations (the same primitive and
parameters) as a function it inlines at each call site, rewriting the
locations inside under the call site's scopes. The location numbax builds
has the form JAX gives an equation's own, which that rewriting keeps: the
name survives it, under ``jit``, ``vmap``, ``custom_jvp`` and named scopes.
"""

from __future__ import annotations

import contextlib
from typing import Any

from jax.interpreters import mlir

from ..runtime import compat


def location(ctx: Any, name: str) -> Any:
    """The MLIR location that names the custom call lowered under it after
    `name`, in the form JAX gives an equation's: ``"<primitive>:"`` (XLA's
    op_type) around ``"<name stack>/<name>"`` (XLA's op_name) around the
    source location. In that form the name also survives JAX inlining a
    lowering it cached (custom_jvp's, a cached enclosing call), which
    rewrites the inner name under the call site's scopes."""
    ir = mlir.ir
    stack = ctx.name_stack
    prefix = str(stack) if getattr(stack, "stack", None) else ""
    op_name = f"{prefix}/{name}" if prefix else name
    source = compat.source_location(ctx)
    if source is None:
        try:
            source = ir.Location.current
        except ValueError:  # no location in force
            source = ir.Location.unknown()
    loc = ir.Location.name(op_name, childLoc=source)
    primitive = getattr(ctx, "primitive", None)
    if primitive is not None:
        loc = ir.Location.name(f"{primitive.name}:", childLoc=loc)
    return loc


def named(ctx: Any, name: str | None) -> Any:
    """A context in which the custom call lowered is named `name` in HLO;
    nothing when the call has no profile name."""
    if not name:
        return contextlib.nullcontext()
    return location(ctx, name)
