"""Stable keys for user functions, and their lookup when XLA instantiates a program.

A compiled program names the Python function (or kernel) it calls by a
readable string key, ``identity/configuration/call``: the function's module
and qualified name (or the op's ``name=``), what the op was created with
(outs, scratch, capture, launch configuration) and the shapes and dtypes of
the call. No pointer, id or counter of this process. Creating the same op is
all another process needs to run the program: it finds the op by identity
and configuration, and builds what the call needs (for a kernel, compiles
it) from the call part, at XLA's instantiate stage.

Several live functions under one identity and configuration (closures made
by one factory) are ambiguous across processes: their keys carry this
process's mark, resolve exactly here, and are refused elsewhere (and at
export), with an error asking for name=.

The keys' text is written and read in keys.py; the fixed FFI targets the
keys are attributes of, and their registration, are in targets.py; what the
registry asks of an op is ops.Op.
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable


from . import env, keys, numba_bridge, ops, targets

# Guards the entries, groups and memo below.
_lock = threading.RLock()


@dataclass
class CallableEntry:
    """What a callable key resolves to."""
    key: str
    func_ref: Callable[[], Any]  # weak where the function allows it
    num_inputs: int
    num_outputs: int
    num_scratch: int = 0
    func_id: int = 0
    bfloat16: bool = False
    fast_launch: bool = True
    # input_output_aliases as sorted (input, output) pairs: C++ copies an
    # input into its aliased output where XLA hands them two buffers.
    aliases: tuple = ()
    # (lead, trail): per buffer, the unit axes a call XLA may split has at
    # the start and at the end (sharding_rules.Split), which C++ drops
    # before func sees the arrays; () when the key's call added none.
    units: tuple = ()
    # A sequential vmap's call (callable/vmap.py): per buffer, 1 where C++
    # hands func one slice at a time (func runs once per slice), 0 where
    # func gets the buffer whole; () for any other call.
    slices: tuple = ()
    # The op's name in profiles (profile_names.py): each call is an NVTX range
    # with this name. Empty: C++ names the range after the key.
    name: str = ""


@dataclass
class KernelEntry:
    """What a kernel key resolves to; `resolve` builds, at XLA's instantiate
    stage, what the C++ call site holds (a numba_cuda_kernel's LoadedKernel,
    a numba_kernel's site tuple)."""
    key: str
    resolve: Callable[[], tuple]
    # Weak where the owner allows it, like CallableEntry.func_ref: the
    # registry must not keep an op alive (resolve must not refer to it
    # strongly either); the C++ call site holds what resolve returns.
    owner_ref: Callable[[], Any] = lambda: None
    extra: dict = field(default_factory=dict)
    func_id: int = 0


@dataclass
class Member:
    """One function registered under a group key (identity/configuration).

    Two live members under one group key are ambiguous across processes: a
    program key names the group, not the function object.
    """
    func_ref: Callable[[], Any]
    serial: int
    num_outputs: int
    num_scratch: int
    # Weak references to the ops created for this function: a kernel op
    # builds its LoadedKernel (or simulator launcher) from the call spec.
    ops: list = field(default_factory=list)
    # hash() of the plain (unmarked) keys this member traced here whose
    # entries were evicted or cleared since, most recent last: once another
    # function joins the group such a key no longer names one function, yet
    # a program compiled here before still means this one (_lookup).
    # Bounded: past it, the oldest such programs are refused as ambiguous.
    dropped: "OrderedDict[int, None]" = field(default_factory=OrderedDict)

    def live_op(self):
        for ref in reversed(self.ops):
            op = ref()
            if op is not None:
                return op
        return None


# Program key -> what it runs, for the keys this process traced or has
# already resolved: the in-process lookup is exact, never by group. Most
# recently used last, at most MAX_ENTRIES: every new input shape or batch
# size adds a key, and a service meeting ever new shapes would grow without
# bound. An evicted entry is rebuilt from its key (and the op created here)
# when a program needs it again, as for a deserialised program; call sites
# XLA already instantiated hold what they run themselves.
MAX_ENTRIES = 4096
_entries: "OrderedDict[str, Any]" = OrderedDict()
# Group key ("identity/configuration") -> {id(func): Member}.
_groups: dict[str, dict[int, Member]] = {}
# (id(func), group key, call spec) -> program key; cleaned when func dies,
# or when its key's entry is evicted.
_memo: dict[tuple, str] = {}
_memo_of_key: dict[str, tuple] = {}


def _store(key: str, entry: Any, memo_key: tuple | None = None) -> None:
    """Records `entry` under `key` (with _lock held), evicting the least
    recently used entries beyond MAX_ENTRIES."""
    _entries[key] = entry
    _entries.move_to_end(key)
    if memo_key is not None:
        _memo[memo_key] = key
        _memo_of_key[key] = memo_key
    while len(_entries) > max(1, MAX_ENTRIES):
        old, old_entry = _entries.popitem(last=False)
        _note_dropped(old, old_entry)
        memo_of_old = _memo_of_key.pop(old, None)
        if memo_of_old is not None:
            _memo.pop(memo_of_old, None)


#: How many dropped plain keys each member remembers (a hash each).
MAX_DROPPED = 65536


def _note_dropped(key: str, entry: Any) -> None:
    """Remembers (with _lock held) that the entry of `key`, a plain key
    traced here, was dropped: the member that traced it still serves it
    after another function joins its group."""
    parsed = keys.split_key(key)
    if parsed is None or parsed[2] is not None:
        return  # marked keys name their member themselves
    member = _groups.get(parsed[0], {}).get(getattr(entry, "func_id", 0))
    if member is None:
        return
    member.dropped[hash(key)] = None
    member.dropped.move_to_end(hash(key))
    while len(member.dropped) > MAX_DROPPED:
        member.dropped.popitem(last=False)


def clear_entries() -> None:
    """Drops every program key's entry, and the simulator launchers the
    kernel ops keep (numbax.clear_caches()): each is rebuilt from its key
    when a program needs it. Ops and their groups stay registered."""
    with _lock:
        for key, entry in _entries.items():
            _note_dropped(key, entry)
        _entries.clear()
        _memo.clear()
        _memo_of_key.clear()
        ops = [op for members in _groups.values()
               for m in members.values() for op in (r() for r in m.ops)
               if op is not None]
    for op in ops:
        op.forget_cached()


_serials = itertools.count(1)
# Marks the keys of ambiguous groups: a process that did not trace such a
# key refuses it instead of guessing which function it meant.
_PROCESS_TOKEN = secrets.token_hex(6)


def weak_ref_to(func):
    """A weak reference to `func`, or a strong one where Python allows no
    weak one: the registry must not keep functions (or ops) alive."""
    try:
        return weakref.ref(func)
    except TypeError:  # not weak-referenceable: keep it alive
        return lambda: func


def with_lead(key: str, lead_spec: str) -> str:
    """The key of `key`'s call with leading unit axes (`lead_spec`, from
    sharding_rules.Split.lead_spec) on its buffers: the same entry, but
    C++ drops the axes first. `key` itself when `lead_spec` is empty."""
    if not lead_spec:
        return key
    parsed = keys.split_key(key)
    if parsed is None:
        return key
    group_key, call, mark = parsed
    derived = f"{group_key}/{call}{lead_spec}" + (f"/{mark}" if mark else "")
    parsed = keys.parse_units(keys.spec_fields(lead_spec[1:]))
    units: tuple = parsed if any(parsed) else ()
    with _lock:
        entry = _entries.get(key)
    if entry is not None and isinstance(entry, CallableEntry):
        with _lock:
            known = _entries.get(derived)
            if known is None or not _alive(known):
                _store(derived, dataclasses.replace(entry, key=derived,
                                                    units=units))
    return derived


def with_slices(key: str, sliced) -> str:
    """The key of a sequential vmap's call of `key`'s op (callable/vmap.py):
    the same entry, but C++ calls func once per slice of the buffers
    `sliced` flags (keys.slices_spec). A key that already names slices (a
    vmap of a vmap) gets the new flags instead."""
    parsed = keys.split_key(key)
    if parsed is None:
        return key
    group_key, call, mark = parsed
    call = ";".join(p for p in call.split(";") if not p.startswith("slices="))
    flags = tuple(int(bool(f)) for f in sliced)
    derived = (f"{group_key}/{call}{keys.slices_spec(flags)}" +
               (f"/{mark}" if mark else ""))
    with _lock:
        entry = _entries.get(key)
        if entry is not None and isinstance(entry, CallableEntry):
            known = _entries.get(derived)
            if known is None or not _alive(known):
                _store(derived, dataclasses.replace(entry, key=derived,
                                                    slices=flags))
    return derived


# ---------------------------------------------------------------------------
# Registration (when an op is created) and keys (when it is traced).

def register_op(op: ops.Op, func, *, name: str | None, config: str,
                num_outputs: int, num_scratch: int = 0) -> str:
    """Records that `op` runs `func` under `config`; returns its group key.

    Creating an op is all a process needs to run a deserialised program that
    calls it: the program's key names this group and carries the call's
    shapes and dtypes.
    """
    if targets.backends_started():
        # JAX's backends started before this op existed (so the hook that
        # registers numbax's targets as a backend starts has already run, or
        # never could): register now, so that a deserialised or cached
        # program reaches numbax's handlers.
        targets.ensure_targets()
    else:
        # Not starting them here (that would come before a
        # jax.distributed.initialize() the program may still make), but
        # registering where XLA's handlers already exist (the CPU's, from
        # jaxlib's import): JAX versions without a backend-start hook (0.8,
        # 0.9, 0.11) then still reach numbax's handlers.
        targets.register_ready_platforms()
    group_key = f"{name or keys.base_name(func)}/{config}"
    with _lock:
        members = _groups.setdefault(group_key, {})
        member = members.get(id(func))
        if member is None or member.func_ref() is not func:
            member = Member(weak_ref_to(func), next(_serials), num_outputs,
                            num_scratch)
            members[id(func)] = member
            try:
                weakref.finalize(func, _forget, id(func), group_key)
            except TypeError:
                pass
        member.ops = [r for r in member.ops if r() is not None]
        member.ops.append(weakref.ref(op))
    return group_key


def _live(group_key: str) -> list:
    members = _groups.get(group_key, {})
    return [m for m in members.values() if m.func_ref() is not None]


def _forget(func_id: int, group_key: str | None = None) -> None:
    with _lock:
        for memo_key in [k for k in _memo if k[0] == func_id]:
            key = _memo.pop(memo_key)
            _memo_of_key.pop(key, None)
            _entries.pop(key, None)
        for key in [k for k, e in _entries.items() if e.func_id == func_id]:
            del _entries[key]
            _memo_of_key.pop(key, None)
        if group_key is not None:
            members = _groups.get(group_key)
            if members is not None:
                member = members.get(func_id)
                if member is not None and member.func_ref() is None:
                    del members[func_id]
                if not members:
                    del _groups[group_key]


def program_key(func, group_key: str, call: str,
                make_entry: Callable[[str], Any]) -> str:
    """The key a traced program names (func, call) by; registers its entry.

    Unique groups get the plain key ``group/call``, which any process that
    created the op resolves. When several live functions share the group
    (closures made by one factory, with no name=), the key also carries this
    process's mark: it resolves exactly here, and is refused elsewhere.
    """
    targets.ensure_targets()
    memo_key = (id(func), group_key, call)
    with _lock:
        key = _memo.get(memo_key)
        known = _entries.get(key) if key is not None else None
        if key is not None and known is not None:
            if _alive(known):
                _entries.move_to_end(key)
                return key
            # The op that traced it was collected, the function lives on (a
            # re-created op): the same key, now served by this op.
            entry = make_entry(key)
            entry.func_id = id(func)
            _store(key, entry, memo_key)
            return key
        key = f"{group_key}/{call}"
        member = _groups[group_key][id(func)]
        if len(_live(group_key)) > 1 or (
                key in _entries and _entries[key].func_id != id(func)):
            key += f"/{keys.AMBIGUOUS_MARK}{_PROCESS_TOKEN}.{member.serial}"
        entry = make_entry(key)
        entry.func_id = id(func)
        _store(key, entry, memo_key)
        return key


def _alive(entry) -> bool:
    if isinstance(entry, KernelEntry):
        return entry.owner_ref() is not None
    # A kernel op's simulator launcher (kernel/simulator.py) lives as long
    # as its op: dropped by clear_caches, it is made again when called.
    alive = getattr(entry.func_ref, "alive", None)
    if alive is not None:
        return alive()
    return entry.func_ref() is not None


def ambiguous_export_error(op: str, key: str,
                           name: str | None = None) -> ValueError:
    """Why a program naming `key` cannot be exported: the op's label `op`,
    and the name= it was given (None: its module and qualified name)."""
    group_key = keys.split_key(key)[0]
    if name is not None:
        cause = (f"several different functions in this process were given "
                 f"the same name={name!r} with the same configuration "
                 f"(op key '{group_key}')")
        fix = "Give each of them a name= of its own"
    else:
        cause = (f"several different functions in this process share the "
                 f"op key '{group_key}' (closures made by one factory, with "
                 "the same module, qualified name and configuration)")
        fix = ("Give each op its own name= (numba_cuda_callable(..., "
               "name='...') or numba_cuda_kernel(..., name='...'))")
    return ValueError(
        f"{op}: cannot export it: {cause}, so a program naming it could run "
        f"the wrong one in another process. {fix}, in this process and in "
        "the one that loads the program")


def _missing(key: str, kind: str, why: str = "") -> KeyError:
    maker = {"callable": "numba_cuda_callable",
             "numba_kernel": "numba_kernel"}.get(kind, "numba_cuda_kernel")
    return KeyError(
        f"numbax {kind} '{key}' is not registered in this process. {why}"
        f"Create the same op (numbax.{maker}(...) with the same function or "
        "name=, outs, scratch, capture and launch configuration; creating it "
        "is enough) before running a compiled or deserialised program that "
        "uses it, and keep it alive while the program may run; an op whose "
        "function was garbage-collected must be recreated too "
        "(docs/export.md)")


def _kind_of(key: str) -> str:
    """'kernel' for a numba_cuda_kernel's key, 'numba_kernel' for a
    numba_kernel's, else 'callable'."""
    parsed = keys.split_key(key)
    if parsed is not None and keys.config_of(parsed[0]).startswith("kernel;"):
        return "kernel"
    if parsed is not None and keys.config_of(parsed[0]).startswith(
            "cpu_kernel;"):
        return "numba_kernel"
    return "callable"


def _describe_others(group_key: str) -> str:
    identity = keys.identity_of(group_key)
    others = sorted(keys.config_of(g) for g in _groups
                    if keys.identity_of(g) == identity and g != group_key
                    and _live(g))
    if not others:
        return ""
    return (f"The program expects '{identity}' with {keys.config_of(group_key)}, "
            f"but the op of that name created here has "
            f"{' / '.join(others)}. ")


def _lookup(key: str, platform: str, kind: str = "callable"):
    """The entry of `key`: traced here, or built now from the op created here."""
    with _lock:
        entry = _entries.get(key)
        if entry is not None:
            _entries.move_to_end(key)
    if entry is not None and _alive(entry):
        return entry
    # Not traced here (a deserialised or cached program), or traced by an
    # op since collected: build the entry from the op created here.
    parsed = keys.split_key(key)
    if parsed is None:
        raise _missing(key, kind)
    group_key, call, mark = parsed
    kind = _kind_of(key)
    if mark is not None:
        token, _, serial = mark[1:].partition(".")
        with _lock:
            live = [m for m in _live(group_key) if str(m.serial) == serial]
        if token == _PROCESS_TOKEN and live:
            return _build_entry(key, group_key, call, live[0], kind, platform)
        if token != _PROCESS_TOKEN:
            raise KeyError(
                f"numbax op key '{key}' was made in a process where several "
                f"different functions shared '{group_key}' (closures made by "
                "one factory, with the same module, qualified name and "
                "configuration, or ops given the same name=), so it cannot "
                "say which one to run here. Give each op its own name= and "
                "export the program again (docs/export.md)")
        raise _missing(key, kind, "Its function was garbage-collected. ")
    with _lock:
        live = _live(group_key)
    if not live:
        raise _missing(key, kind, _describe_others(group_key))
    if len(live) > 1:
        # A program compiled here while one function had the group, whose
        # entry was dropped since: that function, not a guess.
        traced = [m for m in live if hash(key) in m.dropped]
        if len(traced) == 1:
            return _build_entry(key, group_key, call, traced[0], kind, platform)
        names = ", ".join(sorted({repr(m.func_ref()) for m in live}))
        raise KeyError(
            f"numbax op key '{key}' is ambiguous in this process: "
            f"{len(live)} different functions were created under "
            f"'{group_key}' ({names}), e.g. closures made by one factory or "
            "ops given the same name=, and a program's key cannot say which "
            "one it means. Give each op its own name= (here and in the "
            "process that exported the program)")
    return _build_entry(key, group_key, call, live[0], kind, platform)


def _build_entry(key, group_key, call, member, kind, platform):
    func = member.func_ref()
    op = member.live_op()
    if op is not None:
        # The op builds it from the call spec: shapes, and what shape
        # functions returned and the scalars where the op has them.
        entry = op.entry_for_call(key, call, platform)
    elif kind in ("kernel", "numba_kernel"):
        raise _missing(key, kind, "The op was garbage-collected. ")
    else:
        fields = keys.spec_fields(call)
        if "=fn" in keys.config_of(group_key) or "scalars" in fields:
            # Shapes from functions, or scalars: only the op knows what
            # its func is called with.
            raise _missing(key, kind, "Its op was garbage-collected. ")
        # A callable whose op was collected while its func lives on: the
        # key holds all the entry needs.
        avals = keys.parse_avals(fields.get("in", ""))
        entry = CallableEntry(key, weak_ref_to(func), len(avals),
                              member.num_outputs, member.num_scratch,
                              bfloat16=numba_bridge.has_bfloat16(
                                  [d for _, d in avals]) or "bfloat16" in
                              keys.config_of(group_key),
                              fast_launch=keys.spec_fields(
                                  keys.config_of(group_key)).get("fast") != "0",
                              aliases=keys.parse_aliases(fields),
                              units=keys.parse_units(fields))
    entry.func_id = id(func)
    with _lock:
        existing = _entries.get(key)
        if existing is not None and _alive(existing):
            return existing  # another thread built it meanwhile
        _store(key, entry)
        return entry


def _resolve_callable(key: str, platform: str):
    """Called by C++ at XLA's instantiate stage."""
    entry = _lookup(key, platform)
    # A kernel op's key resolves here too on the CPU (its simulator
    # launcher): errors name the kind of op the key belongs to.
    kind = _kind_of(key)
    if not isinstance(entry, CallableEntry):
        raise _missing(key, kind)
    func = entry.func_ref()  # a strong reference from here on
    if func is None:
        raise _missing(key, kind, "Its op was garbage-collected. "
                       if kind == "kernel" else
                       "Its function was garbage-collected. ")
    if platform == "cuda" and entry.bfloat16:
        numba_bridge.check_bfloat16_devices(f"numbax op '{key}'")
    if platform == "cpu" and not numba_bridge.simulator_enabled():
        raise RuntimeError(
            f"numbax op '{key}' was placed on JAX's CPU backend, which runs "
            "Numba kernels only through Numba's CUDA simulator: set "
            "NUMBA_ENABLE_CUDASIM=1 before numba is imported, or run the "
            "program on a GPU")
    if platform == "cpu":
        func = _one_simulated_launch_at_a_time(func)
    return (func, entry.num_inputs, entry.num_outputs, entry.num_scratch,
            entry.fast_launch and env.fast_launch_enabled(), entry.aliases,
            entry.name or None, *(entry.units or ((), ())),
            entry.slices or None)


# Numba's simulator runs one kernel launch at a time in the whole process
# (it swaps module globals and keeps the launch configuration on the kernel
# object), while XLA calls handlers from several threads at once: several
# CPU devices, or several Python threads. On the CPU every func therefore
# runs under this lock; on a GPU nothing is serialised.
_simulator_lock = threading.RLock()


def _one_simulated_launch_at_a_time(func):
    def run_in_simulator(*args):
        with _simulator_lock:
            return func(*args)
    run_in_simulator.__wrapped__ = func  # type: ignore[attr-defined]
    return run_in_simulator


def _resolve_kernel(key: str):
    """Called by C++ at XLA's instantiate stage: the LoadedKernel."""
    entry = _lookup(key, "cuda", "kernel")
    if not isinstance(entry, KernelEntry) or entry.owner_ref() is None:
        raise _missing(key, "kernel")
    return entry.resolve()


def _resolve_cpu_kernel(key: str):
    """Called by C++ at XLA's instantiate stage: a numba_kernel's site tuple
    (its compiled wrapper's address and what the handler needs to call it)."""
    entry = _lookup(key, "cpu", "numba_kernel")
    if not isinstance(entry, KernelEntry) or entry.owner_ref() is None:
        raise _missing(key, "numba_kernel")
    return entry.resolve()


def registry_size() -> tuple[int, int]:
    """(callables, kernels) registered now: for tests and diagnostics."""
    with _lock:
        kernels = sum(isinstance(e, KernelEntry) for e in _entries.values())
        return len(_entries) - kernels, kernels


# Last in the module (see targets.install): registration as JAX starts its
# backends, which reaches the resolvers above.
# "backend hook" (jax 0.10): a program deserialised in a process that only
# created its ops reaches numbax's handlers. Elsewhere ("plugin callback",
# "none": jax 0.8, 0.9, 0.11) JAX must have started (jax.devices()) before
# the ops are created, or one op must have been traced (docs/export.md).
BACKEND_REGISTRATION = targets.install(_resolve_callable, _resolve_kernel,
                                       _resolve_cpu_kernel)
