"""One reading for every boolean environment switch of numbax.

NUMBAX_ALLOW_UNTESTED_FFI, NUMBAX_CHECK_INPUTS and NUMBAX_FAST_LAUNCH all go
through :func:`flag`: ``1``, ``true``, ``yes``, ``on`` turn a switch on;
``0``, ``false``, ``no``, ``off`` turn it off; case and surrounding
whitespace are ignored, and unset or empty keeps the default. Any other
value keeps the default too, with a RuntimeWarning (once per variable and
value) naming the variable, the value and the accepted words, instead of
silently picking one (before, ``NUMBAX_CHECK_INPUTS=false`` turned the check
on). This module imports nothing of numbax: compat.py reads it at import.
"""

from __future__ import annotations

import os
import threading
import warnings

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def parse(name: str, value: str | None, default: bool) -> bool:
    """What `value` of the switch `name` means (default if unset, empty or
    not a word of TRUE_WORDS or FALSE_WORDS, warning for the last)."""
    if value is None:
        return default
    word = value.strip().lower()
    if not word:
        return default
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    with _lock:
        first = (name, value) not in _warned
        _warned.add((name, value))
    if first:
        warnings.warn(
            f"numbax: {name}={value!r} is not a switch value numbax knows, so "
            f"it is ignored and {name} stays {'on' if default else 'off'} "
            f"(its default); set {name} to one of "
            f"{', '.join(TRUE_WORDS)} to turn it on, or "
            f"{', '.join(FALSE_WORDS)} to turn it off (case and spaces are "
            f"ignored)", RuntimeWarning, stacklevel=3)
    return default


def flag(name: str, default: bool) -> bool:
    """The environment switch `name`, read now (see :func:`parse`)."""
    return parse(name, os.environ.get(name), default)


#: Turns the fast path of func's kernel launches off for every op
#: (docs/fast_launch.md), read when XLA instantiates a program.
FAST_LAUNCH_ENV = "NUMBAX_FAST_LAUNCH"


def fast_launch_enabled() -> bool:
    """False when NUMBAX_FAST_LAUNCH turns the fast path off."""
    return flag(FAST_LAUNCH_ENV, True)
