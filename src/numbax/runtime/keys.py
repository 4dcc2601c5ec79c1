"""The readable text of a program key: ``identity/configuration/call``.

A compiled program names what it calls by a key of three parts separated by
``/``: the function's module and qualified name (or the op's ``name=``),
what the op was created with, and the call (shapes and dtypes, aliases,
what shape functions returned, scalars, unit axes). These are the writers
and readers of the parts numbax spells itself; they never hold ``/``, so a
``name=`` holding one still parses. The registry (registry.py) maps keys to
what they run.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

import numpy as np

# Marks the keys of ambiguous groups (registry.py): a process that did not
# trace such a key refuses it instead of guessing which function it meant.
AMBIGUOUS_MARK = "~"


def base_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    qualname = getattr(obj, "__qualname__", None) or getattr(
        obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{qualname}"


def dtype_name(dtype: Any) -> str:
    """The one spelling of a dtype in numbax's keys and identities.

    Its name ('float32', 'bfloat16', 'float8_e4m3fnuz', 'int4'), which
    differs for every two distinct dtypes numbax accepts, and which
    :func:`dtype_from_name` reads back in any process that imported
    ml_dtypes. Never ``.str`` ('<V1' for seven of the eight float8 types and
    int4 alike) nor ``.char`` ('E' for bfloat16 and uint1). A dtype the
    name alone does not tell apart (non-native byte order, a structured or
    subarray dtype: refused before any key is made) is spelled so that it
    stays distinct, though no key can hold it.
    """
    dt = np.dtype(dtype)
    if dt.fields is not None or dt.subdtype is not None:
        return str(dt)
    if not dt.isnative:
        return f"{dt.byteorder}{dt.name}"
    return dt.name


def dtype_from_name(name: str) -> np.dtype:
    """The dtype :func:`dtype_name` spells `name`."""
    import ml_dtypes
    # ml_dtypes' own types (bfloat16, the float8 and sub-byte types) by
    # their type, whatever numpy's registry of names holds.
    if not name.startswith("_"):
        own = getattr(ml_dtypes, name, None)
        if isinstance(own, type):
            try:
                return np.dtype(own)
            except TypeError:  # finfo, iinfo: not dtypes
                pass
    return np.dtype(name)


def avals_text(avals) -> str:
    """'float32[64],int32[16x4]' for [(shape, dtype), ...]."""
    return ",".join(f"{dtype_name(d)}[{'x'.join(str(int(n)) for n in s)}]"
                    for s, d in avals)


_AVAL = re.compile(r"([A-Za-z0-9_]+)\[([0-9x]*)\]")


def parse_avals(text: str) -> list:
    avals = []
    for part in filter(None, text.split(",")):
        m = _AVAL.fullmatch(part)
        if m is None:
            raise ValueError(f"malformed array spec {part!r}")
        shape = tuple(int(n) for n in m.group(2).split("x")) if m.group(2) \
            else ()
        avals.append((shape, dtype_from_name(m.group(1))))
    return avals


def alias_spec(aliases) -> str:
    """';alias=0:0,2:1' for input_output_aliases {0: 0, 2: 1} (normalised by
    checks.check_aliases), '' for none: a key without aliases is spelled as
    before. In the key's call part, so that the same function called with
    and without aliases never shares an entry, and a process that rebuilds
    the entry from the key alone knows them."""
    if not aliases:
        return ""
    return ";alias=" + ",".join(f"{i}:{o}" for i, o in sorted(aliases.items()))


def parse_aliases(fields: dict) -> tuple:
    """The sorted (input, output) pairs of a call spec's alias field."""
    text = fields.get("alias", "")
    pairs = []
    for part in filter(None, text.split(",")):
        i, sep, o = part.partition(":")
        if not sep or not i.isdigit() or not o.isdigit():
            raise ValueError(f"malformed alias spec {text!r}")
        pairs.append((int(i), int(o)))
    return tuple(sorted(pairs))


def units_spec(lead, trail) -> str:
    """';lead=...;trail=...' for a key's call part: the unit axes a call XLA
    may split adds per buffer (sharding_rules.Split), '' when none were."""
    spec = ""
    if any(lead):
        spec += ";lead=" + ".".join(str(n) for n in lead)
    if any(trail):
        spec += ";trail=" + ".".join(str(n) for n in trail)
    return spec


def parse_units(fields: dict) -> tuple[tuple, tuple]:
    """(lead, trail): the per-buffer unit axes of a call spec's lead and
    trail fields (() for none)."""
    out = []
    for name in ("lead", "trail"):
        text = fields.get(name, "")
        try:
            out.append(tuple(int(n) for n in text.split(".")) if text
                       else ())
        except ValueError:
            raise ValueError(f"malformed {name} spec {text!r}") from None
    return out[0], out[1]


def slices_spec(sliced) -> str:
    """';slices=1.0.1' for a key's call part: per buffer (inputs, outputs,
    scratch), 1 where a sequential vmap's call hands func one slice of it
    at a time, 0 where func gets it whole (callable/vmap.py)."""
    return ";slices=" + ".".join(str(int(bool(f))) for f in sliced)


def parse_slices(fields: dict) -> tuple:
    """The per-buffer flags of a call spec's slices field (() for none)."""
    text = fields.get("slices", "")
    if not text:
        return ()
    if any(f not in ("0", "1") for f in text.split(".")):
        raise ValueError(f"malformed slices spec {text!r}")
    return tuple(int(f) for f in text.split("."))


def profile_spec(name: str | None) -> str:
    """';prof=<name>' for a call named after its use rather than its op (an
    XLACustomKernel's, ops.Op.use_name), '' for none: the same op's calls
    under two names are two entries, each with its NVTX name, and a process
    that resolves the key names the range as the tracing one did. Quoted:
    a name may hold the characters that separate a key's parts and fields."""
    return f";prof={quote(name, safe='')}" if name else ""


def parse_profile(fields: dict) -> str | None:
    """The use's name a call spec's 'prof' field spells, or None."""
    text = fields.get("prof", "")
    return unquote(text) if text else None


def spec_fields(text: str) -> dict:
    """{'in': ..., 'batch': ...} from 'in=...;batch=...'."""
    out = {}
    for part in text.split(";"):
        k, _, v = part.partition("=")
        out[k] = v
    return out


def split_key(key: str):
    """(group key, call spec, ambiguity mark or None) of a program key."""
    parts = key.rsplit("/", 3)
    mark = None
    if len(parts) == 4 and parts[3].startswith(AMBIGUOUS_MARK):
        mark = parts.pop()
    else:
        parts = key.rsplit("/", 2)
    if len(parts) != 3:
        return None
    identity, config, call = parts
    return f"{identity}/{config}", call, mark


def identity_of(group_key: str) -> str:
    return group_key.rsplit("/", 1)[0]


def config_of(group_key: str) -> str:
    return group_key.rsplit("/", 1)[1]


def is_ambiguous(key: str) -> bool:
    parsed = split_key(key)
    return parsed is not None and parsed[2] is not None
