"""Kernels compiled for explicit signatures: the version Numba's launch runs.

``@cuda.jit("void(float32[:], float32[:])")`` or ``@cuda.jit([sig, ...])``
compiles the listed versions and disables compilation. Asking such a
dispatcher to ``compile(argtypes)`` for numbax's argument types then either
fails ("Compilation disabled", for a list, although Numba's own launch of
the same arrays works) or, for a single signature, hands back its one
version whatever was asked: float64 code on float32 buffers
(CUDA_ERROR_MISALIGNED_ADDRESS, or silently wrong numbers).

Numba's launch (numba-cuda's ``CUDADispatcher.call`` and the C dispatcher's
``_cuda_call``) chooses among the compiled versions: every argument's type
must convert to the version's parameter type (``typingctx.can_convert``;
for arrays: the same dtype and rank, and a layout equal to the array's or
``'A'``), the best-rated version wins (fewest unsafe, then safe conversions,
then promotions) and a tie is an error. A single-signature dispatcher skips
the check and launches its one version; numbax checks it the same way, so a
mismatch is a ``TypeError`` at trace time instead of a launch on buffers of
another type. Dispatchers that may still compile get exactly the types
numbax passes (``kernel.compile``), as Numba's launch of them does.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

# Rating order: Numba's (numba/cuda/cext/typeconv.cpp, Rating::operator<).
_RATED = ("unsafe", "safe", "promote")


def explicit_only(kernel) -> bool:
    """True for a dispatcher that launches only versions compiled already."""
    if not isinstance(getattr(kernel, "overloads", None), dict):
        return False  # the simulator's kernels: Python, no versions
    return bool(getattr(kernel, "specialized", False)) or not bool(
        getattr(kernel, "_can_compile", True))


def conversion(ctx, actual, formal) -> str | None:
    """How Numba converts `actual` to `formal`: 'exact', 'promote', 'safe',
    'unsafe', or None where it cannot."""
    conv = ctx.can_convert(actual, formal)
    if conv is None:
        return None
    name = getattr(conv, "name", None) or str(conv)
    return None if name == "nil" else name


def rate(ctx, argtypes: Sequence, formals: Sequence):
    """(unsafe, safe, promote) conversions for calling a version taking
    `formals` with `argtypes`; or (index, None) of the first argument it
    cannot take."""
    if len(argtypes) != len(formals):
        return None
    counts = dict.fromkeys(_RATED, 0)
    for i, (actual, formal) in enumerate(zip(argtypes, formals)):
        how = conversion(ctx, actual, formal)
        if how is None:
            return (i, None)
        if how in counts:
            counts[how] += 1
    return tuple(counts[k] for k in _RATED)


def choose(ctx, signatures: Sequence[tuple], argtypes: tuple,
           specialized: bool):
    """(chosen signature or None, [(signature, first refused argument)],
    [tied signatures]) as Numba's launch would choose."""
    candidates = list(signatures[:1]) if specialized else list(signatures)
    rated, refused = [], []
    for formals in candidates:
        r = rate(ctx, argtypes, formals)
        if r is None:
            refused.append((formals, None))
        elif r[1] is None:
            refused.append((formals, r[0]))
        else:
            rated.append((r, formals))
    if not rated:
        return None, refused, []
    best = min(r for r, _ in rated)
    tied = [f for r, f in rated if r == best]
    if len(tied) > 1:
        return None, refused, tied
    return tied[0], refused, []


def parameter_names(kernel) -> list:
    py_func = getattr(kernel, "py_func", kernel)
    try:
        return list(inspect.signature(py_func).parameters)
    except (TypeError, ValueError):
        return []


def describe_argument(index: int, n_in: int | None, names: list) -> str:
    role = ""
    if n_in is not None:
        role = (f"input {index}" if index < n_in
                else f"output {index - n_in}")
    name = f"'{names[index]}'" if index < len(names) else ""
    inner = ", ".join(p for p in (role, name) if p)
    return f"argument {index}" + (f" ({inner})" if inner else "")


def select(kernel, argtypes: tuple, label: str, n_in: int | None = None):
    """The compiled version of `kernel` Numba's launch would run for
    `argtypes`, or None where the kernel may still compile (then
    ``kernel.compile(argtypes)`` is that version). TypeError, naming the op,
    the argument and both types, where no version takes them."""
    chosen = select_signature(kernel, argtypes, label, n_in)
    return None if chosen is None else kernel.overloads[chosen]


def select_signature(kernel, argtypes: tuple, label: str,
                     n_in: int | None = None):
    """The argument types of the version `select` picks, or None.

    numba-cuda-mlir's dispatcher compiles whatever types it is asked for,
    explicit signatures or not: its kernels with explicit signatures are
    compiled (from its cache of them) for the signature chosen here."""
    if not explicit_only(kernel):
        return None
    overloads: dict[Any, Any] = kernel.overloads
    signatures = list(overloads)
    specialized = bool(getattr(kernel, "specialized", False))
    chosen, refused, tied = choose(kernel.typingctx, signatures, argtypes,
                                   specialized)
    if chosen is not None:
        return chosen
    names = parameter_names(kernel)
    spell = lambda sig: "(" + ", ".join(map(str, sig)) + ")"  # noqa: E731
    if tied:
        listed = "; ".join(spell(s) for s in tied)
        raise TypeError(
            f"{label}: the kernel was compiled for explicit signatures only, "
            f"and several take argument types {spell(argtypes)} equally well "
            f"({listed}): Numba's own launch refuses this as ambiguous. Keep "
            "one signature per set of argument types in @cuda.jit([...])")
    reasons = []
    for sig, index in refused:
        if index is None:
            reasons.append(
                f"signature {spell(sig)} takes {len(sig)} arguments, "
                f"numbax passes {len(argtypes)}")
        else:
            # A scalar passed by value has a Numba scalar type, no ndim.
            what = ("array" if hasattr(argtypes[index], "ndim")
                    else "scalar")
            reasons.append(
                f"signature {spell(sig)} takes {sig[index]} as "
                f"{describe_argument(index, n_in, names)}, but the {what} "
                f"there is {argtypes[index]}")
    only = "its one signature" if specialized else "any of its signatures"
    raise TypeError(
        f"{label}: the kernel was compiled for explicit signatures only and "
        f"these arrays do not match {only} (Numba would run code for other "
        f"types on them): {'; '.join(reasons)}. Pass arrays of the "
        "signature's dtype and rank (e.g. x.astype(...)), add a signature "
        "for these types to @cuda.jit, or drop the signatures so that Numba "
        "compiles the kernel for the arrays it gets")
