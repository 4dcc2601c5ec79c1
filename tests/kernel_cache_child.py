"""A fresh process for tests/test_kernel_cache.py.

    python tests/kernel_cache_child.py gpu DIR SCALE       numbax ops on a GPU
    python tests/kernel_cache_child.py callable DIR SCALE [MODE ...]  callables
    python tests/kernel_cache_child.py traced DIR SCALE    a traced scalar
    python tests/kernel_cache_child.py entries DIR         numbax's entries, no GPU
    python tests/kernel_cache_child.py plans DIR           func's cached plans, no GPU

DIR holds the kernel module (kmod.py, written by the test); NUMBA_CACHE_DIR
comes from the environment. `gpu` runs a numba_cuda_kernel op, plain and
vmapped (one folded launch), on fresh random data over poisoned outputs,
checks both against numpy (y = SCALE * x + 1), and reports whether Numba
compiled or loaded anything (its dispatchers' overloads). `entries` writes
and reads numbax's cache entries through Numba's cache object with a fake
compiled kernel (no GPU: the compute capability is given). Prints one line
``RESULT {json}``.
"""

import json
import os
import sys


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def gpu(scale: float):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kmod
    import numbax

    rng = np.random.default_rng()
    n, b = 1000, 8
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    # Output aliased to a NaN-filled input: an element left unwritten shows.
    op = numbax.numba_cuda_kernel(kmod.affine, spec, launch_dims=n,
                                  input_output_aliases={1: 0})
    x = rng.standard_normal(n).astype(np.float32)
    got = np.asarray(jax.jit(op)(x, jnp.full(n, jnp.nan, jnp.float32)))
    xb = rng.standard_normal((b, n)).astype(np.float32)
    gotb = np.asarray(jax.jit(jax.vmap(op))(
        xb, jnp.full((b, n), jnp.nan, jnp.float32)))
    decision = op.vmap_fold(x, x)  # the inputs of one unbatched call
    batched = list(op.fold_cache.batched_kernels.values())
    # The kernel computes in float64 and stores float32: so does numpy here.
    want = (scale * x.astype(np.float64) + 1).astype(np.float32)
    wantb = (scale * xb.astype(np.float64) + 1).astype(np.float32)
    report(
        plain_ok=bool(np.allclose(got, want, rtol=1e-6, atol=1e-6)),
        vmap_ok=bool(np.allclose(gotb, wantb, rtol=1e-6, atol=1e-6)),
        plain_err=float(np.nanmax(np.abs(got - want))),
        unwritten=int(np.isnan(got).sum() + np.isnan(gotb).sum()),
        folds=bool(decision.folds),
        numba_overloads=len(kmod.affine.overloads),
        batched_overloads=sum(len(k.overloads) for k in batched),
        batched_kernels=len(batched))


def traced(scale: float):
    """A numba_cuda_kernel op jitted with a traced scalar (a new value per
    call), checked against numpy; reports the traces and what Numba
    compiled or loaded (the kernel's and the generated kernel's
    overloads)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kmod
    import numbax

    rng = np.random.default_rng()
    n = 1000
    op = numbax.numba_cuda_kernel(
        kmod.scaled_by, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n)
    f = jax.jit(op)
    results = []
    for a in rng.standard_normal(4).astype(np.float32):
        x = rng.standard_normal(n).astype(np.float32)
        got = np.asarray(f(x, a))
        # float32 product, float64 sum, float32 store: as the kernel does.
        want = ((a * x).astype(np.float64) + scale).astype(np.float32)
        results.append(bool(np.allclose(got, want, rtol=1e-6, atol=1e-6)))
    generated = list(op.fold_cache.batched_kernels.values())
    report(ok=all(results), traces=f._cache_size(),
           numba_overloads=len(kmod.scaled_by.overloads),
           generated=len(generated),
           generated_overloads=sum(len(k.overloads) for k in generated))


def callable_op(scale: float, modes: list):
    """Plain callables (and, per `modes`, capture=True ones, in that order,
    in this process) whose func launches the cached kernel: checked against
    numpy over a poisoned output; reports whether Numba compiled or loaded
    it (its overloads) and how the launches went (bridge counters)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kmod
    import numbax

    rng = np.random.default_rng()
    n = 1000

    def func(x, poison, y, stream):
        kmod.affine[(n + 255) // 256, 256, stream](x, poison, y)

    results = []
    for mode in modes:
        capture = mode == "capture"
        op = jax.jit(numbax.numba_cuda_callable(
            func, jax.ShapeDtypeStruct((n,), jnp.float32),
            input_output_aliases={1: 0}, capture=capture))
        # Plain: the second call launches from the stored plan. Captured:
        # the first call warms up, the second records a graph, the third
        # replays it.
        for _ in range(3 if capture else 2):
            x = rng.standard_normal(n).astype(np.float32)
            got = np.asarray(op(x, jnp.full(n, jnp.nan, jnp.float32)))
            want = (scale * x.astype(np.float64) + 1).astype(np.float32)
            results.append(
                bool(np.allclose(got, want, rtol=1e-6, atol=1e-6))
                and not np.isnan(got).any())
    counters = numbax.bridge_counters()
    report(ok=all(results), numba_overloads=len(kmod.affine.overloads),
           cached_plans=counters["cached_launch_plans"],
           fast_launches=counters["fast_launches"],
           new_plans=counters["fallback_new_plan"],
           graphs=counters["graph_misses"])


def plans():
    """numba_cuda_launch's cached plans over a fake GPU: none before an entry
    exists, one after _save_cache_entry wrote it, none where Numba's dispatch could
    pick another kernel (an overload exists, other argument types, more
    dynamic shared memory than a function allows unprepared)."""
    from numba import types

    import kmod
    from numbax.compilers import numba_cuda_launch as fl
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)

    class Arr:
        ndim = 1
        _numba_type_ = types.float32[::1]

    class Cfg:
        dispatcher = kmod.affine
        griddim, blockdim, sharedmem = (4, 1, 1), (256, 1, 1), 0
        pre_launch_callbacks: list = []

    args, ours = (Arr(), Arr(), Arr()), (0, 1, 2)
    argtypes = fl._exact_types(kmod.affine, args)
    out = {"types": [str(t) for t in argtypes],
           "before": fl._cached_plan(Cfg, args, ours, 0)}
    saves = []
    real_save = kc.save
    kc.save = lambda *a, **k: saves.append(1) or real_save(*a, **k)
    fl._save_cache_entry(kmod.affine, argtypes, args, _Compiled())
    fl._save_cache_entry(kmod.affine, argtypes, args, _Compiled())  # known: no write
    out["saves"] = len(saves)
    kc.save = real_save
    plan = fl._cached_plan(Cfg, args, ours, 0)
    out["plan"] = None if plan is None else list(plan[:6])
    out["keeps_entry"] = plan is not None and isinstance(plan[6], kc.CachedKernel)
    with_int = (Arr(), Arr(), Arr(), 3)
    out["int_arg"] = fl._cached_plan(Cfg, with_int, ours + (-1,), 0)
    Cfg.sharedmem = 64 * 1024
    out["big_shared"] = fl._cached_plan(Cfg, args, ours, 0)
    Cfg.sharedmem = 0
    kmod.affine.overloads[argtypes] = object()
    out["with_overload"] = fl._cached_plan(Cfg, args, ours, 0)
    del kmod.affine.overloads[argtypes]
    other = (types.float64[::1],) * 3
    kmod.affine.overloads[other] = object()  # Numba still compiles ours
    out["other_overload"] = fl._cached_plan(Cfg, args, ours, 0) is not None
    del kmod.affine.overloads[other]
    kmod.affine._can_compile = False  # explicit signatures: Numba converts
    out["cannot_compile"] = fl._cached_plan(Cfg, args, ours, 0)
    kmod.affine._can_compile = True
    # A kernel a factory makes per call (no closure): one library for all.
    made = [kmod.make_plain() for _ in range(3)]
    for k in made:
        fl._save_cache_entry(k, argtypes, args, _Compiled())
    images = {id(kc.load(k, (), argtypes)._image) for k in made}
    out["factory_images"] = len(images)
    import kmod2
    pair = (kmod.by_global, kmod2.by_global)
    arch = kc.architecture((9, 0))
    assert len({kc._key(k, kc.cache_of(k), (), argtypes, arch)
                for k in pair}) == 1, "the keys differ: the test tests nothing"
    for k, cubin in zip(pair, (b"two", b"three")):
        assert kc.save(k, (), argtypes, _Compiled(cubin=cubin))
    out["same_code_other_globals"] = [
        kc.load(k, (), argtypes)._image.cubin.decode() for k in pair]
    Cfg.dispatcher = kmod.uncached
    out["uncached"] = fl._cached_plan(Cfg, args, ours, 0)
    report(**out)


class _Library:
    def __init__(self, cubin=b"\x7fELF-not-really", setup=()):
        self._entry_name = "_Z6affine"
        self._ensure_cc = lambda cc: (9, 0, "a")
        self._setup_functions = list(setup)
        self._linking_files = set()
        self.referenced_objects = {}
        self._cubin = cubin

    def get_cubin(self, cc=None):
        return self._cubin


class _Compiled:
    cooperative = False
    debug = False

    def __init__(self, **kw):
        self._codelibrary = _Library(**kw)


def _no_gpu(kc):
    """What needs a GPU or the toolkit, faked: the device's capability,
    NVRTC's version, and the driver's load of the cubin."""
    from numbax.compilers import cubin
    kc.current_capability = lambda: (9, 0)
    kc._toolkit_version = lambda: (13, 0)
    cubin.CubinKernel.kernel_handle = lambda self: 1


def entries():
    from numba import types

    import kmod
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)
    f32 = (types.float32[::1], types.float32[::1])
    f64 = (types.float64[::1], types.float64[::1])
    k = kmod.affine
    out = {"cache_of": kc.cache_of(k) is not None,
           "uncached_cache_of": kc.cache_of(kmod.uncached) is not None,
           "found_before": kc.load(k, (), f32, None) is not None}
    if sys.argv[3:] == ["write"]:
        out["saved"] = kc.save(k, (), f32, _Compiled(),
                               lambda: ({0}, None))
        out["saved_batched"] = kc.save(k, ("batched", 2), f32,
                                       _Compiled(cubin=b"batched"))
        out["saved_setup"] = kc.save(k, (), f64, _Compiled(setup=[print]))
    hit = kc.load(k, (), f32)
    out["found"] = hit is not None
    # Read once per process: one library however often it is traced.
    out["same_object"] = hit is not None and kc.load(k, (), f32) is hit
    if hit is not None:
        out["cubin"] = hit._image.cubin.decode("latin-1")
        out["entry"] = hit._image.entry
        out["axes_read"] = sorted(hit.axes_read)
    batched = kc.load(k, ("batched", 2), f32)
    out["batched_cubin"] = None if batched is None else batched._image.cubin.decode()
    out["other_types"] = kc.load(k, (), f64) is not None
    out["other_kind"] = kc.load(k, ("batched", 3), f32) is not None
    out["closure_cache_of"] = kc.cache_of(kmod.make_closure(2.0)) is not None
    kc.current_capability = lambda: (8, 0)
    out["other_capability"] = kc.load(k, (), f32) is not None
    kc.current_capability = lambda: (9, 0)
    kc._toolkit_version = lambda: (13, 1)
    out["other_toolkit"] = kc.load(k, (), f32) is not None
    report(**out)


def key():
    """numbax's key for two kernels, after adding references to their code's
    constants (marshal's bytes would change with them)."""
    from numba import types

    import kmod
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)
    f32 = (types.float32[::1], types.float32[::1])
    arch = kc.architecture((9, 0))
    keys = []
    for k in (kmod.affine, kmod.with_set):
        cache = kc.cache_of(k)
        before = kc._key(k, cache, (), f32, arch)
        held = [list(k.py_func.__code__.co_consts) for _ in range(50)]
        keys.append(repr(before))
        assert kc._key(k, cache, (), f32, arch) == before, "key moved"
        del held
    report(keys=keys)


def hostile():
    """A corrupt data file, a truncated index, and a cache directory no
    one may write: a miss, never an error."""
    import stat

    from numba import types

    import kmod
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)
    f32 = (types.float32[::1], types.float32[::1])
    k = kmod.affine
    cache = kc.cache_of(k)
    out = {"saved": kc.save(k, (), f32, _Compiled())}
    index = kc._index(cache)
    (data_name,) = index._load_index().values()
    data_path = os.path.join(cache.cache_path, data_name)
    with open(data_path, "wb") as f:
        f.write(b"not a pickle")
    kc._loaded.clear()
    out["corrupt_data"] = kc.load(k, (), f32) is not None
    with open(index._index_path, "wb") as f:
        f.write(b"\x80")
    out["truncated_index"] = kc.load(k, (), f32) is not None
    os.chmod(cache.cache_path, stat.S_IRUSR | stat.S_IXUSR)
    try:
        out["saved_read_only"] = kc.save(k, (), f32, _Compiled())
    finally:
        os.chmod(cache.cache_path, stat.S_IRWXU)
    report(**out)


def crossed():
    """An index whose key names another entry's data file (writers that
    raced): the entry is a miss, never the other kernel's code."""
    from numba import types

    import kmod
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)
    f32 = (types.float32[::1], types.float32[::1])
    f64 = (types.float64[::1], types.float64[::1])
    k = kmod.affine
    cache = kc.cache_of(k)
    assert kc.save(k, (), f32, _Compiled(cubin=b"float32 code"))
    index = kc._index(cache)
    entries = index._load_index()
    (data_name,) = entries.values()
    entries[kc._key(k, cache, (), f64, kc.architecture((9, 0)))] = data_name
    index._save_index(entries)
    kc._loaded.clear()
    report(f32=kc.load(k, (), f32) is not None,
           f64=kc.load(k, (), f64) is not None)


def reload_edited(directory):
    """In one process: an entry read, then the kernel's file edited (same
    size) and its module reloaded: the new kernel does not get the old
    entry."""
    import importlib

    from numba import types

    import kmod
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)
    f32 = (types.float32[::1], types.float32[::1])
    assert kc.save(kmod.affine, (), f32, _Compiled(cubin=b"scale 2"))
    first = kc.load(kmod.affine, (), f32)
    path = os.path.join(directory, "kmod.py")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("2.0 *", "3.0 *"))
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    importlib.reload(kmod)
    report(first=first is not None,
           after_edit=kc.load(kmod.affine, (), f32) is not None)


class _Records:
    """numbax's log records at WARNING and above, as text."""

    def __init__(self):
        import logging

        self.messages = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: self.messages.append(
            record.getMessage())
        logging.getLogger("numbax").addHandler(handler)


def garbage_index():
    """An index file that is not an index (garbage bytes, a truncated
    pickle, the right header over garbage, a pickle of the wrong shape):
    the next save rebuilds it, and a later load hits."""
    import pickle

    import numba
    from numba import types

    import kmod
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)
    records = _Records()
    f32 = (types.float32[::1], types.float32[::1])
    k = kmod.affine
    cache = kc.cache_of(k)
    header = pickle.dumps(numba.__version__, protocol=-1)
    garbage = {"bytes": b"this is not an index",
               "truncated": b"\x80",
               "header_then_garbage": header + b"junk",
               "wrong_shape": header + pickle.dumps(["not", "a", "pair"])}
    out = {"first_saved": kc.save(k, (), f32, _Compiled(cubin=b"first"))}
    index = kc._index(cache)
    for name, text in garbage.items():
        with open(index._index_path, "wb") as f:
            f.write(text)
        kc._loaded.clear()
        kc._present.clear()
        miss = kc.load(k, (), f32) is None
        saved = kc.save(k, (), f32, _Compiled(cubin=name.encode()),
                        lambda: ({0}, None))
        kc._loaded.clear()
        kc._present.clear()
        hit = kc.load(k, (), f32)
        out[name] = {"miss": miss, "saved": saved,
                     "cubin": None if hit is None else hit._image.cubin.decode(),
                     "has_entry": kc.has_entry(k, (), f32)}
    out["warnings"] = records.messages
    report(**out)


_HOLD_LOCK = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def locked():
    """The cache's lock held by another process: save gives up after
    LOCK_WAIT_S (False, never raising), warns once, and writes again once
    the lock is free."""
    import subprocess

    from numba import types

    import kmod
    from numbax.compilers import kernel_cache as kc

    _no_gpu(kc)
    records = _Records()
    f32 = (types.float32[::1], types.float32[::1])
    f64 = (types.float64[::1], types.float64[::1])
    k = kmod.affine
    cache = kc.cache_of(k)
    cache._impl.locator.ensure_cache_path()
    path = os.path.join(cache.cache_path,
                        cache._impl.filename_base + ".numbax.lock")
    # Held far longer than the bound: a save that waited for the holder
    # would return True (after it exits), not False.
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, path, "30"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        kc.LOCK_WAIT_S = 0.2
        out = {"saved_while_locked": kc.save(k, (), f32, _Compiled()),
               "saved_again_while_locked": kc.save(k, (), f64, _Compiled()),
               "holder_still_running": holder.poll() is None,
               "warnings": list(records.messages)}
    finally:
        holder.kill()
        holder.wait()
    out["saved_after"] = kc.save(k, (), f32, _Compiled(cubin=b"after"))
    kc._loaded.clear()
    hit = kc.load(k, (), f32)
    out["cubin_after"] = None if hit is None else hit._image.cubin.decode()
    report(**out)


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[2])
    if sys.argv[1] == "gpu":
        gpu(float(sys.argv[3]))
    elif sys.argv[1] == "traced":
        traced(float(sys.argv[3]))
    elif sys.argv[1] == "callable":
        callable_op(float(sys.argv[3]), sys.argv[4:] or ["plain"])
    elif sys.argv[1] == "plans":
        plans()
    elif sys.argv[1] == "key":
        key()
    elif sys.argv[1] == "hostile":
        hostile()
    elif sys.argv[1] == "crossed":
        crossed()
    elif sys.argv[1] == "reload":
        reload_edited(sys.argv[2])
    elif sys.argv[1] == "garbage_index":
        garbage_index()
    elif sys.argv[1] == "locked":
        locked()
    else:
        entries()
