"""An XLACustomKernel's sharding rule: which axes XLA may split across devices.

The rule (``def_sharding_rule``, or ``sharding_rule=``) is text or a
function of a call's ``outs`` and static keyword arguments; a call that
does not fit it is refused, naming the op (:func:`check_rule`), and the
numbax op a kernel generator returns is remade with it
(:func:`with_rule`, through ``ops.Op.with_sharding_rule``), so XLA splits
that op's calls. jnp code needs no rule: XLA splits it itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..runtime import ops
from ..trace import checks, sharding_rules
from .outs import outs_struct

if TYPE_CHECKING:
    from .op import XLACustomKernel


def wrap_error(exc: Exception, message: str) -> BaseException:
    """`exc`'s type with `message` where it can be built that way, else a
    RuntimeError."""
    return checks.renamed(exc, message) or RuntimeError(message)


def rule_for(op: XLACustomKernel, outs, out_tree, static) -> str | None:
    """The sharding rule of a call (None: the op has none)."""
    rule = op._sharding_rule
    if rule is None or isinstance(rule, str):
        return rule
    try:
        text = rule(outs=outs_struct(outs, out_tree),
                    **dict(static))
    except Exception as exc:
        raise wrap_error(exc, (
            f"{op!r}: the sharding rule function raised "
            f"{type(exc).__name__}: {exc}")) from exc
    if not isinstance(text, str):
        raise TypeError(
            f"{op!r}: the sharding rule function returned "
            f"{type(text).__name__}, not a str such as 'i j, j -> i j'")
    return text


def check_rule(op: XLACustomKernel, inputs, outs, out_tree, static) -> None:
    """Refuses, naming the op, a rule that does not fit this call."""
    text = rule_for(op, outs, out_tree, static)
    if text is None:
        return
    label = repr(op)
    rule = sharding_rules.parse(text, label)
    sharding_rules.split(rule, [tuple(np.shape(x)) for x in inputs],
                         [tuple(s) for s, _ in outs], label)


def with_rule(op: XLACustomKernel, fn, outs, out_tree, static):
    """`fn` (what a generator returned) made with the call's sharding
    rule, where it is a numbax op; `fn` itself otherwise."""
    text = rule_for(op, outs, out_tree, static)
    if text is None:
        return fn
    if not isinstance(fn, ops.Op):
        return fn  # jnp code: XLA splits it itself
    rule = sharding_rules.parse(text, repr(op))
    own = fn.sharding_rule
    if own is not None or fn.batch_partitionable:
        if own == rule:
            return fn
        raise ValueError(
            f"{op!r}: the op has sharding_rule {text!r}, but its "
            f"kernel generator returned {fn!r} with "
            f"{'batch_partitionable=True' if own is None else repr(str(own))}; "
            "give the rule in one place")
    key = (id(fn), str(rule))
    with op._lock:
        known = op._ruled.get(key)
    if known is not None:
        return known
    ruled = fn.with_sharding_rule(str(rule))
    # Named in profiles as the op it was made from.
    if ruled._profile_tag is None:
        ruled._profile_tag = fn._profile_tag
    with op._lock:
        # Kept with the generated op it was made from.
        return op._ruled.setdefault(key, ruled)
