"""Differentiation of an XLACustomKernel: its JVP and transpose rules.

Forward mode calls the user's JVP rule(s) and sums the tangents they give
each output; reverse mode transposes the linear calls of the JVP with the
user's transpose rule. Every rule is checked before it is called (it must
take the arguments numbax passes) and after (its results must match the
call's ``outs`` or inputs), so a wrong rule is an error naming it. The op
holds the rules in one :class:`Rules` (``op.differentiation``).
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from ..runtime import compat
from .kernels import KernelTable
from .outs import flatten_like, outs_str, outs_struct, value_str

#: Whether an argument of a transpose rule is the linear input being
#: transposed (JAX's ``UndefinedPrimal``; its ``.aval`` has shape and dtype).
is_undefined_primal = ad.is_undefined_primal


class Rules:
    """One XLACustomKernel's JVP and transpose rules (def_jvp_rule,
    def_transpose_rule). `label` names the op in messages (its repr)."""

    def __init__(self, label: str):
        self._label = label
        self.jvp_rules: tuple | None = None
        self.jvp_per_input = False
        self.transpose_rule: Callable | None = None

    def define_jvp(self, rules: tuple, per_input: bool | None) -> None:
        """Checks and sets the JVP rules (one for all inputs, or one per
        input with None for a non-differentiable one)."""
        label = self._label
        if not rules:
            raise TypeError(f"{label}: def_jvp_rule needs at least one rule")
        for i, rule in enumerate(rules):
            if rule is not None and not callable(rule):
                raise TypeError(
                    f"{label}: JVP rule {i} must be callable or None, got "
                    f"{type(rule).__name__}")
        if per_input is None:
            per_input = len(rules) > 1
        if not per_input and len(rules) != 1:
            raise TypeError(
                f"{label}: per_input=False takes exactly one rule, got "
                f"{len(rules)}")
        if not per_input and rules[0] is None:
            raise TypeError(f"{label}: the JVP rule for all inputs is None")
        self.jvp_rules = tuple(rules)
        self.jvp_per_input = bool(per_input)

    def define_transpose(self, fn: Callable) -> None:
        if not callable(fn):
            raise TypeError(
                f"{self._label}: the transpose rule must be callable")
        self.transpose_rule = fn


class Differentiable(Protocol):
    """What this module needs of an XLACustomKernel."""
    primitive: Any
    kernels: KernelTable
    differentiation: Rules


def register_jvp(op: Differentiable) -> None:
    """Makes `op`'s primitive differentiable in forward mode. Registered
    when the op is created: until def_jvp_rule gives it a rule, the rule
    says which method is missing (JAX's own refusal names none)."""
    ad.primitive_jvps[op.primitive] = partial(jvp, op)


def register_transpose(op: Differentiable) -> None:
    """Makes `op`'s primitive transposable (reverse mode); registered when
    the op is created, as :func:`register_jvp`."""
    ad.primitive_transposes[op.primitive] = partial(transpose, op)


def _is_float0(x) -> bool:
    dtype = getattr(getattr(x, "aval", x), "dtype", None)
    return dtype is not None and dtype == jax.dtypes.float0


def _complex_into_real(got, want) -> bool:
    """A complex value where a real one is declared (its cast would drop
    the imaginary part)."""
    return bool(jnp.issubdtype(got, jnp.complexfloating)
                and not jnp.issubdtype(want, jnp.complexfloating))


def check_rule_call(op: object, rule, what: str, args,
                    kwargs) -> None:
    """TypeError naming the op and the rule if `rule` cannot take the
    arguments numbax passes (instead of a bare TypeError from inside)."""
    try:
        sig = inspect.signature(rule)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        passed = ", ".join([f"<{len(args)} positional>"] +
                           [f"{k}=..." for k in kwargs])
        raise TypeError(
            f"{op!r}: {what} {getattr(rule, '__name__', rule)}{sig} "
            f"cannot take the arguments numbax passes ({passed}): {exc}. "
            f"docs/custom_kernel.md gives each rule's signature") from None


def jvp(op: Differentiable, primals, tangents, *, outs, out_tree, backends,
        static):
    """The primitive's JVP: the user's rule(s), their tangents summed."""
    primal_out = op.primitive.bind(*primals, outs=outs, out_tree=out_tree,
                                   backends=backends, static=static)
    kwargs = dict(static)
    structs = outs_struct(outs, out_tree)
    if op.differentiation.jvp_rules is None:
        raise NotImplementedError(
            f"{op!r} has no JVP rule, so jax.jvp and jax.grad cannot "
            "differentiate it: define one with op.def_jvp_rule(...) (and "
            "op.def_transpose_rule(...) for reverse mode: jax.grad, "
            "jax.vjp), as docs/custom_kernel.md shows; or wrap the inputs in "
            "jax.lax.stop_gradient where no derivative flows through the op")
    rules = op.differentiation.jvp_rules
    contributions: list[tuple[int | None, Any]] = []
    with op.kernels.inheriting(backends):
        if op.differentiation.jvp_per_input:
            if len(rules) != len(primals):
                raise TypeError(
                    f"{op!r} was called with {len(primals)} inputs but "
                    f"def_jvp_rule gave {len(rules)} per-input rules")
            for i, (rule, t) in enumerate(zip(rules, tangents)):
                if rule is None or type(t) is ad.Zero or _is_float0(t):
                    continue
                check_rule_call(
                    op, rule, f"the JVP rule of input {i}", (t, *primals),
                    dict(outs=structs, **kwargs))
                contributions.append(
                    (i, rule(t, *primals, outs=structs, **kwargs)))
        else:
            # Like jax.custom_jvp: zeros where there is no tangent, but
            # None for integer inputs, whose float0 tangents are unusable.
            ts = [None if _is_float0(t) else ad.instantiate_zeros(t)
                  for t in tangents]
            check_rule_call(op, rules[0], "the JVP rule", (ts, *primals),
                            dict(outs=structs, **kwargs))
            contributions.append(
                (None, rules[0](ts, *primals, outs=structs, **kwargs)))
    sums: list = [None] * len(outs)
    for source, result in contributions:
        if result is None:
            continue
        what = ("the JVP rule" if source is None else
                f"the JVP rule of input {source}")
        leaves = flatten_like(result, out_tree, len(outs), op=op, what=what)
        if leaves is None:
            raise TypeError(
                f"{op!r}: {what} returned {value_str(result)}, which "
                f"does not match outs: {outs_str(outs)}")
        for j, (leaf, (shape, dtype)) in enumerate(zip(leaves, outs)):
            if leaf is None or type(leaf) is ad.Zero:
                continue
            if not jnp.issubdtype(dtype, jnp.inexact):
                continue  # integer outputs have no tangent
            leaf = jnp.asarray(leaf)
            if tuple(leaf.shape) != shape:
                raise TypeError(
                    f"{op!r}: {what} gave output {j} a tangent of "
                    f"shape {tuple(leaf.shape)}, but the output has "
                    f"shape {shape}")
            if not jnp.issubdtype(leaf.dtype, jnp.inexact):
                # Cast back to float it would run, but the cast to an integer
                # inside the rule has no derivative: grad would be zeros.
                raise TypeError(
                    f"{op!r}: {what} gave output {j} a tangent of dtype "
                    f"{leaf.dtype.name}, but the output is "
                    f"{np.dtype(dtype).name}: tangents must be floating "
                    f"point (an integer tangent has no derivative, so grad "
                    f"would be zero); return it as {np.dtype(dtype).name}")
            if _complex_into_real(leaf.dtype, dtype):
                # The cast below would drop the imaginary part in silence.
                raise TypeError(
                    f"{op!r}: {what} gave output {j} a tangent of dtype "
                    f"{leaf.dtype.name}, but the output is "
                    f"{np.dtype(dtype).name}: a real output's tangent is "
                    f"real, and casting would drop the imaginary part; "
                    f"return it as {np.dtype(dtype).name} (jnp.real(t) if "
                    "the imaginary part is zero by construction), or declare "
                    "the output complex in outs")
            if leaf.dtype != dtype:
                leaf = leaf.astype(dtype)
            sums[j] = leaf if sums[j] is None else sums[j] + leaf
    tangent_out = [
        ad.Zero(compat.shaped_array(shape, dtype).to_tangent_aval())
        if t is None else t for t, (shape, dtype) in zip(sums, outs)]
    return primal_out, tangent_out


def transpose(op: Differentiable, cts, *args, outs, out_tree, backends,
              static):
    """The primitive's transpose: the user's rule, its cotangents checked."""
    if all(type(ct) is ad.Zero for ct in cts):
        return [None] * len(args)
    cts = [None if _is_float0(ct) else ad.instantiate_zeros(ct)
           for ct in cts]
    ct_tree = jax.tree_util.tree_unflatten(out_tree, cts)
    rule = op.differentiation.transpose_rule
    if rule is None:
        raise NotImplementedError(
            f"{op!r} has no transpose rule, so reverse-mode differentiation "
            "(jax.grad, jax.vjp) and jax.linear_transpose cannot transpose "
            "a call of it that is linear in an input (such as the op "
            "applied to a tangent by its JVP rule): define one with "
            "op.def_transpose_rule(...), as docs/custom_kernel.md shows")
    check_rule_call(op, rule, "the transpose rule",
                    (ct_tree, *args),
                    dict(outs=outs_struct(outs, out_tree), **dict(static)))
    with op.kernels.inheriting(backends):
        result = rule(ct_tree, *args, outs=outs_struct(outs, out_tree),
                      **dict(static))
    if not isinstance(result, (tuple, list)) or len(result) != len(args):
        raise TypeError(
            f"{op!r}: the transpose rule must return a tuple with one "
            f"entry per input ({len(args)}: the cotangent of each linear "
            f"input, None for the others); got {value_str(result)}")
    cotangents: list = []
    for i, (arg, ct) in enumerate(zip(args, result)):
        if not is_undefined_primal(arg) or ct is None or \
                type(ct) is ad.Zero:
            cotangents.append(None)
            continue
        ct = jnp.asarray(ct)
        aval = arg.aval
        if tuple(ct.shape) != tuple(aval.shape):
            raise TypeError(
                f"{op!r}: the transpose rule gave input {i} a cotangent "
                f"of shape {tuple(ct.shape)}, but the input has shape "
                f"{tuple(aval.shape)}")
        if not jnp.issubdtype(ct.dtype, jnp.inexact) and \
                jnp.issubdtype(aval.dtype, jnp.inexact):
            raise TypeError(
                f"{op!r}: the transpose rule gave input {i} a cotangent of "
                f"dtype {ct.dtype.name}, but the input is "
                f"{np.dtype(aval.dtype).name}: cotangents must be floating "
                f"point (an integer one truncates the gradient); return it "
                f"as {np.dtype(aval.dtype).name}")
        if _complex_into_real(ct.dtype, aval.dtype):
            raise TypeError(
                f"{op!r}: the transpose rule gave input {i} a cotangent of "
                f"dtype {ct.dtype.name}, but the input is "
                f"{np.dtype(aval.dtype).name}: a real input's cotangent is "
                f"real, and casting would drop the imaginary part; return "
                f"it as {np.dtype(aval.dtype).name} (jnp.real(ct) if the "
                "imaginary part is zero by construction)")
        if ct.dtype != aval.dtype:
            ct = ct.astype(aval.dtype)
        cotangents.append(ct)
    return cotangents
