"""jax.export of programs that use numbax ops (docs/export.md).

A numbax op is an XLA custom call to one of numbax's fixed FFI targets, with
a string attribute ``key`` naming what it runs: the function's module and
qualified name (or the ``name=`` given to the op), what the op was created
with (outs, scratch, capture, launch configuration) and the call's shapes
and dtypes. ``jax.export`` refuses custom calls whose targets it does not
know to be stable, so exporting needs :func:`export_disabled_checks`:

    exp = jax.export.export(jax.jit(f),
                            disabled_checks=numbax.export_disabled_checks())(
        jax.ShapeDtypeStruct((n,), jnp.float32))
    blob = exp.serialize()

In the process that runs the program, create the same ops (same function,
same module and qualified name, or the same ``name=``; same outs, scratch,
capture and launch configuration), then deserialise and call: nothing needs
to be traced. A key no op of this process matches fails the call with an
error naming it; a key several live functions could match (closures made by
one factory without ``name=``) is refused rather than guessed.
"""

from __future__ import annotations

from .runtime import targets


def export_disabled_checks() -> list:
    """The ``disabled_checks`` that ``jax.export.export`` needs for numbax ops.

    One ``jax.export.DisabledSafetyCheck.custom_call(target)`` per FFI
    target numbax lowers to (plain, capture and kernel calls, and the
    batch-partitionable variants). Pass it, plus any checks of your own, as
    ``jax.export.export(fn, disabled_checks=...)``.
    """
    from jax import export as jax_export
    return [jax_export.DisabledSafetyCheck.custom_call(target)
            for target in targets.ALL_TARGETS]
