"""An XLACustomKernel's sharding rule: which axes XLA may split across devices.

The rule (``def_sharding_rule``, or ``sharding_rule=``) is text or a
function of a call's ``outs`` and static keyword arguments; a call that
does not fit it is refused, naming the op (:meth:`ShardingRule.check`),
and the numbax op a kernel generator returns is remade with it
(:meth:`ShardingRule.with_rule`, through ``ops.Op.with_sharding_rule``),
so XLA splits that op's calls. jnp code needs no rule: XLA splits it
itself. The op holds one :class:`ShardingRule` (``op.sharding``), which
owns the rule and the remade ops.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable

import numpy as np

from ..runtime import ops
from ..trace import checks, sharding_rules
from .outs import outs_struct


def wrap_error(exc: Exception, message: str) -> BaseException:
    """`exc`'s type with `message` where it can be built that way, else a
    RuntimeError."""
    return checks.renamed(exc, message) or RuntimeError(message)


class ShardingRule:
    """One XLACustomKernel's sharding rule, and the ops remade with it.

    `label` names the op in messages (its repr).
    """

    def __init__(self, label: str):
        self._label = label
        self._rule: str | Callable | None = None
        self._lock = threading.Lock()
        # generated op -> {rule text: that op made with the rule}. Weak in
        # the generated op: the remade ones go when the op a generator
        # returned goes (kernels.py bounds those), never before.
        self._ruled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def rule(self) -> str | Callable | None:
        """The rule as given (text or function), or None."""
        return self._rule

    def define(self, rule: str | Callable) -> None:
        """Sets the rule (def_sharding_rule); text is parsed now, so a
        syntax error names the op where the rule is given."""
        if not isinstance(rule, str) and not callable(rule):
            raise TypeError(
                f"{self._label}: the sharding rule must be a str (e.g. "
                f"'i j, j -> i j') or a function of outs and the static "
                f"keyword arguments returning one, got {type(rule).__name__}")
        if isinstance(rule, str):
            sharding_rules.parse(rule, self._label)  # syntax, now
        self._rule = rule

    def rule_for(self, outs, out_tree, static) -> str | None:
        """The sharding rule of a call (None: the op has none)."""
        rule = self._rule
        if rule is None or isinstance(rule, str):
            return rule
        try:
            text = rule(outs=outs_struct(outs, out_tree), **dict(static))
        except Exception as exc:
            raise wrap_error(exc, (
                f"{self._label}: the sharding rule function raised "
                f"{type(exc).__name__}: {exc}")) from exc
        if not isinstance(text, str):
            raise TypeError(
                f"{self._label}: the sharding rule function returned "
                f"{type(text).__name__}, not a str such as 'i j, j -> i j'")
        return text

    def check(self, inputs, outs, out_tree, static) -> None:
        """Refuses, naming the op, a rule that does not fit this call."""
        if self._rule is None:
            return
        text = self.rule_for(outs, out_tree, static)
        if text is None:
            return
        rule = sharding_rules.parse(text, self._label)
        sharding_rules.split(rule, [tuple(np.shape(x)) for x in inputs],
                             [tuple(s) for s, _ in outs], self._label)

    def with_rule(self, fn, outs, out_tree, static):
        """`fn` (what a generator returned) made with the call's sharding
        rule, where it is a numbax op; `fn` itself otherwise."""
        text = self.rule_for(outs, out_tree, static)
        if text is None:
            return fn
        if not isinstance(fn, ops.Op):
            return fn  # jnp code: XLA splits it itself
        rule = sharding_rules.parse(text, self._label)
        own = fn.sharding_rule
        if own is not None or fn.batch_partitionable:
            if own == rule:
                return fn
            raise ValueError(
                f"{self._label}: the op has sharding_rule {text!r}, but its "
                f"kernel generator returned {fn!r} with "
                f"{'batch_partitionable=True' if own is None else repr(str(own))}; "
                "give the rule in one place")
        with self._lock:
            known = self._ruled.get(fn, {}).get(str(rule))
        if known is not None:
            return known
        ruled = fn.with_sharding_rule(str(rule))
        with self._lock:
            return self._ruled.setdefault(fn, {}).setdefault(str(rule),
                                                             ruled)
