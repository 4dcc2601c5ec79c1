"""The results table and the JSON record of a run."""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

from .impls import VS_CMD_BUFFER, VS_PLAIN


def _ratio(value, base):
    if value is None or base is None or base == 0:
        return None
    return value / base


#: The time measurements with ratios to both native handlers, in table order.
TIMES = ("chain", "moving", "donated", "single", "single_moving")


def add_ratios(rows: list[dict], comparable: bool = True) -> None:
    """Adds ratios to each row in place. Time ratios: row / native (how many
    times slower), ``<time>_vs_native`` and ``<time>_vs_native_cmdbuf`` for
    each of :data:`TIMES`; bandwidth ratio: row / native (fraction of
    native).

    ``comparable=False`` (simulator timings) leaves every ratio None: the
    keys stay, so the record has one shape whatever the run.
    """
    by_name = {r["name"]: r for r in rows}

    def get(name, *keys):
        r: Any = by_name.get(name) or {}
        for k in keys:
            r = (r or {}).get(k)
        return r

    for r in rows:
        r["ratios"] = {}
        for key in TIMES:
            value = get(r["name"], key, "us_per_call")
            for suffix, base in (("", VS_PLAIN), ("_cmdbuf", VS_CMD_BUFFER)):
                r["ratios"][f"{key}_vs_native{suffix}"] = _ratio(
                    value, get(base, key, "us_per_call"))
        r["ratios"]["bandwidth_vs_native"] = _ratio(
            get(r["name"], "bandwidth", "gb_per_s"),
            get(VS_PLAIN, "bandwidth", "gb_per_s"))
        if not comparable:
            r["ratios"] = dict.fromkeys(r["ratios"])


def _fmt(value, spec, mark=""):
    return "-" if value is None else format(value, spec) + mark


#: Under a table with the moving-buffers columns.
MOVING_LEGEND = ("moving: chain on a new input each call; donated: y = f(y), y "
                 "donated (both us/op); 1-op mov: one op on a new input each "
                 "call (us); mov/cb, don/cb: / native cmd-buffer time")


def format_table(rows: list[dict], note: str | None = None,
                 moving: bool = True) -> str:
    """One line per implementation. '*' marks the chain ratio that row is
    judged by (cmd-buffer native for rows XLA may capture into a graph).

    ``note`` (a run whose timings are not comparable, such as the simulator's)
    leaves the ratio columns blank and replaces the ratio legend.
    ``moving=False`` (a run without them) leaves out the moving-buffers
    columns. The rows' bridge counters (:func:`format_counters`) follow the
    rows, above the legend.
    """
    def time(key, spec):
        return lambda r: _fmt((r.get(key) or {}).get("us_per_call"), spec)

    def ratio(key, spec, judged_by=None):
        def cell(r):
            if note is not None:
                return ""
            mark = ("" if judged_by is None else
                    "*" if r["compare_to"] == judged_by else " ")
            return _fmt(r["ratios"].get(key), spec, mark)
        return cell

    columns = [(head, cell) for head, cell, shown in (
        ("chain us", time("chain", ".2f"), True),
        ("moving", time("moving", ".2f"), moving),
        ("donated", time("donated", ".2f"), moving),
        ("single us", time("single", ".1f"), True),
        ("1-op mov", time("single_moving", ".1f"), moving),
        ("chain/nat", ratio("chain_vs_native", ".2f", VS_PLAIN), True),
        ("chain/nat-cb", ratio("chain_vs_native_cmdbuf", ".2f", VS_CMD_BUFFER),
         True),
        ("mov/cb", ratio("moving_vs_native_cmdbuf", ".2f"), moving),
        ("don/cb", ratio("donated_vs_native_cmdbuf", ".2f"), moving),
        ("single/nat", ratio("single_vs_native", ".2f"), True),
        ("BW GB/s", lambda r: _fmt((r.get("bandwidth") or {}).get("gb_per_s"),
                                   ".1f"), True),
        ("BW/nat", ratio("bandwidth_vs_native", ".3f"), True),
    ) if shown]
    head = ["implementation", "status"] + [h for h, _ in columns]
    lines = [[r["label"], r["status"]] + [cell(r) for _, cell in columns]
             for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt_row = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i < 2 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths)))
    out = [fmt_row(head), "  ".join("-" * w for w in widths)]
    out += [fmt_row(cells).rstrip() for cells in lines]
    out += format_counters(rows)
    if moving:
        out.append(MOVING_LEGEND)
    out.append(note if note is not None else
               "ratios: time / native time (lower is better); BW/nat: bandwidth "
               "/ native bandwidth; * = the chain ratio each row is judged by")
    return "\n".join(out)


def format_counters(rows: list[dict]) -> list[str]:
    """A line for each row with ``moving_counters``: what numbax's bridge
    counted over one pass of its op over the moving inputs."""
    lines = []
    for r in rows:
        c = r.get("moving_counters")
        if c:
            lines.append(
                f"{r['label']}, one op over {c['op_calls']} inputs: func ran "
                f"{c['calls']} times in {c['op_calls']} calls; "
                + ", ".join(f"{k} {c[k]}" for k in ("graph_misses", "graph_hits",
                                                   "graph_rebinds",
                                                   "graph_rebind_refusals")))
    return lines


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(device, native) -> dict:
    import jax
    info = {
        "device": getattr(device, "device_kind", str(device)),
        "platform": device.platform,
        "compute_capability": getattr(device, "compute_capability", None),
        "device_count": jax.device_count(),
        "python": sys.version.split()[0],
        "host": platform.platform(),
        "versions": {d: _version(d) for d in (
            "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin",
            "jax-cuda12-pjrt", "jax-cuda13-pjrt", "numba", "numba-cuda",
            "numbax", "numpy", "cuda-bindings")},
        "env": {k: os.environ.get(k) for k in (
            "XLA_FLAGS", "JAX_PLATFORMS", "NUMBA_ENABLE_CUDASIM",
            "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")},
    }
    if native is not None:
        info["native"] = {"library": native.library, "nvcc": native.nvcc_version,
                          "command": native.command}
    try:
        from numba import cuda
        if device.platform == "gpu":
            from numba.cuda.cudadrv.driver import driver
            info["cuda_driver_version"] = ".".join(map(str, driver.get_version()))
            info["numba_device"] = cuda.get_current_device().name
            if isinstance(info["numba_device"], bytes):
                info["numba_device"] = info["numba_device"].decode()
    except Exception as exc:  # noqa: BLE001 - informational only
        info["cuda_driver_version"] = f"unknown ({type(exc).__name__}: {exc})"
    return info


def write_json(path: str, record: dict) -> None:
    # No makedirs: a missing directory is refused before the run
    # (run.output_path_problem), never created silently.
    with open(path, "w") as f:
        json.dump(record, f, indent=2, default=str)
        f.write("\n")
