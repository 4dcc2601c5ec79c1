"""The CPU rows' report: issue 44's targets computed from one run, the
tables as printed, and where the run ran (numbax.bench.cpu runs the rows)."""

from __future__ import annotations

import os
import sys
from typing import Any

#: What the table calls each row.
LABELS = {
    "native": "C++ FFI handler",
    "native_empty": "C++ FFI handler, empty",
    "numba_kernel": "numbax numba_kernel",
    "numba_kernel_empty": "numbax numba_kernel, empty",
    "numba_kernel_xla": "numbax numba_kernel, parallel='xla'",
    "buffer_callback": "buffer_callback + @njit",
    "pure_callback": "jax.pure_callback",
    "jnp": "jnp",
    "brainevent": "brainevent numba_kernel",
}

#: What the run prints first when it chose the CPU rows by itself.
NOTE_TINY = ("tiny sizes: every row checked end to end; these timings are not "
             "figures, so no target is judged")


def _us(rows: dict, name: str, key: str) -> float | None:
    return ((rows.get(name) or {}).get(key) or {}).get("us")


def _div(a, b):
    return None if a is None or b is None or b == 0 else a / b


def targets(rows: list[dict], large: list[dict]) -> list[dict]:
    """Each target of issue 44: what it compares, the measured value, the
    bound, and whether this run meets it (None: a row it needs is missing)."""
    by = {r["name"]: r for r in rows}
    lg = {r["name"]: r for r in large}
    nk = "numba_kernel"
    out = []

    def add(what, value, bound, at_most, unit="x"):
        met = None if value is None else (value <= bound if at_most
                                          else value >= bound)
        out.append({"target": what, "value": value, "bound": bound,
                    "at_most": at_most, "unit": unit, "met": met})

    add("chain: numba_kernel / C++ handler",
        _div(_us(by, nk, "chain"), _us(by, "native", "chain")), 1.2, True)
    empty, floor = (_us(by, "numba_kernel_empty", "chain"),
                    _us(by, "native_empty", "chain"))
    empty_gap = None if empty is None or floor is None else empty - floor
    add("chain, empty kernel: numba_kernel - empty C++ handler",
        empty_gap, 0.05, True, unit="us")
    for other, bound in (("brainevent", 15), ("buffer_callback", 6),
                         ("pure_callback", 100)):
        add(f"chain: {LABELS[other]} / numba_kernel",
            _div(_us(by, other, "chain"), _us(by, nk, "chain")), bound, False)
    add("vmap: numba_kernel / one C++ handler call over the batch",
        _div(_us(by, nk, "vmap"), _us(by, "native", "vmap")), 1.2, True)
    add("vmap: brainevent 'sequential' / numba_kernel",
        _div(_us(by, "brainevent", "vmap"), _us(by, nk, "vmap")), 15, False)
    serial = _us(lg, "serial", "alone")
    sx = _div(serial, _us(lg, "xla", "alone"))
    sp = _div(serial, _us(lg, "prange", "alone"))
    add("large: parallel='xla' speed-up / prange speed-up", _div(sx, sp),
        0.8, False)
    add("large: parallel='xla' four at once / four in a row",
        _div(_us(lg, "xla", "at_once"), _us(lg, "xla", "in_a_row")), 1.0,
        True)
    return out


def _fmt(v, spec="8.2f"):
    """`v` in `spec`, or "-" right-aligned in the same width."""
    if v is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 1)
    return format(v, spec)


def format_table(record: dict) -> str:
    """The chain / single / vmap table, the large-op table and the targets
    (a tiny run judges none)."""
    cfg, tiny = record["config"], record["tiny"]
    by = {r["name"]: r for r in record["results"]}
    base = _us(by, "native", "chain")
    lines = [f"{'implementation':<34} {'status':<8} {'chain us/op':>11} "
             f"{'single us':>10} {'vmap us':>10} {'chain/C++':>9}"]
    for r in record["results"]:
        name = r["name"]
        status = "ok" if r["status"] == "ok" else r["status"].split(" ")[0]
        ratio = None if tiny else _div(_us(by, name, "chain"), base)
        lines.append(" ".join([
            f"{r['label']:<34} {status:<8}",
            _fmt(_us(by, name, "chain"), "11.3f"),
            _fmt(_us(by, name, "single"), "10.2f"),
            _fmt(_us(by, name, "vmap"), "10.1f"), _fmt(ratio, "9.2f")]))
    lines.append(f"(chain of {cfg['chain_length']} over {cfg['n']} float32; "
                 f"vmap over {cfg['batch']} x {cfg['n']}; median of "
                 f"{cfg['rounds']} interleaved rounds)")
    for r in record["results"]:
        if r["status"] != "ok":
            lines.append(f"  {r['label']}: {r['status']}")
    if record.get("large"):
        lg = {r["name"]: r for r in record["large"]}
        serial = _us(lg, "serial", "alone")
        lines += ["", f"large op over {cfg['large_n']} float32, us per program:",
                  f"{'implementation':<43} {'alone':>10} {'4 at once':>10} "
                  f"{'4 in a row':>10} {'speed-up':>8}"]
        for r in record["large"]:
            name = r["name"]
            speed_up = None if tiny else _div(serial, _us(lg, name, "alone"))
            lines.append(" ".join([
                f"{r.get('label', name):<43}",
                _fmt(_us(lg, name, "alone"), "10.1f"),
                _fmt(_us(lg, name, "at_once"), "10.1f"),
                _fmt(_us(lg, name, "in_a_row"), "10.1f"),
                _fmt(speed_up, "8.2f")])
                + ("" if r["status"] == "ok" else f"  {r['status']}"))
    lines.append("")
    if tiny:
        lines.append("targets (issue 44): not judged, " + NOTE_TINY)
        return "\n".join(lines)
    lines.append("targets (issue 44), this run:")
    for t in record["targets"]:
        op = "<=" if t["at_most"] else ">="
        unit = " us" if t["unit"] == "us" else "x"
        verdict = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.3g}{unit}"
        lines.append(f"  {t['target']:<58} {value:>10}  (target {op} "
                     f"{t['bound']:g}{unit})  {verdict}")
    pool = pool_vmap(record["results"])
    if pool:
        lines.append(pool)
    return "\n".join(lines)


def pool_vmap(rows: list[dict]) -> str | None:
    """The vmap targets' ratios for the ``parallel='xla'`` row, which runs
    the slices on XLA's pool where the targets' row runs them on one thread:
    what a user who asks for the pool gets (judged as no target)."""
    by = {r["name"]: r for r in rows}
    xla = _us(by, "numba_kernel_xla", "vmap")
    native = _div(xla, _us(by, "native", "vmap"))
    brainevent = _div(_us(by, "brainevent", "vmap"), xla)
    if native is None and brainevent is None:
        return None
    said = []
    if native is not None:
        said.append(f"{native:.3g}x one C++ handler call over the batch")
    if brainevent is not None:
        said.append(f"brainevent 'sequential' {brainevent:.3g}x slower")
    return ("  with parallel='xla' the vmap row spreads its slices over "
            "XLA's pool: " + "; ".join(said))


def environment(native) -> dict:
    """Where the run ran: CPU, versions, load, the C++ handler's build."""
    import platform

    import jax

    from .report import _version
    info: dict[str, Any] = {
        "device": "cpu",
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        # The machine may be shared: its load says how far to trust the run.
        "load_average_end": load_average(),
        "python": sys.version.split()[0],
        "host": platform.platform(),
        "jax_devices": [str(d) for d in jax.devices()],
        "versions": {d: _version(d) for d in (
            "jax", "jaxlib", "numba", "numbax", "numpy", "brainevent")},
        # From a checkout (src/ on the path) numbax has no distribution.
        "numbax_version": _numbax_version(),
        "numba_threading_layer": os.environ.get("NUMBA_THREADING_LAYER"),
        "numba_num_threads": _numba_threads(),
    }
    if native is not None:
        info["native"] = {"library": native.library,
                          "compiler": native.compiler_version,
                          "command": native.command,
                          "cached": native.cached}
    return info


def _numbax_version() -> str | None:
    try:
        import numbax
        return numbax.__version__
    except Exception:  # noqa: BLE001 - informational
        return None


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the OS has none)."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def _numba_threads() -> int | None:
    try:
        import numba
        return int(numba.config.NUMBA_NUM_THREADS)
    except Exception:  # noqa: BLE001 - informational
        return None



def fmt_load(load) -> str:
    return "unknown" if not load else "/".join(f"{x:.1f}" for x in load)
