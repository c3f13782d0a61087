"""``--plot out.png`` for ``mpidist bench``: figures meant for a report (matplotlib, Agg).

``allreduce``: bus bandwidth against message size (log2 axis, labels 8B ... 64M), one line
per implementation and op, and below it mpidist's time relative to raw MPI. ``batch``: time per
call of each implementation. The series actually drawn are also stored in the PNG as a text
chunk (``mpidist-series``, JSON), so what a figure shows can be checked against the numbers.
"""

import json
import os
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mpidist.cli.bench import IMPL_LABELS, IMPL_MPIDIST, IMPL_RAW, Job, Row, human_size

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["require_matplotlib", "plot_allreduce", "plot_batch", "PNG_SERIES_KEY"]

PNG_SERIES_KEY = "mpidist-series"
DPI = 150
_COLORS = {IMPL_MPIDIST: "#1f77b4", IMPL_RAW: "#d62728"}
_OP_STYLES = {"sum": ("-", "o"), "max": ("--", "s"), "min": (":", "^"), "prod": ("-.", "D")}


class MissingMatplotlib(ImportError):
    pass


def require_matplotlib() -> ModuleType:
    """Import matplotlib with the Agg backend, or raise an error naming the extra to install."""
    try:
        import matplotlib  # noqa: PLC0415 - optional: the plot extra
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415, F401
        from matplotlib.figure import Figure  # noqa: PLC0415, F401
    except ImportError as err:
        raise MissingMatplotlib(
            f"--plot needs matplotlib, which cannot be imported ({err}): pip install "
            "'mpidist[plot]' (or pip install matplotlib)."
        ) from err
    return matplotlib


def _figure(rows_of_axes: int, height_ratios: Sequence[float], size: tuple[float, float]
            ) -> tuple["Figure", Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows_of_axes, 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": height_ratios})[:, 0]
    return fig, axes


def _size_axis(ax: "Axes", sizes: Sequence[int]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: PLC0415

    ax.set_xscale("log", base=2)
    powers = sorted({s.bit_length() - 1 for s in sizes})
    lo, hi = powers[0], powers[-1]
    step = max(1, -(-(hi - lo) // 9))  # at most ~10 labelled ticks
    labelled = list(range(lo, hi + 1, step))
    if hi - labelled[-1] >= 2:
        labelled.append(hi)  # the largest size gets a label when it is not crowded
    major = [2.0 ** p for p in labelled]
    ax.xaxis.set_major_locator(FixedLocator(major))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_size(round(x))))
    ax.xaxis.set_minor_locator(FixedLocator([2.0 ** p for p in range(lo, hi + 1)]))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if lo == hi:
        ax.set_xlim(2.0 ** (lo - 1), 2.0 ** (hi + 1))


def _series(fig: Any) -> list[dict[str, Any]]:  # a Figure; its lines' data is loosely typed
    """Every labelled line of the figure: ``[{"axes", "label", "x", "y"}]``."""
    out = []
    for index, ax in enumerate(fig.axes):
        for line in ax.get_lines():
            label = line.get_label()
            if label.startswith("_"):
                continue
            out.append({"axes": index, "label": label,
                        "x": [float(v) for v in line.get_xdata()],
                        "y": [float(v) for v in line.get_ydata()]})
        for container in getattr(ax, "containers", []):
            label = container.get_label()
            if label and not label.startswith("_"):
                horizontal = getattr(container, "orientation", None) == "horizontal"
                out.append({"axes": index, "label": label,
                            "x": [float(p.get_y() + p.get_height() / 2 if horizontal
                                        else p.get_x() + p.get_width() / 2) for p in container],
                            "y": [float(p.get_width() if horizontal else p.get_height())
                                  for p in container]})
    return out


def _save(fig: "Figure", path: str | os.PathLike[str], title: str,
          mpidist_version: str | None) -> list[dict[str, Any]]:
    series = _series(fig)
    fig.savefig(path, dpi=DPI, metadata={
        "Title": title.replace("\n", " "), "Software": f"mpidist {mpidist_version}",
        PNG_SERIES_KEY: json.dumps(series)})
    return series


def plot_allreduce(job: Job, rows: list[Row],
                   path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Write the all-reduce figure to ``path``; returns the series drawn."""
    require_matplotlib()
    n = job["ranks"]
    use_bus = n > 1
    key = "busbw_gbps" if use_bus else "algbw_gbps"
    ops = list(dict.fromkeys(r["op"] for r in rows))
    dtype = rows[0]["dtype"] if rows else ""
    fig, (top, bottom) = _figure(2, [3, 1.2], (8.0, 6.4))
    for op in ops:
        style, marker = _OP_STYLES.get(op, ("-", "o"))
        for impl in (IMPL_MPIDIST, IMPL_RAW):
            pts = sorted((r["size_bytes"], r[key]) for r in rows
                         if r["op"] == op and r["impl"] == impl)
            if pts:
                top.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=style, marker=marker,
                         markersize=4, color=_COLORS[impl], label=f"{IMPL_LABELS[impl]} ({op})")
        pts = sorted((r["size_bytes"], r["ratio_to_raw"]) for r in rows
                     if r["op"] == op and r["impl"] == IMPL_MPIDIST)
        if pts:
            bottom.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=style, marker=marker,
                        markersize=4, color=_COLORS[IMPL_MPIDIST], label=f"mpidist / raw ({op})")
    sizes = [r["size_bytes"] for r in rows]
    title = (f"All-reduce {dtype}: mpidist vs raw mpi4py Allreduce\n"
             f"{n} rank{'s' if n != 1 else ''} on {job['nodes']} node"
             f"{'s' if job['nodes'] != 1 else ''}, {job['mpi_vendor']}")
    top.set_title(title, fontsize=11)
    top.set_ylabel("bus bandwidth (GB/s)" if use_bus else
                   "algorithm bandwidth (GB/s)\n(busbw is 0 on 1 rank)")
    top.set_ylim(bottom=0)
    top.grid(True, which="major", alpha=0.5)
    top.grid(True, which="minor", axis="x", alpha=0.15)
    top.legend(loc="upper left", fontsize=8, frameon=True)
    bottom.axhline(1.0, color="0.4", linewidth=1, linestyle="--", label="_parity")
    bottom.set_ylabel("time ratio\nmpidist / raw")
    bottom.set_xlabel("message size (bytes per rank)")
    bottom.grid(True, which="major", alpha=0.5)
    bottom.grid(True, which="minor", axis="x", alpha=0.15)
    ratios = [r["ratio_to_raw"] for r in rows if r["impl"] == IMPL_MPIDIST] or [1.0]
    bottom.set_ylim(0, max(2.0, max(ratios) * 1.1))
    if len(ops) > 1:
        bottom.legend(loc="upper right", fontsize=7)
    if sizes:
        _size_axis(bottom, sizes)
    return _save(fig, path, title, job.get("mpidist"))


def plot_batch(job: Job, rows: list[Row],
               path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Write the batch figure (time per call of each implementation) to ``path``."""
    require_matplotlib()
    first = rows[0]
    fig, (ax,) = _figure(1, [1], (8.0, 4.2))
    names = [r["impl"] for r in rows]
    times = [r["time_us"] for r in rows]
    colors = [_COLORS[IMPL_MPIDIST] if n.startswith("mpidist") else "#d62728" for n in names]
    bars = ax.barh(range(len(rows)), times, color=colors, label="time per call (us)")
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    for bar, r in zip(bars, rows):
        ax.annotate(f" {r['time_us']:.0f} us ({r['ratio_to_raw']:.2f}x)",
                    (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center",
                    fontsize=8)
    ax.set_xlim(0, max(times) * 1.3)
    ax.set_xlabel("time per call (us), median of rounds; ratio to the raw pre-packed Allreduce")
    n = job["ranks"]
    title = (f"Batch all-reduce of {first['tensors']} x {first['tensor_size']} {first['dtype']}\n"
             f"{n} rank{'s' if n != 1 else ''} on {job['nodes']} node"
             f"{'s' if job['nodes'] != 1 else ''}, {job['mpi_vendor']}")
    ax.set_title(title, fontsize=11)
    ax.grid(True, axis="x", alpha=0.5)
    return _save(fig, path, title, job.get("mpidist"))
