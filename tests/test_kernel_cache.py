"""numbax's entries in Numba's on-disk cache (src/numbax/compilers/kernel_cache.py).

A numba_cuda_kernel op whose kernel has ``cache=True`` leaves its cubin in
the kernel's Numba cache; a later process launches from it without Numba
compiling or loading anything, and an edit of the kernel's file invalidates
it with Numba's own entries. Each case runs fresh processes
(tests/kernel_cache_child.py) over a kernel module written here and a
NUMBA_CACHE_DIR of its own.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import SIMULATOR

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "kernel_cache_child.py")

KMOD = """
from numba import cuda


@cuda.jit(cache=True)
def affine(x, poison, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = {scale} * x[i] + 1.0


@cuda.jit
def uncached(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i]


@cuda.jit(cache=True)
def with_set(x, y):  # a frozenset constant: its order varies per process
    i = cuda.grid(1)
    if i < x.size and i in {{1, 2, 3}} and "b" in {{"a", "b", "c", "d"}}:
        y[i] = x[i]


FACTOR = {scale}


@cuda.jit(cache=True)
def by_global(x, poison, y):  # the same code in every module written here
    i = cuda.grid(1)
    if i < x.size:
        y[i] = FACTOR * x[i]


@cuda.jit(cache=True)
def scaled_by(x, a, y):  # a: a scalar parameter, traced under jit
    i = cuda.grid(1)
    if i < x.size:
        y[i] = a * x[i] + {scale}


def make_plain():
    @cuda.jit(cache=True)
    def made(x, poison, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = x[i]
    return made


def make_closure(scale):
    @cuda.jit(cache=True)
    def scaled(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = scale * x[i]
    return scaled
"""


def write_kernels(directory, scale, pad="", name="kmod"):
    (directory / f"{name}.py").write_text(
        textwrap.dedent(KMOD).format(scale=scale) + pad)


def run_child(mode, directory, *args, hash_seed=None):
    # No .pyc: an edit within the same second and of the same size would
    # otherwise run the old bytecode.
    env = dict(os.environ, NUMBA_CACHE_DIR=str(directory / "numba-cache"),
               PYTHONDONTWRITEBYTECODE="1")
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = str(hash_seed)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if mode not in ("gpu", "callable", "traced"):
        env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, CHILD, mode, str(directory), *map(str, args)],
        capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:]
                                            + proc.stderr[-4000:])
    return json.loads(lines[-1][len("RESULT "):])


def test_entries_round_trip_and_go_stale_with_the_source(tmp_path):
    """No GPU: the keying, what is cached, and invalidation by Numba's
    index (the kernel's file changed)."""
    write_kernels(tmp_path, "2.0")
    first = run_child("entries", tmp_path, "write")
    assert first["cache_of"] and not first["uncached_cache_of"], first
    assert not first["found_before"], first
    assert first["saved"] and first["saved_batched"], first
    # A kernel Numba sets up when loading it (NRT etc.) gets no entry.
    assert not first["saved_setup"], first
    assert first["found"] and first["cubin"] == "\x7fELF-not-really", first
    assert first["same_object"], first
    assert first["entry"] == "_Z6affine" and first["axes_read"] == [0], first
    assert first["batched_cubin"] == "batched", first
    assert not first["other_types"] and not first["other_kind"], first
    assert not first["other_capability"], first
    assert not first["other_toolkit"], first
    assert not first["closure_cache_of"], first  # closures get no entries

    again = run_child("entries", tmp_path)  # a fresh process reads them
    assert again["found"] and again["batched_cubin"] == "batched", again

    write_kernels(tmp_path, "2.0", pad="\n# edited\n")  # the file changed
    stale = run_child("entries", tmp_path)
    assert not stale["found"] and stale["batched_cubin"] is None, stale


def test_keys_are_the_same_in_every_process(tmp_path):
    """A key found at trace time must be the key written after Numba
    compiled, in another process: not moved by reference counts or by
    string hashing (a frozenset constant's order)."""
    write_kernels(tmp_path, "2.0")
    first = run_child("key", tmp_path, hash_seed=1)["keys"]
    second = run_child("key", tmp_path, hash_seed=2)["keys"]
    assert first == second


def test_an_entry_whose_key_differs_is_a_miss(tmp_path):
    """Two writers racing over the index could leave a key naming another
    entry's data: each data file holds its key, checked on load."""
    write_kernels(tmp_path, "2.0")
    got = run_child("crossed", tmp_path)
    assert got == {"f32": True, "f64": False}, got


def test_broken_or_unwritable_caches_are_misses(tmp_path):
    write_kernels(tmp_path, "2.0")
    got = run_child("hostile", tmp_path)
    assert got["saved"], got
    assert not got["corrupt_data"] and not got["truncated_index"], got
    if os.geteuid() != 0:  # root writes into a read-only directory anyway
        assert not got["saved_read_only"], got


def test_a_garbage_index_is_rebuilt_by_the_next_save(tmp_path):
    """An index file that is not an index made every
    save fail too (logged at DEBUG only), so the kernel never warm-started
    again. The next save rebuilds it (with a warning naming the file), and
    later loads hit."""
    write_kernels(tmp_path, "2.0")
    got = run_child("garbage_index", tmp_path)
    assert got["first_saved"], got
    for name in ("bytes", "truncated", "header_then_garbage", "wrong_shape"):
        assert got[name] == {"miss": True, "saved": True, "cubin": name,
                             "has_entry": True}, (name, got)
    assert len(got["warnings"]) == 4, got
    for message in got["warnings"]:
        assert "kmod.affine" in message and ".numbax.nbi" in message, message
        assert "rebuilt" in message, message
    again = run_child("entries", tmp_path)  # another process reads it
    assert again["found_before"] and again["cubin"] == "wrong_shape", again


def test_a_held_cache_lock_bounds_the_save(tmp_path):
    """The writer's file lock waited without a bound for
    another process holding it. It waits LOCK_WAIT_S, then skips the save
    (the kernel still runs, compiled by Numba), warning once; once the lock
    is free, saves write again."""
    write_kernels(tmp_path, "2.0")
    got = run_child("locked", tmp_path)
    assert got["holder_still_running"], got  # the save did not outwait it
    assert not got["saved_while_locked"], got
    assert not got["saved_again_while_locked"], got
    (warning,) = got["warnings"]
    assert "kmod.affine" in warning and ".numbax.lock" in warning, warning
    assert "LOCK_WAIT_S" in warning and "NUMBA_CACHE_DIR" in warning, warning
    assert got["saved_after"] and got["cubin_after"] == "after", got


def test_an_edited_and_reloaded_kernel_misses_in_the_same_process(tmp_path):
    write_kernels(tmp_path, "2.0")
    got = run_child("reload", tmp_path)
    assert got == {"first": True, "after_edit": False}, got


@pytest.mark.gpu
def test_warm_start_of_a_traced_scalar_kernel(tmp_path, gpu_only):
    """A jitted op with a traced scalar launches the generated kernel that
    reads it: the first process compiles it (and the body) through Numba
    and writes numbax's entries, the second loads both from them, with
    correct results for every value and one trace."""
    write_kernels(tmp_path, "1.0")
    cold = run_child("traced", tmp_path, 1.0)
    assert cold["ok"] and cold["traces"] == 1, cold
    assert cold["numba_overloads"] == 1, cold
    assert cold["generated"] == 1 and cold["generated_overloads"] == 1, cold
    warm = run_child("traced", tmp_path, 1.0)
    assert warm["ok"] and warm["traces"] == 1, warm
    assert warm["numba_overloads"] == 0, warm
    assert warm["generated"] == 1 and warm["generated_overloads"] == 0, warm


@pytest.mark.gpu
def test_warm_start_launches_without_numba(tmp_path, gpu_only):
    """The first process compiles through Numba and writes numbax's
    entries; the second launches the op and its folded vmap from them
    (Numba compiles and loads nothing), with correct results; after an
    edit of the kernel the entries are stale and the new code runs."""
    write_kernels(tmp_path, "2.0")
    cold = run_child("gpu", tmp_path, 2.0)
    assert cold["plain_ok"] and cold["vmap_ok"] and cold["folds"], cold
    assert cold["numba_overloads"] == 1, cold
    assert cold["batched_kernels"] == 1 and cold["batched_overloads"] == 1, cold

    warm = run_child("gpu", tmp_path, 2.0)
    assert warm["plain_ok"] and warm["vmap_ok"] and warm["folds"], warm
    assert warm["numba_overloads"] == 0, warm
    assert warm["batched_kernels"] == 1 and warm["batched_overloads"] == 0, warm

    write_kernels(tmp_path, "3.0")
    edited = run_child("gpu", tmp_path, 3.0)
    assert edited["plain_ok"] and edited["vmap_ok"], edited
    assert edited["numba_overloads"] == 1, edited


def test_funcs_launches_get_plans_from_entries_only_where_numba_agrees(
        tmp_path):
    write_kernels(tmp_path, "2.0")
    write_kernels(tmp_path, "3.0", name="kmod2")
    got = run_child("plans", tmp_path)
    assert got["types"] == ["array(float32, 1d, C)"] * 3, got
    assert got["before"] is None and got["saves"] == 1, got
    # (function, grid, block, dynamic shared memory, cooperative, packing)
    assert got["plan"] == [1, [4, 1, 1], [256, 1, 1], 0, False, "AAA"], got
    assert got["keeps_entry"], got
    for refused in ("int_arg", "big_shared", "with_overload", "uncached",
                    "cannot_compile"):
        assert got[refused] is None, (refused, got)
    assert got["other_overload"], got
    assert got["factory_images"] == 1, got
    # Equal keys (the same code reading a global of its own module), other
    # code: each module's kernel gets its own.
    assert got["same_code_other_globals"] == ["two", "three"], got


@pytest.mark.gpu
def test_funcs_first_launch_in_a_warm_process_skips_numba(tmp_path, gpu_only):
    """A plain callable's func launching a cache=True kernel: the first
    process launches through Numba and writes numbax's entry; the next
    launches from it (Numba compiles and loads nothing), correctly, unless
    the callable captures; an entry the kernel op wrote serves func's
    launch too."""
    write_kernels(tmp_path, "2.0")
    cold = run_child("callable", tmp_path, 2.0)
    assert cold["ok"] and cold["numba_overloads"] == 1, cold
    assert cold["cached_plans"] == 0 and cold["new_plans"] == 1, cold
    warm = run_child("callable", tmp_path, 2.0)
    assert warm["ok"] and warm["numba_overloads"] == 0, warm
    assert warm["cached_plans"] == 1 and warm["new_plans"] == 0, warm
    assert warm["fast_launches"] == 2, warm
    # capture=True: its warm-up has Numba load the kernel (its recording
    # call could not), so no cached plan, and the graph records and replays;
    # also after a plain callable in the same process launched the kernel
    # from its entry (the capture's warm-up records Numba's plan again).
    captured = run_child("callable", tmp_path, 2.0, "capture")
    assert captured["ok"] and captured["cached_plans"] == 0, captured
    assert captured["numba_overloads"] == 1, captured
    assert captured["graphs"] >= 1, captured  # recorded (per buffer set)
    both = run_child("callable", tmp_path, 2.0, "plain", "capture")
    assert both["ok"] and both["cached_plans"] == 1, both
    assert both["numba_overloads"] == 1 and both["graphs"] >= 1, both

    write_kernels(tmp_path, "3.0")  # stale: Numba again, the new code
    edited = run_child("callable", tmp_path, 3.0)
    assert edited["ok"] and edited["cached_plans"] == 0, edited
    assert edited["numba_overloads"] == 1, edited

    write_kernels(tmp_path, "4.0")
    assert run_child("gpu", tmp_path, 4.0)["plain_ok"]  # the op's entry
    shared = run_child("callable", tmp_path, 4.0)
    assert shared["ok"] and shared["cached_plans"] == 1, shared
    assert shared["numba_overloads"] == 0, shared


def test_simulator_kernels_have_no_entries():
    """The simulator's kernels are Python: nothing to cache."""
    if not SIMULATOR:
        pytest.skip("runs under Numba's CUDA simulator")
    from numba import cuda

    from numbax.compilers import kernel_cache

    @cuda.jit
    def k(x):
        pass
    assert kernel_cache.cache_of(k) is None
