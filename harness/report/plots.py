"""Plots for the report, rendered by matplotlib (Agg) into inline base64 PNG data URIs."""

from __future__ import annotations

import base64
import io
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def latency_by_case(rows, op: str) -> str | None:
    """Median latency (log x) of every timed case of `op`, one marker per backend, p10-p90 as a bar."""
    timed = [r for r in rows if r.op == op and r.timing]
    if not timed:
        return None
    cases = list(dict.fromkeys(r.case_id for r in timed))
    backends = sorted({r.backend for r in timed})
    y = {c: i for i, c in enumerate(cases)}
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(cases) + 1.2))
    for k, b in enumerate(backends):
        pts = [r for r in timed if r.backend == b]
        ys = [y[r.case_id] + (k - (len(backends) - 1) / 2) * 0.15 for r in pts]
        med = [r.timing["median_us"] for r in pts]
        lo = [r.timing["median_us"] - r.timing["p10_us"] for r in pts]
        hi = [r.timing["p90_us"] - r.timing["median_us"] for r in pts]
        ax.errorbar(med, ys, xerr=[lo, hi], fmt="o", ms=4, capsize=2, label=b, color=_COLORS[k % len(_COLORS)])
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([c.split("/", 1)[1] for c in cases], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    clock = timed[0].timing.get("clock", "")
    ax.set_xlabel(f"median latency, µs (log; bars p10-p90; clock: {clock})")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"{op}: latency per case")
    return _png(fig)


def latency_vs_axis(rows, op: str, axis: str) -> str | None:
    """Latency against one swept parameter (log-log), a line per backend and per other-parameter group."""
    timed = [r for r in rows if r.op == op and r.timing and isinstance(r.params.get(axis), (int, float))]
    timed = [r for r in timed if r.params[axis] > 0 and r.timing["median_us"] > 0]  # log axes
    if len({r.params[axis] for r in timed}) < 3:
        return None
    series = defaultdict(list)
    for r in timed:
        rest = tuple(sorted((k, str(v)) for k, v in r.params.items() if k != axis))
        series[(r.backend, rest, r.dtype)].append((r.params[axis], r.timing["median_us"]))
    series = {k: v for k, v in series.items() if len(v) >= 2}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    backends = sorted({k[0] for k in series})
    for key, pts in series.items():
        pts.sort()
        color = _COLORS[backends.index(key[0]) % len(_COLORS)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=3, color=color, alpha=0.7, lw=1)
    for i, b in enumerate(backends):
        ax.plot([], [], "-o", color=_COLORS[i % len(_COLORS)], label=b)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel("median latency, µs")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{op}: latency vs {axis}")
    return _png(fig)


def error_heatmap(heat: list[list[float]], title: str, xlabel: str, ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(6, 2.8))
    im = ax.imshow(heat, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="max abs error")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return _png(fig)
