"""Building, checking and timing the implementations (the phases of
``python -m numbax bench``; run.py drives them and writes the report)."""

from __future__ import annotations

import gc
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass
class Prepared:
    """An implementation that built and matched numpy, ready to be timed."""
    impl: Any
    row: dict
    chain: Any
    single: Any
    op: Any


#: The moving-buffers measurements, in table order (row keys and phases).
MOVING = ("moving", "donated", "single_moving")
#: Rows whose single_moving gets a pass with the bridge counters recorded.
COUNTED_ROWS = ("numbax_capture",)


def _failed(row: dict, phase: str, exc: BaseException, log) -> None:
    row["status"] = f"FAILED ({phase})"
    row.setdefault("errors", {})[phase] = f"{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log(f"[{row['name']}] {phase} FAILED:\n{tb.rstrip()}")


def prepare(impl, cfg, rng, x, timing, unavailable, log) -> tuple[dict, Prepared | None]:
    """Builds, checks against numpy and warms one implementation; never raises."""
    row = {"name": impl.name, "label": impl.label, "compare_to": impl.compare_to,
           "status": "ok", "chain": None, "single": None, "bandwidth": None,
           **dict.fromkeys(MOVING)}
    try:
        op = impl.make(cfg.n)
    except unavailable as u:
        row["status"] = "skipped (no GPU)" if u.status == "skipped" else u.status
        row["note"] = u.reason
        log(f"[{impl.name}] {row['status']}: {u.reason}")
        return row, None
    except Exception as exc:  # noqa: BLE001
        _failed(row, "build", exc, log)
        return row, None

    import jax
    chain = timing.chain_fn(op, cfg.chain_length)
    single = jax.jit(op)
    try:
        timing.check(single, chain, cfg.n, cfg.chain_length, rng)
        log(f"[{impl.name}] output matches numpy (single and chain of "
            f"{cfg.chain_length})")
    except Exception as exc:  # noqa: BLE001
        _failed(row, "check", exc, log)
        return row, None
    for phase, fn in (("chain", chain), ("single", single)):
        try:
            timing.warm_up(fn, x, cfg.warmup)
        except Exception as exc:  # noqa: BLE001
            _failed(row, phase, exc, log)
            return row, None
    return row, Prepared(impl, row, chain, single, op)


def measure_latency(prepared: list[Prepared], cfg, x, timing, progress, log) -> None:
    """Chain and single samples of every prepared implementation, interleaved."""
    tasks = []
    for p in prepared:
        tasks.append(timing.Task(
            (p.impl.name, "chain"),
            lambda p=p: timing.chain_sample(p.chain, x, cfg.chain_runs,
                                            cfg.chain_length)))
        tasks.append(timing.Task(
            (p.impl.name, "single"),
            lambda p=p: timing.single_sample(p.single, x, cfg.single_runs)))
    rows = {p.impl.name: p.row for p in prepared}

    def on_error(task, exc):
        name, phase = task.key
        _failed(rows[name], phase, exc, log)

    progress.describe("latency rounds")
    progress.add_total((cfg.warmup_rounds + cfg.rounds) * len(tasks))
    samples = timing.interleave(tasks, cfg.rounds, warmup_rounds=cfg.warmup_rounds,
                                on_step=progress.advance, on_error=on_error)
    _record_us(samples, rows, timing, log)


def _record_us(samples: dict, rows: dict, timing, log,
               lengths: dict | None = None) -> None:
    """The medians of interleaved samples (us per op) into their rows, but
    for phases that failed; ``lengths[name, phase]``, when given, adds the
    program's ops and its time per call."""
    for (name, phase), values in samples.items():
        if values and phase not in rows[name].get("errors", {}):
            record = timing.summarize(values, "us")
            if lengths is not None:
                ops = lengths[name, phase]
                record.update(length=ops, us_per_program=record["us_per_call"] * ops)
            rows[name][phase] = record
            log(f"[{name}] {phase}: {record['us_per_call']:.2f} us/call "
                f"(median of {len(values)} rounds)")


def measure_moving(prepared: list[Prepared], cfg, rng, timing, progress,
                   log) -> None:
    """moving, donated and single_moving samples of every prepared
    implementation, interleaved; each checked against numpy after its
    warm-up and again after the rounds. Then the rows of ``COUNTED_ROWS``
    get one more single_moving pass (a call on every input) with the bridge
    counters recorded (``moving_counters``)."""
    progress.describe("moving buffers")
    inputs = timing.Inputs(rng, cfg.moving_inputs, cfg.n)
    rows = {p.impl.name: p.row for p in prepared}
    measures, tasks = {}, []
    for p in prepared:
        if p.row["status"] != "ok":
            continue
        start = rng.uniform(-1, 1, cfg.n).astype("float32")
        made = timing.moving_measures(p.op, p.single, inputs, cfg.moving_length,
                                      start)
        for phase in MOVING:
            m = made[phase]
            try:
                m.warm(cfg.warmup)
                m.check(f"{phase} before the rounds")
            except Exception as exc:  # noqa: BLE001
                _failed(p.row, phase, exc, log)
                continue
            measures[p.impl.name, phase] = m
            tasks.append(timing.Task((p.impl.name, phase),
                                     lambda m=m: m.sample(cfg.moving_runs)))
        if not set(MOVING) & set(p.row.get("errors", {})):
            log(f"[{p.impl.name}] moving buffers: warmed up and checked")

    def on_error(task, exc):
        _failed(rows[task.key[0]], task.key[1], exc, log)

    progress.add_total((cfg.warmup_rounds + cfg.rounds) * len(tasks))
    samples = timing.interleave(tasks, cfg.rounds, warmup_rounds=cfg.warmup_rounds,
                                on_step=progress.advance, on_error=on_error)
    for (name, phase), m in measures.items():
        if phase in rows[name].get("errors", {}):
            continue
        try:
            if phase == "single_moving" and name in COUNTED_ROWS:
                deltas = timing.counter_deltas(
                    lambda m=m: m.sample(cfg.moving_inputs))
                rows[name]["moving_counters"] = {"op_calls": cfg.moving_inputs,
                                                 **deltas}
            m.check(f"{phase} after the rounds")
        except Exception as exc:  # noqa: BLE001
            _failed(rows[name], phase, exc, log)
    _record_us(samples, rows, timing, log,
               lengths={k: m.length for k, m in measures.items()})


def measure_bandwidth(prepared: list[Prepared], cfg, bw_x, timing, progress,
                      log) -> None:
    """GB/s of the bandwidth-row implementations over a large array, interleaved."""
    progress.describe("bandwidth")
    tasks = []
    rows = {}
    for p in prepared:
        if not p.impl.bandwidth or p.row["status"] != "ok":
            continue
        try:
            op = p.impl.make(cfg.bw_n)
            timing.check_on_device(op, bw_x)
            chain = timing.chain_fn(op, cfg.bw_length)
            timing.warm_up(chain, bw_x, cfg.warmup)
        except Exception as exc:  # noqa: BLE001
            _failed(p.row, "bandwidth", exc, log)
            continue
        rows[p.impl.name] = p.row
        tasks.append(timing.Task(
            p.impl.name,
            lambda chain=chain: timing.bandwidth_sample(chain, bw_x, cfg.bw_length)))

    def on_error(task, exc):
        _failed(rows[task.key], "bandwidth", exc, log)

    progress.add_total((cfg.warmup_rounds + cfg.bw_rounds) * len(tasks))
    samples = timing.interleave(tasks, cfg.bw_rounds, warmup_rounds=cfg.warmup_rounds,
                                on_step=progress.advance, on_error=on_error)
    for name, values in samples.items():
        if values and "bandwidth" not in rows[name].get("errors", {}):
            rows[name]["bandwidth"] = timing.summarize(values, "GB/s")
            log(f"[{name}] bandwidth: {rows[name]['bandwidth']['gb_per_s']:.1f} GB/s")
    gc.collect()
