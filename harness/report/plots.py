"""Plots for the report, rendered by matplotlib (Agg) into inline base64 PNG data URIs."""

from __future__ import annotations

import base64
import io
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def latency_by_case(rows, op: str, max_cases: int = 80) -> str | None:
    """Median latency (log x) of the timed cases of `op` (the first `max_cases`), a marker per backend."""
    timed = [r for r in rows if r.op == op and r.timing]
    if not timed:
        return None
    cases = list(dict.fromkeys(r.case_id for r in timed))[:max_cases]
    timed = [r for r in timed if r.case_id in set(cases)]
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
    if len(cases) == max_cases:
        ax.set_title(f"{op}: latency per case (first {max_cases})")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if len(cases) < max_cases:
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


_PEAK_KEY = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp32": "fp32_tflops"}


def roofline(rows, op: str, peaks: dict | None) -> str | None:
    """Achieved TFLOP/s against arithmetic intensity (log-log) below the measured roofs, by backend."""
    measured = (peaks or {}).get("measured") or {}
    bw = measured.get("copy_tbps")
    pts = [
        r for r in rows if r.op == op and r.timing and (r.derived or {}).get("intensity") and r.derived.get("tflops")
    ]
    if not pts or not bw:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [r.derived["intensity"] for r in pts]
    lo, hi = min(xs) / 10, max(xs) * 10
    for dt in sorted({r.dtype for r in pts}):
        pf = measured.get(_PEAK_KEY.get(dt, ""))
        if not pf:
            continue
        ridge = pf / bw
        xr = sorted({lo, min(max(ridge, lo), hi), hi})
        ax.plot(xr, [min(pf, x * bw) for x in xr], "--", color="0.45", lw=1)
        ax.annotate(
            f"{dt} roof: {pf:.0f} TFLOP/s, {bw:.2f} TB/s",
            (xr[-1], min(pf, xr[-1] * bw)),
            fontsize=7,
            ha="right",
            va="bottom",
            color="0.35",
        )
    backends = sorted({r.backend for r in pts})
    for i, b in enumerate(backends):
        mine = [r for r in pts if r.backend == b]
        ax.scatter(
            [r.derived["intensity"] for r in mine],
            [r.derived["tflops"] for r in mine],
            s=14,
            color=_COLORS[i % len(_COLORS)],
            label=b,
            alpha=0.85,
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("arithmetic intensity, FLOP/byte")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{op}: roofline (measured peaks)")
    return _png(fig)


def change_plot(changes) -> str | None:
    """Compare: the relative change of every timed row, sorted, with each row's threshold band."""
    timed = sorted((c for c in changes if c.change is not None), key=lambda c: c.change)
    if not timed:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = range(len(timed))
    colors = {"slower": "#cf222e", "faster": "#1a7f37", "noisy": "#9a6700"}
    ax.fill_between(
        x,
        [-100 * c.threshold for c in timed],
        [100 * c.threshold for c in timed],
        color="0.9",
        step="mid",
        label="threshold max(3%, 3 CV)",
    )
    ax.scatter(
        x,
        [100 * c.change for c in timed],
        s=10,
        zorder=3,
        c=[colors.get(c.verdict, "#57606a") for c in timed],
    )
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xlabel("rows, sorted by change")
    ax.set_ylabel("median change, % (new vs base)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("speed changes (red: slower, green: faster, amber: noisy)")
    return _png(fig)


def _seq_len(params: dict) -> int | None:
    if "kv_len" in params:
        return params["kv_len"]
    if "q_len" in params:
        return params.get("prefix_len", 0) + params["q_len"]
    return None


def error_vs_length(rows, op: str) -> str | None:
    """Relative max error of `o` (max |out - ref| / max |ref|) against sequence length, per backend and distribution."""
    pts = defaultdict(list)
    for r in rows:
        m = (r.metrics or {}).get("o", {})
        L = _seq_len(r.params)
        if r.op == op and L and m.get("scale") and "max_abs" in m and m["max_abs"] < float("inf"):
            pts[(r.backend, r.params.get("distribution", "normal"))].append((L, max(m["max_abs"] / m["scale"], 1e-9)))
    if len({L for v in pts.values() for L, _ in v}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    backends = sorted({b for b, _ in pts})
    dists = sorted({d for _, d in pts})
    markers = "os^vD<>xP*"
    for (b, d), v in sorted(pts.items()):
        v.sort()
        xs, ys = [x for x, _ in v], [y for _, y in v]
        ax.plot(xs, ys, marker=markers[dists.index(d) % len(markers)], ls="", ms=4, alpha=0.75,
                color=_COLORS[backends.index(b) % len(_COLORS)], label=f"{b} / {d}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (keys per request)")
    ax.set_ylabel("max |o - ref| / max |ref|")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{op}: error growth with length, per backend / distribution")
    return _png(fig)


def error_heatmap(heat: list[list[float]], title: str, xlabel: str, ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(6, 2.8))
    im = ax.imshow(heat, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="max abs error")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return _png(fig)
