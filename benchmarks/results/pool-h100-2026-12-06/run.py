"""Experiment only: scheduling policies for parallel='xla' on XLA's pool."""
import ctypes, os, resource, statistics, subprocess, sys, time
import numpy as np
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import numbax
from numbax.bench import cpu

here = os.path.dirname(os.path.abspath(__file__))
so = "/tmp/pool_exp.so"
subprocess.check_call(["g++", "-O3", "-march=native", "-shared", "-fPIC", "-std=c++17",
                       "-I", jax.ffi.include_dir(), os.path.join(here, "pool_exp.cc"), "-o", so])
lib = ctypes.cdll.LoadLibrary(so)
jax.ffi.register_ffi_target("pool_exp", jax.ffi.pycapsule(lib.PoolExp), platform="cpu")
jax.ffi.register_ffi_target("pool_threads", jax.ffi.pycapsule(lib.PoolThreads), platform="cpu")
threads = int(jax.jit(lambda: jax.ffi.ffi_call("pool_threads", jax.ShapeDtypeStruct((1,), jnp.int32))())()[0])
print("cores", os.cpu_count(), "XLA pool threads", threads, "jax", jax.__version__, flush=True)

VARIANTS = {  # name: (cpw, helpers, fanout, wait)
    "flat4_all_cv": (4, -1, 0, 0),   # numbax today
    "flat4_all_spin": (4, -1, 0, 1),
    "flat4_m1_cv": (4, -2, 0, 0),
    "flat4_m1_spin": (4, -2, 0, 1),
    "flat1_m1_spin": (1, -2, 0, 1),
    "flat2_m1_spin": (2, -2, 0, 1),
    "flat8_m1_spin": (8, -2, 0, 1),
    "tree4_m1_spin": (4, -2, 1, 1),
    "tree4_all_cv": (4, -1, 1, 0),
    "half4_spin": (4, max(1, threads // 2) - 1, 0, 1),
}
ks = cpu.kernels()
only = sys.argv[1].split(",") if len(sys.argv) > 1 else None
for n in (1 << 22, 1 << 20):
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    x = jax.device_put(np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32))
    want = 2 * np.asarray(x) + 1
    fns = {
        "serial": jax.jit(numbax.numba_kernel(ks["affine"], spec)),
        "numbax_xla": jax.jit(numbax.numba_kernel(ks["affine_range"], spec, parallel="xla", launch_dims=n)),
        "prange": jax.jit(numbax.numba_kernel(ks["affine_prange"], spec)),
        "jnp": jax.jit(lambda v: 2 * v + jnp.float32(1)),
    }
    for name, (cpw, h, f, w) in VARIANTS.items():
        fns[name] = jax.jit(lambda v, a=(cpw, h, f, w): jax.ffi.ffi_call("pool_exp", spec)(
            v, cpw=np.int64(a[0]), helpers=np.int64(a[1]), fanout=np.int64(a[2]), wait_mode=np.int64(a[3])))
    if only:
        fns = {k: v for k, v in fns.items() if k in only or k in ("serial", "prange", "numbax_xla")}
    for name, f in fns.items():
        got = np.asarray(f(x))
        assert np.allclose(got, want), name
    import numba
    print("numba threading layer", numba.threading_layer(), "NUMBA_NUM_THREADS", numba.config.NUMBA_NUM_THREADS, flush=True)
    samples = {k: [] for k in fns}
    faults = {}
    names = list(fns)
    for r in range(9):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            f = fns[name]
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            ts = []
            for _ in range(9):
                t = time.perf_counter(); f(x).block_until_ready(); ts.append((time.perf_counter() - t) * 1e6)
            faults[name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 9
            if r:
                samples[name].append(statistics.median(ts))
    base = statistics.median(samples["serial"])
    pr = base / statistics.median(samples["prange"])
    print(f"n={n}: serial {base:.0f} us; prange speed-up {pr:.2f}x", flush=True)
    for name in names:
        m = statistics.median(samples[name])
        print(f"  {name:16s} {m:8.1f} us  speed-up {base/m:5.2f}x  vs prange's {base/m/pr:4.2f}  "
              f"faults/call {faults[name]:.0f}  spread {min(samples[name]):.0f}-{max(samples[name]):.0f}", flush=True)

# --- where the time goes: one variant with timestamps
jax.ffi.register_ffi_target("pool_exp_stats", jax.ffi.pycapsule(lib.PoolExpStats), platform="cpu")
for n in (1 << 22, 1 << 20):
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    x = jax.device_put(np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32))
    for name in ("flat4_all_cv", "flat4_m1_spin", "tree4_m1_spin"):
        cpw, h, f, w = VARIANTS[name]
        fn = jax.jit(lambda v: jax.ffi.ffi_call("pool_exp_stats", (spec, jax.ShapeDtypeStruct((64,), jnp.int64)))(
            v, cpw=np.int64(cpw), helpers=np.int64(h), fanout=np.int64(f), wait_mode=np.int64(w)))
        rows = []
        for i in range(60):
            y, st = fn(x); st = np.asarray(st)
            if i >= 10: rows.append(st)
        rows = np.array(rows)
        k = int(np.median(rows[:, 3]))
        starts = np.sort(rows[:, 4:4 + k], axis=1) / 1e3
        print(f"n={n} {name}: schedule loop {np.median(rows[:,0])/1e3:.1f} us, caller done {np.median(rows[:,1])/1e3:.1f}, "
              f"all done {np.median(rows[:,2])/1e3:.1f}; tasks started before return {k}; "
              f"their start (median over calls) first {np.median(starts[:,0]):.1f} median {np.median(starts[:, k//2]):.1f} last {np.median(starts[:,-1]):.1f} us", flush=True)
