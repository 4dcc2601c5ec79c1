"""One captured op, in place on donated state: a graph hit against a re-bound replay.

The same jitted program runs both ways. "hit": one state, y = op(y), so
XLA hands the op the same buffer every call. "rebind": two states used in
turn, so every call sees the other buffer than the call before and the
op's graph is re-bound. Interleaved rounds; numbax's counters say which
path each call took.
"""
import statistics, time
import jax, jax.numpy as jnp, numpy as np
from numba import cuda
import numbax

n = 4096

@cuda.jit
def relax(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 0.5 * x[i] + 1.0

def relax_op(x, out, stream):
    relax[(n + 127) // 128, 128, stream](x, out)

op = jax.jit(numbax.numba_cuda_callable(
    relax_op, outs=jax.ShapeDtypeStruct((n,), jnp.float32), capture=True,
    input_output_aliases={0: 0}), donate_argnums=0)
rng = np.random.default_rng(0)
init = [rng.uniform(-1, 1, n).astype(np.float32) for _ in range(2)]
states = [jax.device_put(v) for v in init]
for _ in range(8):
    states = [op(s) for s in states]
jax.block_until_ready(states)
# check: after k steps of y = y/2 + 1 from y0, y = 2 + (y0 - 2) / 2**k
got = np.asarray(states[0]); want = init[0].astype(np.float64)
for _ in range(8):
    want = 0.5 * want + 1.0
assert np.allclose(got, want, rtol=1e-6), "wrong result"
print("result matches numpy after 8 steps")

def run(k, calls=200):
    global states
    t = time.perf_counter()
    for i in range(calls):
        j = i % k
        states[j] = op(states[j])
    jax.block_until_ready(states)
    return (time.perf_counter() - t) / calls * 1e6

res = {"hit": [], "rebind": []}; cnt = {}
for r in range(25):
    order = (("hit", 1), ("rebind", 2)) if r % 2 == 0 else (("rebind", 2), ("hit", 1))
    for name, k in order:
        numbax.reset_bridge_counters()
        res[name].append(run(k))
        c = numbax.bridge_counters()
        for key in ("graph_hits", "graph_rebinds", "graph_misses", "calls"):
            cnt.setdefault(name, {}).setdefault(key, 0); cnt[name][key] += c.get(key, 0)
for name in res:
    print(f"{name}: median {statistics.median(res[name]):.2f} us/call "
          f"(min {min(res[name]):.2f}) over 25 rounds of 200; counters {cnt[name]}")
print(f"rebind - hit: {statistics.median(res['rebind']) - statistics.median(res['hit']):.2f} us")
