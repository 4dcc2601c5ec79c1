"""Experiment: numbax parallel='xla' against prange and the serial kernel,
alone, 10 ms of quiet before each sample (as the CPU suite), 8 rounds of the
median of 5 calls; run once per NUMBAX_CPU_POOL_SPIN_US value."""
import time, statistics, numpy as np, jax, jax.numpy as jnp, numbax, sys
from numbax.bench import cpu
ks = cpu.kernels()
for n in (1 << 22, 1 << 20):
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    x = jax.device_put(np.random.rand(n).astype(np.float32))
    fns = {"serial": jax.jit(numbax.numba_kernel(ks["affine"], spec)),
           "xla": jax.jit(numbax.numba_kernel(ks["affine_range"], spec, parallel="xla", launch_dims=n)),
           "prange": jax.jit(numbax.numba_kernel(ks["affine_prange"], spec))}
    for f in fns.values(): f(x).block_until_ready()
    s = {k: [] for k in fns}
    for r in range(8):
        for k, f in fns.items():
            time.sleep(0.01)
            ts = []
            for _ in range(5):
                t = time.perf_counter(); f(x).block_until_ready(); ts.append((time.perf_counter()-t)*1e6)
            s[k].append(statistics.median(ts))
    m = {k: statistics.median(v) for k, v in s.items()}
    print(n, {k: round(v) for k, v in m.items()}, "ratio", round((m["serial"]/m["xla"])/(m["serial"]/m["prange"]), 2), flush=True)
