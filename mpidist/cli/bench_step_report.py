"""Tables and the cost model of ``mpidist bench step`` (rows from mpidist.cli.bench_step).

``step_table`` is the human report of one job; ``render_markdown`` turns the JSON reports of
several jobs (1, 2, 4 ranks, two nodes) into docs/performance.md's tables, and ``fit_cost_model``
fits, by least squares, the terms those tables imply:

    all-reduce, raw MPI (ring):  T = 2(p-1)·alpha + 2(p-1)/p · n·beta
    mpidist all-reduce:          T = T_raw + c_call
    apply_gradients:             T = T_baseline + c_step + c_var·V
    projected step on p ranks:   T = c_step + c_var·V + T_update(n) + ring(p, n)

(c_step holds the step's own all-reduce call cost: it is mpidist minus the raw baseline.)
"""

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from mpidist.cli.bench import Job, Row

__all__ = ["step_table", "render_markdown", "fit_cost_model", "project"]

# A cluster network for the projection besides the figures measured here (stated in the doc).
CLUSTER_ALPHA_US = 5.0
CLUSTER_GBPS = 12.5


def _us(t: float) -> str:
    if t >= 10_000:
        return f"{t / 1e3:.1f} ms"
    if t >= 100:
        return f"{t:.0f} µs"
    return f"{t:.1f} µs"


def step_table(job: Job, rows: list[Row], timer_text: str) -> list[str]:
    """The human report of one job (rank 0 prints it)."""
    lines = [f"# mpidist bench step: {job['ranks']} rank(s) on {job['nodes']} node(s), "
             f"{job['mpi_vendor']}",
             f"# {timer_text}",
             "# ratio = mpidist time / baseline time in the same job (below 1: mpidist is faster)"]
    ar = [r for r in rows if r["path"] == "allreduce"]
    if ar:
        lines += ["#", "# strategy.run(lambda: get_replica_context().all_reduce('SUM', x)), float32",
                  f"# {'strategy':<22} {'size':>6} {'mpidist':>11} {'baseline':>11} {'ratio':>7}"
                  "  baseline"]
        lines += [f"  {r['strategy']:<22} {r['case']:>6} {_us(r['time_us']):>11} "
                  f"{_us(r['baseline_us']):>11} {r['ratio']:7.2f}  {r['baseline']}" for r in ar]
    ag = [r for r in rows if r["path"] == "apply_gradients"]
    if ag:
        lines += ["#", "# optimizer.apply_gradients inside strategy.run, float32, 100000 elements "
                  "in all", f"# {'strategy':<22} {'case':>15} {'mpidist':>11} {'baseline':>11} "
                  f"{'ratio':>7} {'/fused':>7} {'comm':>10} {'update':>10} {'/update':>8}"]
        lines += [f"  {r['strategy']:<22} {r['case']:>15} {_us(r['time_us']):>11} "
                  f"{_us(r['baseline_us']):>11} {r['ratio']:7.2f} {r.get('ratio_to_fused', math.nan):7.2f} "
                  f"{_us(r['comm_us']):>10} {_us(r['update_us']):>10} "
                  f"{r['ratio_to_update']:8.1f}" for r in ag]
    ft = [r for r in rows if r["path"] == "fit"]
    if ft:
        lines += ["#", f"# mpidist.fit, global batch {ft[0]['global_batch']}, SGD momentum; comm = "
                  "time inside the strategy's reduction plan (its one all-reduce); raw = the "
                  "same step in NumPy + mpi4py (its comm: time inside Allreduce); both "
                  "include waiting for the slower rank", f"# {'strategy':<22} {'model':>13} "
                  f"{'vars':>5} {'step ms':>9} {'comm ms':>9} {'comm %':>7} {'raw step':>9} "
                  f"{'raw comm':>9} {'raw %':>6} {'x raw':>6} {'raw AR':>10}"]
        lines += [f"  {r['strategy']:<22} {r['model']:>13} {r['variables']:>5} "
                  f"{r['step_ms']:9.3f} {r['comm_ms']:9.3f} {100 * r['comm_share']:6.1f}% "
                  f"{r['raw_step_ms']:9.3f} {r['raw_comm_ms']:9.3f} "
                  f"{100 * r['raw_comm_share']:5.1f}% {r['step_x_raw']:6.2f} "
                  f"{_us(r['raw_allreduce_us']):>10}" for r in ft]
    return lines


# -- the cost model -----------------------------------------------------------------------------
def _lstsq(columns: Sequence[npt.ArrayLike], target: npt.ArrayLike) -> np.ndarray:
    """Non-negative least squares by dropping negative terms (a handful of unknowns)."""
    a = np.array(columns, dtype=float).T
    b = np.array(target, dtype=float)
    keep = list(range(a.shape[1]))
    while keep:
        x, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        if (x >= 0).all():
            out = np.zeros(a.shape[1])
            out[keep] = x
            return out
        keep.pop(int(np.argmin(x)))
    return np.zeros(a.shape[1])


def _mwms(rows: list[Row], path: str, multi_node: bool = False) -> list[Row]:
    return [r for r in rows if r["path"] == path and r["strategy"].startswith("MWMS")
            and r["ranks"] > 1 and (r.get("nodes", 1) > 1) == multi_node]


def fit_cost_model(rows: list[Row]) -> dict[str, Any]:
    """The model's terms (µs, µs/byte) fitted from the rows of every job; None where a job that a
    term needs is missing."""
    model = {}
    for key, multi in (("one_node", False), ("two_nodes", True)):
        ar = [r for r in _mwms(rows, "allreduce", multi) if r["baseline"] == "raw comm.Allreduce"]
        if not multi and any(r["ranks"] == 2 for r in ar):
            ar = [r for r in ar if r["ranks"] == 2]  # 4 ranks oversubscribe the 2-core CI VM
        if len(ar) >= 2:
            p = np.array([r["ranks"] for r in ar], float)
            n = np.array([r["size_bytes"] for r in ar], float)
            alpha, beta = _lstsq([2 * (p - 1), 2 * (p - 1) / p * n],
                                 [r["baseline_us"] for r in ar])
            small = [r for r in ar if r["size_bytes"] <= 256 << 10]
            c_call = float(np.mean([r["time_us"] - r["baseline_us"] for r in small])) \
                if small else None
            model[key] = {"alpha_us": float(alpha), "beta_us_per_byte": float(beta),
                          "gbps": 1e-3 / beta if beta > 0 else math.inf, "c_call_us": c_call,
                          "points": len(ar)}
    for kind in ("sgd", "adam"):
        for label in sorted({r["strategy"] for r in rows if r["path"] == "apply_gradients"}):
            pts = [r for r in rows if r["path"] == "apply_gradients" and r["optimizer"] == kind
                   and r["strategy"] == label]
            if len(pts) < 2:
                continue
            v = np.array([r["variables"] for r in pts], float)
            c_step, c_var = _lstsq([np.ones_like(v), v],
                                   [r["time_us"] - r["baseline_us"] for r in pts])
            update = float(np.median([r["update_us"] for r in pts]))
            model.setdefault("apply_gradients", {})[f"{label} {kind}"] = {
                "c_step_us": float(c_step), "c_var_us": float(c_var), "update_us": update,
                "bytes": pts[0]["size_bytes"]}
    return model


def _apply_cell(row: Row) -> str:
    """``time (ratio; ratio to the fused baseline; ratio to the NumPy update)``; reports
    saved before the fused baseline existed have no middle term."""
    fused = f"{row['ratio_to_fused']:.1f}x fused; " if "ratio_to_fused" in row else ""
    return (f"{_us(row['time_us'])} ({row['ratio']:.1f}x; {fused}"
            f"{row['ratio_to_update']:.0f}x)")


def _ring(p: int, nbytes: float, alpha_us: float, beta: float) -> float:
    return 2 * (p - 1) * alpha_us + 2 * (p - 1) / p * nbytes * beta


def project(model: dict[str, Any], ranks: Sequence[int] = (64, 512)) -> list[dict[str, Any]]:
    """Projected step times (µs) of the 100 x 1000 apply_gradients step and of each fit model,
    for every network the model holds."""
    out: list[dict[str, Any]] = []
    net = model.get("two_nodes") or model.get("one_node")
    if not net:
        return out
    nets = [("measured here", net["alpha_us"], net["beta_us_per_byte"]),
            (f"cluster ({CLUSTER_ALPHA_US:g} µs, {CLUSTER_GBPS:g} GB/s)", CLUSTER_ALPHA_US,
             1e-3 / CLUSTER_GBPS)]
    terms_by = model.get("apply_gradients", {})
    # One rank per node, as at scale: the 2-rank job's terms (else any multi-worker job's).
    labels = [n for n in terms_by if n.startswith("MWMS 2x1 ")] or \
        [n for n in terms_by if n.startswith("MWMS")]
    for name in sorted(labels):
        terms = terms_by[name]
        for vars_ in (100, 1000):
            python = terms["c_step_us"] + terms["c_var_us"] * vars_
            for label, alpha, beta in nets:
                cells = [python + terms["update_us"] + _ring(p, terms["bytes"], alpha, beta)
                         for p in ranks]
                out.append({"step": f"apply_gradients {name.split()[-1]}, {vars_} variables",
                            "network": label, "python_us": python, "times_us": cells})
    return out


# -- markdown for docs/performance.md -----------------------------------------------------------
def _job_name(row: Row) -> str:
    return cast(str, row["strategy"])


def render_markdown(reports: list[dict[str, Any]], commands: Sequence[str] = ()) -> str:
    """docs/performance.md's "The step a user writes" tables from several jobs' JSON reports."""
    rows = [r for rep in reports for r in rep["rows"]]
    lines = []
    if commands:
        lines += ["```bash"] + list(commands) + ["```", ""]
    ar = [r for r in rows if r["path"] == "allreduce"]
    if ar:
        sizes = sorted({r["size_bytes"] for r in ar})
        names = sorted({r["case"] for r in ar}, key=lambda c: next(
            r["size_bytes"] for r in ar if r["case"] == c))
        lines += ["**`strategy.run(lambda: get_replica_context().all_reduce(\"SUM\", x))`**, float32, "
                  "mpidist time (ratio to the baseline):", "",
                  "| strategy | baseline | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(sizes)]
        for label in dict.fromkeys(_job_name(r) for r in ar):
            mine = {r["size_bytes"]: r for r in ar if _job_name(r) == label}
            base = next(iter(mine.values()))["baseline"]
            cells = [f"{_us(mine[s]['time_us'])} ({mine[s]['ratio']:.2f}x)" if s in mine else ""
                     for s in sizes]
            lines.append(f"| {label} | {base} | " + " | ".join(cells) + " |")
        lines.append("")
    ag = [r for r in rows if r["path"] == "apply_gradients"]
    if ag:
        counts = sorted({r["variables"] for r in ag})
        lines += ["**`optimizer.apply_gradients(zip(grads, variables))` inside `strategy.run`**, "
                  "100000 float32 elements split into V variables; mpidist time (ratio to the "
                  "baseline; ratio to the same baseline with the fused single-pass update "
                  "instead of NumPy's; ratio to the NumPy update alone):", "",
                  "| strategy | optimizer | baseline | " + " | ".join(f"V = {v}" for v in counts)
                  + f" | V={counts[-1]} / V={counts[0]} |", "|---|---|---|" + "---|" * (len(counts) + 1)]
        for label in dict.fromkeys(_job_name(r) for r in ag):
            for kind in ("sgd", "adam"):
                mine = {r["variables"]: r for r in ag if _job_name(r) == label
                        and r["optimizer"] == kind}
                if not mine:
                    continue
                base = next(iter(mine.values()))
                cells = [_apply_cell(mine[v]) if v in mine else "" for v in counts]
                growth = (mine[counts[-1]]["time_us"] / mine[counts[0]]["time_us"]
                          if counts[-1] in mine and counts[0] in mine else float("nan"))
                lines.append(f"| {label} | {kind} | {base['baseline']} "
                             f"({_us(base['baseline_us'])}) | " + " | ".join(cells)
                             + f" | {growth:.1f}x |")
        lines.append("")
    ft = [r for r in rows if r["path"] == "fit"]
    if ft:
        lines += [f"**`mpidist.fit` step**, global batch {ft[0]['global_batch']}, float64, SGD with "
                  "momentum; comm = time inside the strategy's reduction plan (fit's one fused "
                  "all-reduce of loss and gradients, with the wait for the slowest replica); "
                  "raw step = the same step in NumPy + mpi4py, its comm share the time inside "
                  "its `Allreduce` (the wait included); raw AR = one raw `Allreduce` of the same "
                  "bytes:", "",
                  "| strategy | model | variables | gradient bytes | step | comm | comm share "
                  "| raw step | raw comm share | step / raw | raw AR |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ft:
            lines.append(f"| {_job_name(r)} | {r['model']} | {r['variables']} | "
                         f"{r['size_bytes'] // 1024} KiB | {r['step_ms']:.2f} ms | "
                         f"{r['comm_ms']:.3f} ms | {100 * r['comm_share']:.1f}% | "
                         f"{r['raw_step_ms']:.2f} ms | {100 * r['raw_comm_share']:.1f}% | "
                         f"{r['step_x_raw']:.2f}x | {_us(r['raw_allreduce_us'])} |")
        lines.append("")
    lines += _model_markdown(rows)
    return "\n".join(lines)


def _model_markdown(rows: list[Row]) -> list[str]:
    model = fit_cost_model(rows)
    lines = []
    nets = [(k, model[k]) for k in ("one_node", "two_nodes") if k in model]
    if nets:
        lines += ["**Cost model, fitted by least squares from the tables above.** Raw MPI "
                  "all-reduce as a ring, T = 2(p-1)·α + 2(p-1)/p·n·β (one node: the 2-rank "
                  "rows; two nodes: the 2 x 2 rows); c_call = mpidist's all-reduce minus raw at 4 "
                  "and 256 KiB:", "",
                  "| network | points | α (latency) | β (bandwidth) | c_call (Python per "
                  "all-reduce) |", "|---|---|---|---|---|"]
        for key, m in nets:
            c = "" if m["c_call_us"] is None else f"{m['c_call_us']:.1f} µs"
            lines.append(f"| {key.replace('_', ' ')} | {m['points']} | {m['alpha_us']:.2f} µs "
                         f"| {m['gbps']:.2f} GB/s | {c} |")
        lines.append("")
    ag = model.get("apply_gradients", {})
    if ag:
        lines += ["Python terms of `apply_gradients` (mpidist minus its baseline = c_step + "
                  "c_var·V, V = number of variables):", "",
                  "| strategy, optimizer | c_step (per step) | c_var (per variable) | NumPy "
                  "update of 400 KB |", "|---|---|---|---|"]
        for name, t in sorted(ag.items()):
            lines.append(f"| {name} | {t['c_step_us']:.0f} µs | {t['c_var_us']:.1f} µs | "
                         f"{_us(t['update_us'])} |")
        lines.append("")
    proj = project(model)
    if proj:
        lines += ["Projected step at 64 and 512 ranks, one rank per node: T = c_step + c_var·V + "
                  "update + ring(p, 400 KB):", "",
                  "| step | network | Python terms | 64 ranks | 512 ranks |", "|---|---|---|---|---|"]
        for p in proj:
            lines.append(f"| {p['step']} | {p['network']} | {_us(p['python_us'])} | "
                         + " | ".join(_us(t) for t in p["times_us"]) + " |")
        lines.append("")
    return lines
