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


def add_ratios(rows: list[dict], comparable: bool = True) -> None:
    """Adds ratios to each row in place. Time ratios: row / native (how many
    times slower); bandwidth ratio: row / native (fraction of native).

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
        chain = get(r["name"], "chain", "us_per_call")
        single = get(r["name"], "single", "us_per_call")
        r["ratios"] = {
            "chain_vs_native": _ratio(chain, get(VS_PLAIN, "chain", "us_per_call")),
            "chain_vs_native_cmdbuf": _ratio(
                chain, get(VS_CMD_BUFFER, "chain", "us_per_call")),
            "single_vs_native": _ratio(
                single, get(VS_PLAIN, "single", "us_per_call")),
            "bandwidth_vs_native": _ratio(
                get(r["name"], "bandwidth", "gb_per_s"),
                get(VS_PLAIN, "bandwidth", "gb_per_s")),
        }
        if not comparable:
            r["ratios"] = dict.fromkeys(r["ratios"])


def _fmt(value, spec, mark=""):
    return "-" if value is None else format(value, spec) + mark


def format_table(rows: list[dict], note: str | None = None) -> str:
    """One line per implementation. '*' marks the chain ratio that row is
    judged by (cmd-buffer native for rows XLA may capture into a graph).

    ``note`` (a run whose timings are not comparable, such as the simulator's)
    leaves the ratio columns blank and replaces the ratio legend.
    """
    head = ["implementation", "status", "chain us", "single us",
            "chain/nat", "chain/nat-cb", "single/nat", "BW GB/s", "BW/nat"]

    def ratio(value, spec, mark=""):
        return "" if note is not None else _fmt(value, spec, mark)

    lines = []
    for r in rows:
        q = r["ratios"]
        primary = r["compare_to"]
        lines.append([
            r["label"], r["status"],
            _fmt((r.get("chain") or {}).get("us_per_call"), ".2f"),
            _fmt((r.get("single") or {}).get("us_per_call"), ".1f"),
            ratio(q["chain_vs_native"], ".2f",
                  "*" if primary == VS_PLAIN else " "),
            ratio(q["chain_vs_native_cmdbuf"], ".2f",
                  "*" if primary == VS_CMD_BUFFER else " "),
            ratio(q["single_vs_native"], ".2f"),
            _fmt((r.get("bandwidth") or {}).get("gb_per_s"), ".1f"),
            ratio(q["bandwidth_vs_native"], ".3f"),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt_row = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i < 2 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths)))
    out = [fmt_row(head), "  ".join("-" * w for w in widths)]
    out += [fmt_row(cells).rstrip() for cells in lines]
    out.append(note if note is not None else
               "ratios: time / native time (lower is better); BW/nat: bandwidth "
               "/ native bandwidth; * = the chain ratio each row is judged by")
    return "\n".join(out)


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
