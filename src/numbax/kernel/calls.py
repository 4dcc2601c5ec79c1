"""The call part of a numba_cuda_kernel's key: written when traced, read back.

A process that resolves a key it did not trace (a deserialised or cached
program) has nothing but the key and the op created here: the call part
spells the input shapes, the batch, the broadcast inputs, the aliases, the
fold, what shape functions returned and the scalars, and :func:`parse`
reads them back (runtime/keys.py has the pieces every op spells alike).
:func:`program_key` registers a traced call's key, CPU or GPU.
"""

from __future__ import annotations

import numpy as np

from ..runtime import keys, registry
from ..trace import scalar_args
from . import vmap
from .launch_config import Call


def program_key(op, avals, batch, broadcast, call: Call, split,
                make_entry) -> str:
    """The key of a lowered call (registry.program_key: `make_entry(key)`
    makes its entry where the registry has none)."""
    return registry.program_key(
        op.kernel, op.group_key,
        spec(op, avals, batch, broadcast,
             vmap.fold_spec(op, avals, batch, broadcast, call),
             op.alias_pairs(), call,
             split.lead_spec() if split is not None else ""),
        make_entry)


def spec(op, avals, batch, broadcast, fold: str = "", aliases: tuple = (),
         call: Call | None = None, lead: str = "") -> str:
    flags = "".join("1" if b else "0" for b in broadcast)
    spec = (f"in={keys.avals_text(avals)};batch={int(batch)}"
            f";bcast={flags}")
    spec += keys.alias_spec(dict(aliases))
    # How a vmapped call launches (axis/slices per launch) is decided
    # anew from the compiled kernel wherever the key is resolved; it is
    # in the key so that a program built under another chunk limit
    # never shares an entry with this one.
    spec += f";fold={fold}" if fold else ""
    if call is not None:
        # What shape functions returned, and the scalars: a process
        # that resolves the key has nothing else to go by.
        # (And outputs narrowed to 32 bits with x64 off, which the op's
        # declared outs do not say: op._checked_call.)
        if op.outs_fn is not None or _narrowed(op, call):
            spec += f";out={keys.avals_text(call.outs)}"
        if op.dims_fn is not None:
            spec += (f";grid={'x'.join(map(str, call.grid))}"
                     f";block={'x'.join(map(str, call.block))}")
        spec += scalar_args.scalars_spec(call.scalars)
        if call.traced:
            # Which 1-element buffers the generated kernel reads a value
            # from (only calls with traced scalars say so: other keys stay
            # what they were).
            spec += ";traced=" + ",".join(map(str, call.traced))
        spec += keys.profile_spec(call.name)
    # The leading unit axes of a call XLA may split (a program of
    # several devices, or an op with a rule): C++ drops them first.
    spec += lead
    assert "/" not in spec, spec  # "/" separates a key's parts
    return spec


def _narrowed(op, call: Call) -> bool:
    """Whether a fixed op's call returns other dtypes than it declares
    (64-bit outs narrowed to 32 bits with x64 off)."""
    return any(np.dtype(d) != np.dtype(s.dtype)
               for (_, d), s in zip(call.outs, op.out_specs))


def parse(op, call: str):
    """(avals, batch, broadcast, aliases, Call, units) of a call part."""
    fields = keys.spec_fields(call)
    avals = keys.parse_avals(fields.get("in", ""))
    batch = int(fields.get("batch", "0") or 0)
    broadcast = tuple(c == "1" for c in fields.get("bcast", ""))
    if len(broadcast) != len(avals):
        raise ValueError(f"{op!r}: malformed call spec {call!r}")
    scalars = scalar_args.parse_scalars(fields)
    try:
        traced = tuple(int(p) for p in
                       filter(None, fields.get("traced", "").split(",")))
    except ValueError:
        raise ValueError(f"{op!r}: malformed call spec {call!r}") from None
    if op.outs_fn is not None or "out" in fields:
        if "out" not in fields:
            raise ValueError(f"{op!r}: call spec {call!r} has no out=")
        outs = tuple((tuple(s), np.dtype(d)) for s, d in
                     keys.parse_avals(fields["out"]))
    else:
        outs = tuple((tuple(s.shape), np.dtype(s.dtype))
                     for s in op.out_specs)
    if op.dims_fn is not None:
        try:
            grid, block = (tuple(int(n) for n in fields[k].split("x"))
                           for k in ("grid", "block"))
        except (KeyError, ValueError):
            raise ValueError(
                f"{op!r}: call spec {call!r} has no grid= and "
                "block=") from None
    else:
        grid, block, _ = op.fixed_launch()
    return (avals, batch, broadcast, keys.parse_aliases(fields),
            Call(outs, tuple(grid), tuple(block), scalars,
                 keys.parse_profile(fields), traced=traced),
            keys.parse_units(fields))
