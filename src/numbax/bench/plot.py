"""``--plot out.png``: the benchmark results as a chart (needs matplotlib).

Drawn from the suite's JSON record alone (``--plot-from record.json`` redraws
a saved run without a GPU), so a chart can always be traced to its data.
Rows are coloured by what they are, from their names, so rows added to the
suite later are drawn without changes here: ``native*`` is the hand-written
CUDA C++ reference, ``numbax*`` is numbax, anything else is another way to
call Numba from JAX.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

_INSTALL = ("install it with `pip install matplotlib` (or "
            "`pip install 'numbax[bench]'`), or leave out --plot")

#: (what a row is, legend text, bar colour)
KINDS = (("numbax", "numbax", "#1f5fa8"),
         ("native", "native CUDA C++ FFI handler (the reference)", "#3a3a3a"),
         ("other", "other ways to call Numba from JAX", "#b0b0b0"))
_COLOR = {kind: color for kind, _, color in KINDS}


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


def kind(row: dict) -> str:
    """"numbax", "native" or "other", from the row's name."""
    name = row.get("name", "")
    for prefix in ("numbax", "native"):
        if name.startswith(prefix):
            return prefix
    return "other"


def _value(row: dict, phase: str, key: str) -> float | None:
    v = (row.get(phase) or {}).get(key)
    return float(v) if v is not None else None


def _number(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def _ratio(row: dict, key: str) -> float | None:
    return (row.get("ratios") or {}).get(key)


# One panel per measurement: (phase, value key, title, unit, which way is
# better, row -> (its ratio as text or None, the baseline it is judged by: no
# ratio is drawn on the baseline's own bar)).
def _panels(record: dict) -> list[tuple]:
    cfg = record.get("config") or {}
    n, length = cfg.get("n", "?"), cfg.get("chain_length", "?")
    bw_bytes = 4 * cfg["bw_n"] if "bw_n" in cfg else None
    bw_size = size(bw_bytes) if bw_bytes else "a large array"
    def chain_ratio(r: dict) -> tuple[str | None, str]:
        base = r.get("compare_to", "native")
        ratio = _ratio(r, f"chain_vs_{base}")
        which = "cmd-buf" if base.endswith("cmdbuf") else "plain"
        return (None if ratio is None else f"{ratio:.2f}x {which}"), base

    def simple(key: str, spec: str) -> Callable[[dict], tuple[str | None, str]]:
        def of(r: dict) -> tuple[str | None, str]:
            ratio = _ratio(r, key)
            return (None if ratio is None else f"{ratio:{spec}}x"), "native"
        return of

    return [
        ("chain", "us_per_call", f"chain: {length} ops in one jax.jit, n={n}",
         "microseconds per op", "lower is better", chain_ratio),
        ("single", "us_per_call",
         f"single op: one jitted call + host sync, n={n}",
         "microseconds per call", "lower is better",
         simple("single_vs_native", ".2f")),
        ("bandwidth", "gb_per_s", f"bandwidth: ops over {bw_size}",
         "GB/s read + written", "higher is better",
         simple("bandwidth_vs_native", ".3f")),
    ]


def size(nbytes: int) -> str:
    """A byte count the way people say it: 1 GiB, 64 MiB, 2 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def simulated(record: dict) -> bool:
    """True when the record's timings come from the CPU simulator."""
    if (record.get("mode") or {}).get("smoke"):
        return True
    platform = (record.get("environment") or {}).get("platform")
    return platform is not None and platform != "gpu"


def save_chart(record: dict[str, Any], path: str) -> str:
    """Writes a PNG chart of ``record`` (the suite's JSON record) to ``path``
    (see :func:`figure`). Returns ``path``."""
    import matplotlib.pyplot as plt
    fig = figure(record)
    try:
        fig.savefig(path, dpi=110, metadata={"Software": None})
    finally:
        plt.close(fig)
    return path


def figure(record: dict[str, Any]) -> Any:
    """The chart of ``record`` as a matplotlib figure (close it when done).

    One panel per measurement that has data (chain, single, bandwidth), the
    rows in table order and aligned across panels, coloured numbax / native /
    other, each bar labelled with its value and its ratio to the native
    handler it is judged by; a log axis where a panel's values span an order
    of magnitude or more.
    """
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    all_rows = record["results"]
    panels = [p for p in _panels(record)
              if any(_value(r, p[0], p[1]) is not None for r in all_rows)]
    if not panels:
        raise ValueError("no implementation produced a measurement: nothing to plot")
    rows = [r for r in all_rows
            if any(_value(r, p[0], p[1]) is not None for p in panels)
            or r.get("status", "ok") != "ok"]
    sim = simulated(record)

    # Fixed margins in inches, so the title, legend and labels never crowd
    # the bars whatever the number of rows.
    width = 4.7 * len(panels) + 1.9
    height = 0.42 * len(rows) + 2.3
    fig, axes = plt.subplots(1, len(panels), sharey=True, squeeze=False,
                             figsize=(width, height))
    fig.subplots_adjust(left=1.75 / width, right=1 - 0.15 / width,
                        top=1 - 1.25 / height, bottom=0.85 / height, wspace=0.08)
    ys = list(range(len(rows)))[::-1]  # first row on top
    for ax, (phase, key, title, unit, better, ratio_of) in zip(axes[0], panels):
        values = [_value(r, phase, key) for r in rows]
        present = [v for v in values if v is not None and v > 0]
        top = max(present) if present else 1.0
        # A log axis only where the values span an order of magnitude or
        # more; otherwise a linear one from 0 shows the differences truly.
        log = bool(present) and top / min(present) >= 10
        if log:
            base = 10 ** math.floor(math.log10(min(present) * 0.7))
            ax.set_xscale("log")
            ax.set_xlim(base, top * 14)
            ax.xaxis.set_major_formatter(
                FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        else:
            base = 0.0
            ax.set_xlim(0, top * 1.5)
        for y, r, v in zip(ys, rows, values):
            k = kind(r)
            if v is None:
                status = r.get("status", "ok")
                ax.text(base, y, "  " + ("not part of this measurement"
                                         if status == "ok" else status),
                        va="center", fontsize=7, color="#808080", style="italic")
                continue
            ax.barh(y, v - base, left=base, height=0.68, color=_COLOR[k])
            text = _number(v)
            ratio, own = ratio_of(r)
            if ratio is not None and r.get("name") != own:
                text += f"  ({ratio})"
            ax.text(v, y, "  " + text, va="center", fontsize=8,
                    fontweight="bold" if k == "numbax" else "normal")
        # The native handlers as reference lines across every row.
        for r, v in zip(rows, values):
            if kind(r) == "native" and v is not None:
                ax.axvline(v, color=_COLOR["native"], lw=0.8, ls=":", alpha=0.8)
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel(f"{unit} ({'log scale; ' if log else ''}{better})",
                      fontsize=8.5)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", which="major", color="#e4e4e4", lw=0.6)
        ax.set_axisbelow(True)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    first = axes[0][0]
    first.set_yticks(ys)
    first.set_yticklabels([r.get("label", r.get("name", "?")) for r in rows],
                          fontsize=8.5)
    for tick, r in zip(first.get_yticklabels(), rows):
        if kind(r) == "numbax":
            tick.set_fontweight("bold")
            tick.set_color(_COLOR["numbax"])
    # Room on the left for the longest row label, measured as drawn.
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    label_in = max(t.get_window_extent(renderer).width
                   for t in first.get_yticklabels()) / fig.dpi
    fig.subplots_adjust(left=(label_in + 0.25) / width)

    env = record.get("environment") or {}
    versions = env.get("versions") or {}
    fig.suptitle(
        "numbax vs a native CUDA C++ XLA FFI handler vs other ways to call "
        "Numba from JAX\n"
        + ("CPU smoke run through Numba's CUDA simulator | " if sim else "")
        + f"{env.get('device', '?')} | jax {versions.get('jax')} | numba-cuda "
        f"{versions.get('numba-cuda')} | {str(record.get('time', ''))[:10]} | "
        f"median of {(record.get('config') or {}).get('rounds', '?')} "
        "interleaved rounds", fontsize=10.5, y=1 - 0.08 / height, va="top")
    if sim:
        foot = ("Numba's CUDA simulator on the CPU: these timings show that each "
                "path runs, not how fast it is (no ratios). Run on a GPU for "
                "performance figures.")
    else:
        foot = ("(0.85x) = the row's time / the native handler's time (lower is "
                "better); in the chain, against the handler XLA treats alike: "
                "plain, or cmd-buf for rows XLA records into CUDA graphs. "
                "Bandwidth (0.996x) = fraction of native. Dotted lines: the "
                "native handlers.")
    fig.text(0.5, 0.12 / height, foot, ha="center", va="bottom", fontsize=7.5,
             color="#b00020" if sim else "#404040")
    fig.legend(handles=[Patch(color=c, label=t) for _, t, c in KINDS],
               loc="upper center", ncol=len(KINDS), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.62 / height))
    return fig
