"""Workload benchmarks: vmap of a kernel, and an event-driven spiking network.

vmap: y = 2x + 1 over a B x n float32 array, four ways, one jitted call
each: ``jax.vmap`` of a ``numba_cuda_kernel`` that folds the batch into one
launch; the same body that reads gridDim.y/z, so vmap launches it once per
slice; one launch over the flattened array; and ``jnp``. Each is checked
against numpy, then timed in interleaved rounds (median of single calls).

Spiking network: N leaky integrate-and-fire neurons, each with ``fan_out``
random outgoing synapses of weight +-1/64 (exact in float32, so every
summation order gives the same input and the spike counts must match the
pure-JAX reference exactly), ``steps`` steps in ``lax.scan``. The synaptic
input is computed by (a) ``segment_sum`` over all synapses, (b) a
``numba_cuda_callable`` launching a zero-fill and an event-driven scatter,
(c) the same with ``capture=True``, (d) a ``numba_cuda_kernel`` adding into
an aliased zero buffer. Reported: us per step (median over rounds of whole
runs / steps) and the first call (trace + compile + run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class WorkloadConfig:
    vmap_shapes: tuple = ((256, 4096), (4096, 256), (8, 1 << 20))
    vmap_rounds: int = 10
    vmap_runs: int = 5          # calls per round (one sample: median)
    neurons: int = 100_000
    fan_out: int = 100
    steps: int = 200
    snn_rounds: int = 5         # whole runs of `steps` steps, interleaved

    @classmethod
    def quick(cls) -> WorkloadConfig:
        return cls(vmap_rounds=4, vmap_runs=3, snn_rounds=3)

    @classmethod
    def cpu_smoke(cls) -> WorkloadConfig:
        # The simulator runs a Python thread per CUDA thread: tiny sizes.
        return cls(vmap_shapes=((3, 32), (2, 64)), vmap_rounds=2, vmap_runs=1,
                   neurons=64, fan_out=4, steps=5, snn_rounds=2)


def _vmap_variants(b: int, n: int):
    import jax
    import jax.numpy as jnp

    import numbax

    from .kernels import affine, affine_per_slice
    row = jax.ShapeDtypeStruct((n,), jnp.float32)
    flat = jax.ShapeDtypeStruct((b * n,), jnp.float32)
    folded = numbax.numba_cuda_kernel(affine, row, launch_dims=n)
    sliced = numbax.numba_cuda_kernel(affine_per_slice, row, launch_dims=n)
    whole = numbax.numba_cuda_kernel(affine, flat, launch_dims=b * n)
    return {
        "numbax vmap, folded": (jax.jit(jax.vmap(folded)), folded),
        "numbax vmap, per slice": (jax.jit(jax.vmap(sliced)), sliced),
        "numbax, one launch over B*n": (
            jax.jit(lambda x: whole(x.reshape(-1)).reshape(x.shape)), None),
        "jnp": (jax.jit(lambda x: 2 * x + 1), None),
    }


def run_vmap(cfg: WorkloadConfig, rng, timing, log) -> list[dict]:
    import jax
    rows = []
    for b, n in cfg.vmap_shapes:
        x = jax.device_put(rng.uniform(-1, 1, (b, n)).astype(np.float32))
        want = 2 * np.asarray(x, np.float64) + 1
        tasks, table = [], {}
        for name, (fn, op) in _vmap_variants(b, n).items():
            row = {"B": b, "n": n, "name": name, "status": "ok"}
            if op is not None:
                row["vmap"] = str(op.vmap_fold(
                    jax.ShapeDtypeStruct((n,), np.float32)))
            try:
                got = np.asarray(fn(x))
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
                timing.warm_up(fn, x, 2)
            except Exception as exc:  # noqa: BLE001 - reported in the row
                row["status"] = f"FAILED: {type(exc).__name__}: {exc}"
                log(f"[vmap {b}x{n}] {name}: {row['status']}")
                rows.append(row)
                continue
            table[name] = row
            rows.append(row)
            tasks.append(timing.Task(name, lambda fn=fn, x=x: (
                timing.single_sample(fn, x, cfg.vmap_runs))))
        samples = timing.interleave(tasks, cfg.vmap_rounds, warmup_rounds=1)
        for name, values in samples.items():
            if values:
                table[name].update(timing.summarize(values, "us"))
        flat = table.get("numbax, one launch over B*n", {})
        flat_us = flat.get("us_per_call")
        for name, row in table.items():
            if flat_us and "us_per_call" in row:
                row["x_flat"] = row["us_per_call"] / flat_us
            log(f"[vmap {b}x{n}] {name}: {row.get('us_per_call', float('nan')):.1f} us")
    return rows


# -- spiking network ---------------------------------------------------------

def _network(cfg: WorkloadConfig, seed: int):
    rng = np.random.default_rng(seed)
    n, k = cfg.neurons, cfg.fan_out
    post = rng.integers(0, n, size=(n, k), dtype=np.int32)
    weight = np.where(rng.random((n, k)) < 0.8, 1.0, -1.0).astype(
        np.float32) / 64
    drive = rng.uniform(0.0, 0.1, n).astype(np.float32)
    v0 = rng.uniform(0.0, 1.0, n).astype(np.float32)
    return post, weight, drive, v0


def _snn_variants(cfg: WorkloadConfig):
    import jax
    import jax.numpy as jnp

    import numbax

    from .kernels import spike_scatter, spike_scatter_into, zero_fill
    n, tpb = cfg.neurons, 256
    blocks = -(-n // tpb)
    out = jax.ShapeDtypeStruct((n,), jnp.float32)

    def launch(spikes, post, weight, syn, stream):
        zero_fill[blocks, tpb, stream](syn)
        spike_scatter[blocks, tpb, stream](spikes, post, weight, syn)

    plain = numbax.numba_cuda_callable(launch, out)
    captured = numbax.numba_cuda_callable(launch, out, capture=True)
    kernel = numbax.numba_cuda_kernel(spike_scatter_into, out, launch_dims=n,
                                      input_output_aliases={3: 0})

    def jax_input(spikes, post, weight):
        contrib = jnp.where(spikes[:, None], weight, 0.0).reshape(-1)
        return jax.ops.segment_sum(contrib, post.reshape(-1), num_segments=n)

    return {
        "(a) pure JAX segment_sum": jax_input,
        "(b) numba_cuda_callable": plain,
        "(c) numba_cuda_callable(capture=True)": captured,
        "(d) numba_cuda_kernel, aliased zeros": (
            lambda s, p, w: kernel(s, p, w, jnp.zeros(n, jnp.float32))),
    }


def _simulate(syn_input, steps: int):
    import jax
    import jax.numpy as jnp

    @jax.jit
    def run(v0, drive, post, weight):
        def step(carry, _):
            v, spikes = carry
            syn = syn_input(spikes.astype(jnp.uint8), post, weight)
            v = v * jnp.float32(0.95) + drive + syn
            fired = v > 1.0
            v = jnp.where(fired, jnp.float32(0.0), v)
            return (v, fired), jnp.sum(fired, dtype=jnp.int32)
        init = (v0, jnp.zeros(v0.shape, bool))
        _, counts = jax.lax.scan(step, init, None, length=steps)
        return counts
    return run


def run_snn(cfg: WorkloadConfig, seed: int, timing, log) -> list[dict]:
    import jax
    arrays = [jax.device_put(a) for a in _network(cfg, seed)]
    post, weight, drive, v0 = arrays
    args = (v0, drive, post, weight)
    rows, tasks, runs, reference = [], [], {}, None
    for name, syn in _snn_variants(cfg).items():
        row = {"name": name, "status": "ok", "neurons": cfg.neurons,
               "fan_out": cfg.fan_out, "steps": cfg.steps}
        rows.append(row)
        try:
            run = _simulate(syn, cfg.steps)
            t0 = time.perf_counter()
            counts = np.asarray(run(*args))
            row["first_call_s"] = time.perf_counter() - t0
            row["spikes_per_step"] = float(counts.mean())
            row["spiking_fraction"] = float(counts.mean() / cfg.neurons)
            if reference is None:
                reference = counts
            elif not np.array_equal(counts, reference):
                bad = int(np.argmax(counts != reference))
                raise AssertionError(
                    f"spike counts differ from pure JAX from step {bad}: "
                    f"{counts[bad]} vs {reference[bad]}")
            row["spikes_match_jax"] = True
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row["status"] = f"FAILED: {type(exc).__name__}: {exc}"
            log(f"[snn] {name}: {row['status']}")
            continue
        runs[name] = row
        tasks.append(timing.Task(name, lambda run=run: _per_step(
            run, args, cfg.steps)))
    samples = timing.interleave(tasks, cfg.snn_rounds, warmup_rounds=1)
    for name, values in samples.items():
        if values:
            runs[name].update(timing.summarize(values, "us"))
            runs[name]["us_per_step"] = runs[name]["us_per_call"]
            log(f"[snn] {name}: {runs[name]['us_per_step']:.1f} us/step, "
                f"first call {runs[name]['first_call_s']:.2f} s")
    return rows


def _per_step(run, args, steps: int) -> float:
    t0 = time.perf_counter()
    run(*args).block_until_ready()
    return (time.perf_counter() - t0) / steps * 1e6


def _num(value, digits: int, missing: str = "") -> str:
    return missing if value is None else f"{value:.{digits}f}"


def format_tables(vmap_rows: list[dict], snn_rows: list[dict]) -> str:
    lines = ["", "== vmap (y = 2x + 1 over B x n float32; us per jitted call; "
             "x flat = / one launch over B*n)",
             "| B x n | implementation | us | x flat | vmap launch |",
             "|---|---|---|---|---|"]
    for r in vmap_rows:
        lines.append(
            f"| {r['B']} x {r['n']} | {r['name']} | "
            f"{_num(r.get('us_per_call'), 1, r['status'])} | "
            f"{_num(r.get('x_flat'), 2)} | {r.get('vmap', '')} |")
    if snn_rows:
        r0 = snn_rows[0]
        lines += ["", f"== spiking network ({r0['neurons']} LIF neurons x "
                  f"{r0['fan_out']} synapses, {r0['steps']} steps in lax.scan)",
                  "| synaptic input | us/step | first call (s) | spikes/step "
                  "| counts = JAX |", "|---|---|---|---|---|"]
        for r in snn_rows:
            lines.append(
                f"| {r['name']} | "
                f"{_num(r.get('us_per_step'), 1, r['status'])} | "
                f"{_num(r.get('first_call_s'), 2)} | "
                f"{_num(r.get('spikes_per_step'), 0)} | "
                f"{'yes' if r.get('spikes_match_jax') else 'NO'} |")
    return "\n".join(lines)
