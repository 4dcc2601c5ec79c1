"""Workload benchmarks: vmap of a kernel, and an event-driven spiking network.

vmap: y = 2x + 1 over a B x n float32 array, four ways, one jitted call
each: ``jax.vmap`` of a ``numba_cuda_kernel`` that folds the batch into one
launch; the same body that reads gridDim.y/z, so vmap launches it once per
slice; one launch over the flattened array; and ``jnp``. Then
nested vmap over 16 x 16 x 4096 (folded, against one flat launch and
``jnp``); a bfloat16 kernel through numba-cuda's bf16 intrinsics over
256 x 4096 (folded and per slice; a GPU only); and a kernel that cannot
fold over 4096 x 256, its slices launched from C++ in one call against
the XLA loop (``lax.map``). Each is checked against numpy, then timed in
interleaved rounds (median of single calls).

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

from . import snn


@dataclass
class WorkloadConfig:
    vmap_shapes: tuple = ((256, 4096), (4096, 256), (8, 1 << 20))
    # The later rows: nested vmap (batch sizes..., n), bf16 vmap (B, n),
    # a kernel that cannot fold (B, n): C++ per slice against an XLA loop.
    nested_shape: tuple = (16, 16, 4096)
    bf16_shape: tuple = (256, 4096)
    per_slice_shape: tuple = (4096, 256)
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
        return cls(vmap_shapes=((3, 32), (2, 64)), nested_shape=(2, 3, 32),
                   bf16_shape=(3, 32), per_slice_shape=(4, 16),
                   vmap_rounds=2, vmap_runs=1,
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


def _nested_variants(batch: tuple, n: int):
    """vmap nested once per entry of `batch`, against one flat launch."""
    import jax
    import jax.numpy as jnp

    import numbax

    from .kernels import affine
    total = int(np.prod(batch))
    row = jax.ShapeDtypeStruct((n,), jnp.float32)
    flat = jax.ShapeDtypeStruct((total * n,), jnp.float32)
    folded = numbax.numba_cuda_kernel(affine, row, launch_dims=n)
    whole = numbax.numba_cuda_kernel(affine, flat, launch_dims=total * n)
    nested = folded
    for _ in batch:
        nested = jax.vmap(nested)
    return {
        "numbax nested vmap, folded": (jax.jit(nested), folded),
        "numbax, one launch over B*n": (
            jax.jit(lambda x: whole(x.reshape(-1)).reshape(x.shape)), None),
        "jnp": (jax.jit(lambda x: 2 * x + 1), None),
    }


def _bf16_variants(b: int, n: int, c):
    import jax
    import jax.numpy as jnp

    import numbax

    from .kernels import affine_bf16_kernels
    fold_kernel, slice_kernel = affine_bf16_kernels()
    row = jax.ShapeDtypeStruct((n,), jnp.bfloat16)
    folded = numbax.numba_cuda_kernel(fold_kernel, row, launch_dims=n)
    sliced = numbax.numba_cuda_kernel(slice_kernel, row, launch_dims=n)
    return {
        "numbax bf16 vmap, folded": (
            jax.jit(lambda x: jax.vmap(folded, in_axes=(0, None))(x, c)),
            folded),
        "numbax bf16 vmap, per slice": (
            jax.jit(lambda x: jax.vmap(sliced, in_axes=(0, None))(x, c)),
            sliced),
        "jnp": (jax.jit(lambda x: x * c[0] + c[1]), None),
    }


def _per_slice_variants(b: int, n: int):
    """A kernel that cannot fold: its slices from C++ in one call, against
    the XLA loop (lax.map: a while loop, one call per slice) every such
    batch took before."""
    import jax
    import jax.numpy as jnp

    import numbax

    from .kernels import affine, affine_per_slice
    row = jax.ShapeDtypeStruct((n,), jnp.float32)
    flat = jax.ShapeDtypeStruct((b * n,), jnp.float32)
    sliced = numbax.numba_cuda_kernel(affine_per_slice, row, launch_dims=n)
    sequential = numbax.numba_cuda_kernel(affine, row, launch_dims=n,
                                          vmap_method="sequential")
    whole = numbax.numba_cuda_kernel(affine, flat, launch_dims=b * n)
    return {
        "numbax vmap, per slice from C++": (jax.jit(jax.vmap(sliced)),
                                            sliced),
        "numbax vmap, sequential (C++)": (jax.jit(jax.vmap(sequential)),
                                          sequential),
        "numbax per slice, XLA loop (lax.map)": (
            jax.jit(lambda x: jax.lax.map(sliced, x)), None),
        "numbax, one launch over B*n": (
            jax.jit(lambda x: whole(x.reshape(-1)).reshape(x.shape)), None),
    }


def _measure(cfg, label, n: int, slices: int, variants: dict, x, check,
             unbatched, timing, log) -> list[dict]:
    """Checks then times each variant on `x`, interleaved; one row each.

    `label` is the row's B (a batch size, or sizes joined by 'x'); `slices`
    the total number of slices (for us per slice); `unbatched` the
    unbatched inputs an op's vmap decision is asked for.
    """
    rows, tasks, table = [], [], {}
    for name, (fn, op) in variants.items():
        row = {"B": label, "n": n, "name": name, "status": "ok"}
        if op is not None:
            row["vmap"] = str(op.vmap_fold(*unbatched))
        try:
            check(np.asarray(fn(x)))
            timing.warm_up(fn, x, 2)
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row["status"] = f"FAILED: {type(exc).__name__}: {exc}"
            log(f"[vmap {label}x{n}] {name}: {row['status']}")
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
        if "us_per_call" in row:
            row["us_per_slice"] = row["us_per_call"] / slices
        log(f"[vmap {label}x{n}] {name}: "
            f"{row.get('us_per_call', float('nan')):.1f} us")
    return rows


def run_vmap(cfg: WorkloadConfig, rng, timing, log) -> list[dict]:
    import jax
    import jax.numpy as jnp
    rows = []

    def affine_check(x):
        want = 2 * np.asarray(x, np.float64) + 1
        return lambda got: np.testing.assert_allclose(got, want, rtol=1e-6,
                                                      atol=1e-6)

    def row_spec(n, dtype=np.float32):
        return jax.ShapeDtypeStruct((n,), dtype)

    for b, n in cfg.vmap_shapes:
        x = jax.device_put(rng.uniform(-1, 1, (b, n)).astype(np.float32))
        rows += _measure(cfg, b, n, b, _vmap_variants(b, n), x,
                         affine_check(x), (row_spec(n),), timing, log)

    *batch, n = cfg.nested_shape
    x = jax.device_put(
        rng.uniform(-1, 1, tuple(batch) + (n,)).astype(np.float32))
    rows += _measure(cfg, "x".join(map(str, batch)), n, int(np.prod(batch)),
                     _nested_variants(tuple(batch), n), x, affine_check(x),
                     (row_spec(n),), timing, log)

    b, n = cfg.per_slice_shape
    x = jax.device_put(rng.uniform(-1, 1, (b, n)).astype(np.float32))
    rows += _measure(cfg, b, n, b, _per_slice_variants(b, n), x,
                     affine_check(x), (row_spec(n),), timing, log)

    b, n = cfg.bf16_shape
    try:
        c = jnp.array([2, 1], jnp.bfloat16)
        variants = _bf16_variants(b, n, c)
    except ImportError as exc:  # the simulator: no bf16 intrinsics
        rows.append({"B": b, "n": n, "name": "numbax bf16 vmap",
                     "status": f"skipped: {exc}"})
        return rows
    xb = jax.device_put(
        rng.uniform(-1, 1, (b, n)).astype(np.float32)).astype(jnp.bfloat16)
    # One rounding of 2x + 1 (fma) against numpy's float64: within bf16's
    # half ulp; jnp may round twice, hence the tolerance.
    want = 2 * np.asarray(xb.astype(jnp.float32), np.float64) + 1
    rows += _measure(
        cfg, b, n, b, variants, xb,
        lambda got: np.testing.assert_allclose(
            got.astype(np.float32), want, rtol=1e-2, atol=1e-2),
        (row_spec(n, jnp.bfloat16), c), timing, log)
    return rows


# -- spiking network ---------------------------------------------------------

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

    return {
        "(a) pure JAX segment_sum": snn.segment_sum_input(n),
        "(b) numba_cuda_callable": plain,
        "(c) numba_cuda_callable(capture=True)": captured,
        "(d) numba_cuda_kernel, aliased zeros": (
            lambda s, p, w: kernel(s, p, w, jnp.zeros(n, jnp.float32))),
    }


def run_snn(cfg: WorkloadConfig, seed: int, timing, log) -> list[dict]:
    import jax
    arrays = [jax.device_put(a) for a in snn.network(cfg.neurons, cfg.fan_out,
                                                     seed)]
    post, weight, drive, v0 = arrays
    args = (v0, drive, post, weight)
    rows, tasks, runs, reference = [], [], {}, None
    for name, syn in _snn_variants(cfg).items():
        row = {"name": name, "status": "ok", "neurons": cfg.neurons,
               "fan_out": cfg.fan_out, "steps": cfg.steps}
        rows.append(row)
        try:
            run = snn.simulate(syn, cfg.steps)
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
             "| B x n | implementation | us | x flat | us/slice | vmap launch |",
             "|---|---|---|---|---|---|"]
    for r in vmap_rows:
        lines.append(
            f"| {r['B']} x {r['n']} | {r['name']} | "
            f"{_num(r.get('us_per_call'), 1, r['status'])} | "
            f"{_num(r.get('x_flat'), 2)} | "
            f"{_num(r.get('us_per_slice'), 2)} | {r.get('vmap', '')} |")
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
