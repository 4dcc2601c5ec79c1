"""Sharding rules: which axes of a numbax op XLA may split across devices.

An op may declare, in the einsum-like notation of JAX's Shardy rules, which
axes of its inputs and outputs are the same *factor*::

    numba_cuda_callable(f, outs, sharding_rule="i j, j -> i j")

Here factor ``i`` (the rows of input 0 and of the output) may be split:
each device then runs the op on its own rows, with the whole of input 1.
numbax splits the factors that *lead* the rule: the longest run of factors
that every output starts with, such that every input either starts with it
too (a *split* array: each device gets its shard) or names none of it (a
*whole* array: each device gets all of it). Every other factor stays whole
on each device (it is a ``need_replication`` factor of the Shardy rule).
``batch_partitionable=True`` is the rule with one shared leading factor and
nothing else shared; ``jax.vmap`` puts the vmapped axis in front of an op's
rule (or of a rule that shares nothing), so every vmapped call splits along
the vmapped axis.

How XLA is told (:func:`split`, :class:`Split`): a Shardy rule alone makes
Shardy propagate shardings through the call, but XLA's partitioner still
gathers around a custom call it has no partitioner for (read from the
compiled program, jax 0.10.2). The partitioner XLA has for custom calls
without Python at compile time is the batch partitioner that
``jax.ffi.register_ffi_target_as_batch_partitionable`` enables (the one
``jax.lax.linalg`` uses): it splits the leading ``num_batch_dims`` axes of
every operand and result alike, and passes an array with fewer axes than
that whole. So numbax gives every split array enough leading axes of extent
1 (``units``) that every whole array has fewer axes than the split arrays'
batch axes (and, where no split input has another axis, each one a unit
axis at the end, or the partitioner would read them all as replicated), calls a target registered
as batch-partitionable with ``num_batch_dims = units + len(factors)`` and
the Shardy rule over those shapes, and drops the unit axes again before the
kernel or func sees the buffers (C++: ``DropUnitAxes``). The reshapes are bitcasts; the
annotations are part of the program, so they survive ``jax.export`` and
need no Python while XLA compiles.

The lowering of such a call (:func:`lower_split`, for every op kind) adds
the unit axes and the annotations XLA's partitioners read: the frontend
attribute ``num_batch_dims`` (GSPMD) and the Shardy rule
``sdy.sharding_rule``, on numbax's ``*_batch`` targets, which XLA knows as
batch-partitionable. The mechanism is XLA's
(``jax.ffi.register_ffi_target_as_batch_partitionable``, as
``jax.lax.linalg`` uses it), so it works in jax 0.8 to 0.12 under both
Shardy and GSPMD, and survives ``jax.export``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import jax
from jax.interpreters import mlir

from ..runtime import compat, keys
from . import profile_names

_FACTOR = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Rule:
    """A parsed rule: the factor of every axis of every input and result."""
    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]

    def __str__(self):
        return (", ".join(" ".join(m) for m in self.operands) + " -> " +
                ", ".join(" ".join(m) for m in self.results))

    def factors(self) -> set:
        return {f for m in self.operands + self.results for f in m}


def _err(op: str, rule, what: str) -> ValueError:
    return ValueError(f"{op}: sharding_rule {str(rule)!r}: {what}")


def parse(text, op: str) -> Rule:
    """The rule ``text`` ("i j, j -> i j"), or ValueError naming `op`.

    Factors are names (a letter, then letters, digits or underscores),
    separated by spaces; arrays by commas; inputs from results by ``->``.
    An array of rank 0 has an empty mapping ("i, -> i" has a scalar second
    input). Shardy's ``...`` and compound factors ``(i j)`` are refused:
    numbax splits whole leading axes only.
    """
    if isinstance(text, Rule):
        return text
    if not isinstance(text, str):
        raise TypeError(f"{op}: sharding_rule must be a str in the einsum-like "
                        f"notation of Shardy rules (e.g. 'i j, j -> i j'), got "
                        f"{type(text).__name__}: {text!r}")
    if text.count("->") != 1:
        raise _err(op, text, "needs exactly one '->' between the inputs and "
                   "the outputs (e.g. 'i j, j -> i j')")
    lhs, rhs = text.split("->")

    def side(part: str) -> tuple[tuple[str, ...], ...]:
        if "..." in part or "(" in part or ")" in part:
            raise _err(op, text, "'...' and compound factors '(a b)' are not "
                       "supported: name each axis by a factor of its own")
        arrays = [a.split() for a in part.split(",")]
        if len(arrays) == 1 and not arrays[0]:
            return ()
        for mapping in arrays:
            for f in mapping:
                if not _FACTOR.match(f):
                    raise _err(op, text, f"{f!r} is not a factor name (a "
                               "letter, then letters, digits or underscores)")
        return tuple(tuple(m) for m in arrays)

    return Rule(side(lhs), side(rhs))


def _with_whole_scratch(rule: Rule, out_shapes: Sequence,
                        n_scratch: int) -> Rule:
    """`rule` with a mapping of factors of their own for each scratch buffer
    it leaves out (an example for the message below)."""
    used = rule.factors()
    extra = []
    for k, shape in enumerate(out_shapes[len(out_shapes) - n_scratch:]):
        names = []
        for d in range(len(shape)):
            name = f"s{k}" if len(shape) == 1 else f"s{k}_{d}"
            while name in used:
                name += "_"
            names.append(name)
        extra.append(tuple(names))
    return Rule(rule.operands, rule.results + tuple(extra))


def check(rule: Rule, in_shapes: Sequence, out_shapes: Sequence, op: str, *,
          n_scratch: int = 0) -> None:
    """ValueError naming `op` where `rule` does not fit the call's arrays:
    counts, ranks, a factor of two extents, or a factor named twice in one
    array. The last `n_scratch` of `out_shapes` are a callable's scratch
    buffers, which the rule names after its outputs."""
    if len(rule.operands) != len(in_shapes):
        raise _err(op, rule, f"names {len(rule.operands)} input(s), but the "
                   f"call has {len(in_shapes)}")
    if n_scratch and len(rule.results) != len(out_shapes):
        n_out = len(out_shapes) - n_scratch
        example = ""
        if len(rule.results) == n_out:
            whole = _with_whole_scratch(rule, out_shapes, n_scratch)
            example = f" (e.g. {str(whole)!r})"
        raise _err(op, rule, f"names {len(rule.results)} result(s), but the "
                   f"op has {n_out} output(s) and {n_scratch} scratch "
                   f"buffer(s), and the rule must name all {len(out_shapes)}: "
                   "after '->' come the outputs, then the scratch buffers, "
                   "in order. Give each scratch buffer factors of its own to "
                   "keep it whole on every device" + example + ", or lead it "
                   "with the split factors to split it with them")
    if len(rule.results) != len(out_shapes):
        raise _err(op, rule, f"names {len(rule.results)} result(s), but the "
                   f"op has {len(out_shapes)} outputs")
    sizes: dict = {}
    arrays = ([(f"input {i}", m, s) for i, (m, s) in
               enumerate(zip(rule.operands, in_shapes))] +
              [(f"output {i}", m, s) for i, (m, s) in
               enumerate(zip(rule.results, out_shapes))])
    for what, mapping, shape in arrays:
        shape = tuple(int(d) for d in shape)
        if len(mapping) != len(shape):
            raise _err(op, rule, f"gives {what} {len(mapping)} axes "
                       f"({' '.join(mapping) or 'none'}), but it has rank "
                       f"{len(shape)} (shape {shape})")
        seen = set()
        for f, n in zip(mapping, shape):
            if f in seen:
                raise _err(op, rule, f"factor {f!r} names two axes of {what}")
            seen.add(f)
            if f in sizes and sizes[f][0] != n:
                raise _err(op, rule, f"factor {f!r} is axis of extent "
                           f"{sizes[f][0]} in {sizes[f][1]} but {n} in {what}")
            sizes.setdefault(f, (n, what))


@dataclass(frozen=True)
class Split:
    """How one call is split: the factors, and the arrays' leading units.

    Attributes:
      factors: the split factors, in the order they lead the arrays.
      units: the leading unit axes added to every split array.
      lead: per array (inputs, then results), the unit axes added: `units`
        for a split array, 0 for a whole one.
      trail: per array, the unit axes added at the end: 1 for each split
        input where no split input would otherwise have an axis beside the
        batch axes (XLA's batch partitioner takes its sharding from the
        inputs, and reads an input with no other axis as replicated), and
        for an output aliased to such an input; else 0.
      sdy_rule: the Shardy rule over the arrays as the custom call has them
        (unit axes included).
      replicated: the rule's factors that stay whole on each device.
      sizes: each split factor's global extent.
    """
    factors: tuple[str, ...]
    units: int
    lead: tuple[int, ...]
    trail: tuple[int, ...]
    sdy_rule: str
    replicated: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def num_batch_dims(self) -> int:
        return self.units + len(self.factors)

    def buffer_units(self) -> tuple[tuple, tuple]:
        """(lead, trail), each () where no buffer has such unit axes: what
        the handlers drop (CallableEntry.units, LoadedKernel)."""
        return (self.lead if any(self.lead) else (),
                self.trail if any(self.trail) else ())

    def lead_spec(self) -> str:
        """';lead=...;trail=...' for a key's call part: the unit axes added
        per buffer ('' when none were)."""
        return keys.units_spec(self.lead, self.trail)


def _leads(mapping, prefix) -> bool:
    return tuple(mapping[:len(prefix)]) == tuple(prefix)


def split(rule: Rule, in_shapes: Sequence, out_shapes: Sequence, op: str, *,
          n_free_results: int = 0, aliases=(), internal: bool = False
          ) -> Split:
    """The :class:`Split` of a call (the rule checked first), or ValueError
    naming `op` when no factor can be split.

    The last `n_free_results` results (a callable's scratch buffers) do not
    decide the factors: each is split where it starts with them, else whole.
    `aliases`: (input, output) pairs, which must be split alike.
    `internal`: a rule numbax made (jax.vmap's), not the user's: its
    split may name no input (every input broadcast, all slices alike).
    """
    check(rule, in_shapes, out_shapes, op, n_scratch=n_free_results)
    main = rule.results[:len(rule.results) - n_free_results] \
        if n_free_results else rule.results
    prefix: tuple = ()
    if main:
        first = main[0]
        n = min(len(m) for m in main)
        k = 0
        while k < n and all(m[k] == first[k] for m in main):
            k += 1
        prefix = tuple(first[:k])
    arrays = rule.operands + rule.results
    chosen: tuple = ()
    for k in range(len(prefix), 0, -1):
        p = prefix[:k]
        names = set(p)
        if all(_leads(m, p) or not names & set(m) for m in arrays):
            chosen = p
            break
    if not chosen:
        raise _err(op, rule, "numbax can split only factors that lead every "
                   "output, each input either leading with them too or not "
                   "naming them at all (e.g. 'i j, j -> i j' splits i); this "
                   "rule has no such factor. Leave sharding_rule out (XLA "
                   "then gathers the inputs and runs the whole op on every "
                   "device), or use jax.shard_map")
    split_arrays = [_leads(m, chosen) for m in arrays]
    n_in = len(rule.operands)
    if not internal and not any(split_arrays[:n_in]):
        inputs = {f for m in rule.operands for f in m}
        unknown = [f for f in chosen if f not in inputs]
        raise _err(op, rule, f"unknown factor {unknown[0]!r}: it leads every "
                   "output but no input names it, so a device could not "
                   "tell which part of it it computes; name the input axis "
                   "it follows (e.g. 'i, i -> i')" if unknown else
                   "the factors that lead every output lead no input")
    for i, o in aliases:
        if split_arrays[i] != split_arrays[n_in + o]:
            raise _err(op, rule, f"input {i} is aliased to output {o}, so "
                       "both must be split, or both whole")
    whole_ranks = [len(m) for m, s in zip(arrays, split_arrays) if not s]
    units = max(0, max(whole_ranks, default=-1) + 1 - len(chosen))
    used = rule.factors()
    unit_names: list[str] = []
    n = 0
    while len(unit_names) < units:
        name = f"numbax_unit{n}"
        n += 1
        if name not in used:
            unit_names.append(name)
    lead = tuple(units if s else 0 for s in split_arrays)
    # The batch partitioner takes the split from the inputs that have an
    # axis besides the batch axes: where none has, each split input gets
    # one (a unit axis at the end).
    need_trail = not any(s and len(m) > len(chosen) for m, s in
                         zip(rule.operands, split_arrays[:n_in]))
    trail_list = [1 if need_trail and s and i < n_in else 0
                  for i, s in enumerate(split_arrays)]
    for i, o in aliases:  # an output written in place has its input's shape
        trail_list[n_in + o] = trail_list[i]
    trail = tuple(trail_list)
    trail_name = "numbax_trail"
    while trail_name in used:
        trail_name += "_"

    def mapping(m, s, t=0):
        return " ".join((unit_names if s else []) + list(m) +
                        ([trail_name] if t else []))
    sdy = (", ".join(mapping(m, s, t) for m, s, t in
                     zip(rule.operands, split_arrays[:n_in], trail)) + " -> " +
           ", ".join(mapping(m, s, t) for m, s, t in
                     zip(rule.results, split_arrays[n_in:], trail[n_in:])))
    # In the order the factors first appear (Shardy wants the indices of
    # special factors sorted).
    order = [f for f in sdy.replace(",", " ").replace("->", " ").split()]
    keep = set(chosen)
    replicated = tuple(dict.fromkeys(f for f in order if f not in keep))
    shapes = list(in_shapes) + list(out_shapes)
    sizes = []
    for f in chosen:
        for m, s in zip(arrays, shapes):
            if f in m:
                sizes.append(int(s[m.index(f)]))
                break
    return Split(chosen, units, lead, trail, sdy, replicated, tuple(sizes))


def leading_rule(in_shapes: Sequence, out_shapes: Sequence) -> Rule:
    """``batch_partitionable=True``: axis 0 of every array is one factor,
    every other axis a factor of its own."""
    def mapping(prefix, i, shape):
        return ("batch",) + tuple(f"{prefix}{i}_{d}"
                                  for d in range(1, len(shape)))
    return Rule(tuple(mapping("in", i, s) for i, s in enumerate(in_shapes)),
                tuple(mapping("out", i, s) for i, s in enumerate(out_shapes)))


def unshared_rule(in_shapes: Sequence, out_shapes: Sequence) -> Rule:
    """A rule that shares no factor (each axis its own): an op without a
    rule, which only jax.vmap's axis splits."""
    return Rule(
        tuple(tuple(f"in{i}_{d}" for d in range(len(s)))
              for i, s in enumerate(in_shapes)),
        tuple(tuple(f"out{i}_{d}" for d in range(len(s)))
              for i, s in enumerate(out_shapes)))


def vmapped(rule: Rule, batched: Sequence,
            results: Sequence[bool] | None = None) -> Rule:
    """`rule` under jax.vmap: the vmapped axis, a new factor, leads every
    result and every input in `batched`; the other inputs (broadcast ones
    with a leading axis of 1, or unbatched ones without) get a factor of
    their own for it, or none (`batched[i]` None: no leading axis).
    `results`: which results have the vmapped axis (default: all; a
    sequential vmap's scratch buffers have none)."""
    used = rule.factors()
    n = 0
    while f"vmap{n}" in used:
        n += 1
    v = f"vmap{n}"
    operands = []
    for i, (m, b) in enumerate(zip(rule.operands, batched)):
        if b is None:
            operands.append(m)
        elif b:
            operands.append((v,) + m)
        else:
            name = f"{v}_in{i}"
            operands.append((name,) + m)
    if results is None:
        results = [True] * len(rule.results)
    return Rule(tuple(operands), tuple((v,) + m if r else m
                                       for m, r in zip(rule.results, results)))


def launch_ties(launch_dims, split_: Split, op: str) -> tuple[int, ...]:
    """Per launch axis of `launch_dims`, the axis of output 0 (unbatched)
    whose local extent it covers, or -1 (the axis stays as given).

    The leading launch axes cover the split factors, in order: each must
    equal that factor's global extent, or the launch would not cover it.
    """
    ties = []
    for a, extent in enumerate(launch_dims):
        if a < len(split_.factors):
            if int(extent) != split_.sizes[a]:
                raise ValueError(
                    f"{op}: the launch is split with the arrays, so "
                    f"launch_dims must start with the extents of the split "
                    f"factors {split_.factors} ({split_.sizes}): each device "
                    f"then launches over its own shard; launch axis {a} is "
                    f"{extent}. Or give grid= and block= and take every size "
                    "from the arrays in the kernel (a grid-stride loop): the "
                    "grid then stays as given")
            ties.append(a)
        else:
            ties.append(-1)
    return tuple(ties)


# -- the lowering of a split call --------------------------------------------

def _sharding_rule_attr(op, split):
    """The Shardy rule attribute of the custom call `op`."""
    str_to_sdy_sharding_rule, sdy_sharding_rule_to_mlir = \
        compat.sdy_sharding_rule_api()
    operand_types = [v.type for v in op.operands]
    result_types = [v.type for v in op.results]
    try:
        rule = str_to_sdy_sharding_rule(
            split.sdy_rule, need_replication_factors=split.replicated)
    except TypeError as exc:  # pragma: no cover - an older Shardy rule API
        raise NotImplementedError(
            "numbax's partitioned calls need a jax whose Shardy sharding "
            "rules support need_replication_factors; set "
            "jax_use_shardy_partitioner=False, or drop the sharding rule "
            "(batch_partitionable, sharding_rule)") from exc
    return sdy_sharding_rule_to_mlir(rule, operand_types, result_types)


def split_for(ctx, rule, vmap_only: bool, op: str, *, n_free_results=0,
              aliases=()):
    """The Split of a lowered call, or None when it is not split (no rule,
    or only vmap's in a program of one device)."""
    if rule is None:
        return None
    if vmap_only and compat.lowering_device_count(ctx) <= 1:
        return None
    in_shapes = [tuple(a.shape) for a in ctx.avals_in]
    out_shapes = [tuple(a.shape) for a in ctx.avals_out]
    return split(rule, in_shapes, out_shapes, op,
                 n_free_results=n_free_results, aliases=aliases,
                 internal=vmap_only)


def lower_split(ctx, args, *, target: str, split, key: str, aliases,
                has_side_effect: bool = False,
                profile_name: str | None = None):
    """The custom call of a split call: split arrays get the unit axes of
    `split` (bitcasts; C++ drops them again), and the call the annotations
    of XLA's batch partitioner. `profile_name` names it in HLO."""
    def grown(aval, lead, trail):
        if not lead and not trail:
            return aval
        return aval.update(shape=(1,) * lead + tuple(aval.shape) +
                           (1,) * trail)
    n_in = len(ctx.avals_in)
    units = list(zip(split.lead, split.trail))
    avals_in = [grown(a, *u) for a, u in zip(ctx.avals_in, units[:n_in])]
    avals_out = [grown(a, *u) for a, u in zip(ctx.avals_out, units[n_in:])]
    args = [compat.reshape_value(ctx, x, a) if any(u) else x
            for x, a, u in zip(args, avals_in, units[:n_in])]
    inner = ctx.replace(avals_in=avals_in, avals_out=avals_out)
    lowering = jax.ffi.ffi_lowering(
        target, operand_output_aliases=dict(aliases),
        has_side_effect=has_side_effect)
    with profile_names.named(ctx, profile_name):
        results = lowering(inner, *args, key=key)
    call = results[0].owner
    call = getattr(call, "operation", call)
    call.attributes["mhlo.frontend_attributes"] = mlir.ir.DictAttr.get(
        {"num_batch_dims": mlir.ir.StringAttr.get(str(split.num_batch_dims))})
    if compat.shardy_on():
        call.attributes["sdy.sharding_rule"] = _sharding_rule_attr(call, split)
    return [compat.reshape_value(ctx, r, a) if any(u) else r
            for r, a, u in zip(results, ctx.avals_out, units[n_in:])]
