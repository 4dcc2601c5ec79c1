"""``--plot out.png``: the benchmark results as a bar chart (needs matplotlib)."""

from __future__ import annotations

from typing import Any

_INSTALL = ("install it with `pip install matplotlib` (or "
            "`pip install 'numbax[bench]'`), or leave out --plot")


class PlotUnavailable(RuntimeError):
    """--plot was asked for but matplotlib cannot be imported."""


def require_matplotlib() -> None:
    """Raises PlotUnavailable, saying how to fix it, if matplotlib is missing.

    Called before any benchmark runs, so a missing dependency costs nothing.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailable(
            f"--plot needs matplotlib, which cannot be imported ({exc}); "
            f"{_INSTALL}") from exc


def _value(row: dict, phase: str, key: str) -> float | None:
    v = (row.get(phase) or {}).get(key)
    return float(v) if v is not None else None


def _label(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def save_chart(record: dict[str, Any], path: str) -> str:
    """Writes a PNG chart of ``record`` (the suite's JSON record) to ``path``.

    One panel per measurement that has data: chain and single latency
    (microseconds per call, log scale) and bandwidth (GB/s). Rows that did
    not run (skipped, n/a, failed) are left out. Returns ``path``.
    """
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    rows = record["results"]
    panels = []
    for phase, key, title, log in (
            ("chain", "us_per_call", "chain (us per op, lower is better)", True),
            ("single", "us_per_call", "single op (us per call, lower is better)",
             True),
            ("bandwidth", "gb_per_s", "bandwidth (GB/s, higher is better)", False)):
        data = [(r["label"], v) for r in rows
                if (v := _value(r, phase, key)) is not None]
        if data:
            panels.append((title, data, log))
    if not panels:
        raise ValueError("no implementation produced a measurement: nothing to plot")

    height = max(2.5, 0.45 * max(len(d) for _, d, _ in panels) + 1.2)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), height),
                             squeeze=False)
    for ax, (title, data, log) in zip(axes[0], panels):
        labels = [label for label, _ in data][::-1]
        values = [v for _, v in data][::-1]
        bars = ax.barh(labels, values, color="#3b6ea8")
        if log:
            ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        for bar, v in zip(bars, values):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                    f" {_label(v)}", va="center", fontsize=8)
        ax.margins(x=0.25)
        ax.tick_params(axis="y", labelsize=8)
    env = record.get("environment", {})
    versions = env.get("versions", {})
    fig.suptitle(
        f"numbax bench: {env.get('device', '?')} | jax {versions.get('jax')} | "
        f"numba-cuda {versions.get('numba-cuda')} | {record.get('time', '')}",
        fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
