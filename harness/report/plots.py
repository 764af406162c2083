"""Plots for the report, drawn by matplotlib (Agg) as inline SVG data URIs (text stays text: small pages).

Every speed plot draws only rows that may be ranked (passed, GPU clock; attnbench.report.ranking);
legends sit outside the data; lines carry their backend's name at their end.
"""

from __future__ import annotations

import io
import math
import re
from collections import defaultdict
from urllib.parse import quote

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from attnbench.report import ranking  # noqa: E402

_COLORS = [*plt.rcParams["axes.prop_cycle"].by_key()["color"], "#000000", "#b8860b", "#00a0a0", "#e7298a", "#66a61e"]
_AXES = ("kv_len", "q_len", "prefix_len", "tokens", "batch")
_RASTER = 60  # scatters with more points than this are drawn as an image inside the SVG (axes and text stay vector)
_PAD = 0.1  # inches around the artists (savefig's pad_inches default)
_STYLE = {"svg.fonttype": "none", "font.size": 8, "axes.titlesize": 9, "svg.hashsalt": "attnbench"}


_FLOAT = re.compile(r"(\d\.\d)\d+")
_ATTR = re.compile(r'="([^"]*)"')
_NOISE = re.compile(r"<!--.*?-->|<!DOCTYPE[^>]*>|\s+id=\"(?:[a-z]+[a-z0-9]*_\d+)\"|\n\s*", re.S)


def minify_svg(svg: str) -> str:
    """matplotlib's SVG without comments, indentation, unreferenced element ids, or coordinates finer than
    0.1 px, with attributes in single quotes (about half the size; a browser draws the same)."""
    svg = _NOISE.sub(lambda m: " " if m.group(0).startswith("\n") else "", svg)
    svg = _ATTR.sub(lambda m: "='" + _FLOAT.sub(r"\1", m.group(1).replace("'", "")) + "'", svg)
    return svg.replace("> <", "><")


def _uri(fig) -> str:
    """The figure as an SVG data URI (percent-encoded text, not base64: a third smaller). Safe to put
    into a double-quoted HTML attribute unescaped: it holds no `"` and no `&`.

    Cropped to its artists as `bbox_inches="tight"` would, but that draws the whole figure twice (once
    to find the box, once to write it). The box comes from the Agg renderer's layout instead (text
    extents, no drawing; its font metrics differ from the SVG writer's by a pixel or two): the report of
    reports/examples/h100-session11/ci-warm (git history, e281b29) renders in 2.6 s instead of 3.0 s."""
    buf = io.StringIO()
    with plt.rc_context(_STYLE):
        box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(_PAD)
        fig.savefig(buf, format="svg", bbox_inches=box, metadata={"Date": None}, dpi=130)
    plt.close(fig)
    return "data:image/svg+xml," + quote(minify_svg(buf.getvalue()), safe=" <>/=:;,.'()-_!*~+?[]{}@$")


def _color(names: list[str], b: str) -> str:
    """A backend's colour: its place among all the run's backends (the same in every plot)."""
    return _COLORS[names.index(b) % len(_COLORS)]


def _legend_outside(fig, backends: list[str], names: list[str]) -> None:
    handles = [plt.Line2D([], [], color=_color(names, b), marker="o", ms=4, label=b) for b in backends]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(6, len(backends)),
               frameon=False, fontsize=8)  # fmt: skip


def _axis(rows) -> str | None:
    """The swept length-like parameter with the most distinct values (at least 3)."""
    best, most = None, 2
    for a in _AXES:
        vals = {r.params.get(a) for r in rows if isinstance(r.params.get(a), (int, float)) and r.params.get(a) > 0}
        if len(vals) > most:
            best, most = a, len(vals)
    return best


CAP = 8.0  # a panel's y axis ends at the highest point, or here; points above are drawn on the edge with their value
_TICKS = (1, 1.05, 1.1, 1.25, 1.5, 2, 3, 4, 6, 8)


def ratio_ticks(top: float) -> list[float]:
    """Readable ticks of a time-over-best axis up to `top`: 1×, 1.5×, 2×, 4×… (at most 6, coarse ones kept)."""
    ticks = [t for t in _TICKS if t <= top * 1.001]
    while len(ticks) > 6:
        fine = [t for t in ticks if t not in (1, 2, 4, 8)]
        ticks.remove(fine[0] if len(fine) < 3 else fine[len(fine) // 2 - 1])
    return ticks


def spread(fracs: list[float], gap: float) -> list[float]:
    """Positions (axis fractions) moved apart by at least `gap`, in their order, as little as possible:
    where labels of nearby points go so that they do not overlap."""
    order = sorted(range(len(fracs)), key=lambda i: fracs[i])
    out = list(fracs)
    for prev, i in zip(order, order[1:], strict=False):
        out[i] = max(out[i], out[prev] + gap)
    shift = max(0.0, out[order[-1]] - max(1.0, fracs[order[-1]])) if order else 0.0
    return [x - shift for x in out]


def _short_us(t: float) -> str:
    return f"{t:.3g}" if t < 1000 else f"{t / 1000:.3g}k"


def latency_panels(rows, op: str, max_panels: int = 12, names: list[str] | None = None) -> tuple[str | None, str]:
    """Small multiples: latency against the op's swept length, one panel per setting of every other
    parameter that varies, one labelled line per backend (passing GPU-timed rows only). Each line is the
    backend's time over the best time at that length (log), so close backends stay apart; the best
    time in µs is written under each length. Every panel has its own y range, set after drawing, up to
    CAP: a point above it sits on the edge as a triangle labelled with its value; no data leaves a panel."""
    ok = [r for r in rows if r.op == op and ranking.rankable(r)]
    axis = _axis(ok)
    if not axis:
        return None, ""
    ok = [r for r in ok if isinstance(r.params.get(axis), (int, float)) and r.params[axis] > 0]
    keys = {k for r in ok for k in r.params if k != axis}
    varying = sorted(k for k in keys if len({str(r.params.get(k)) for r in ok}) > 1)
    panels: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    ids: dict[tuple, set] = defaultdict(set)
    for r in ok:
        key = tuple((k, str(r.params.get(k))) for k in varying) + (("dtype", r.dtype),)
        panels[key][r.backend].append((r.params[axis], ranking.median_us(r)))
        ids[key].add(r.case_id.split("/", 1)[-1])
    panels = {k: v for k, v in panels.items() if len({x for pts in v.values() for x, _ in pts}) >= 2}
    if not panels:
        return None, ""
    chosen = sorted(panels, key=lambda k: -sum(len(v) for v in panels[k].values()))[:max_panels]
    chosen.sort(key=lambda k: [str(v) for _, v in k])
    backends = sorted({b for k in chosen for b in panels[k]})
    names = names or backends
    ncol = min(4, len(chosen))
    nrow = math.ceil(len(chosen) / ncol)
    fig, axs = plt.subplots(nrow, ncol, figsize=(3.1 * ncol, 2.3 * nrow + 0.4), squeeze=False)
    for ax, key in zip(axs.flat, chosen, strict=False):
        _latency_panel(ax, panels[key], names)
        ax.set_title(panel_label(ids[key]) or op, fontsize=7)
        ax.set_xlabel(axis, fontsize=7.5)
    for ax in axs.flat[len(chosen) :]:
        ax.set_visible(False)
    for ax in axs[:, 0]:
        ax.set_ylabel("time / best (log)")
    _legend_outside(fig, backends, names)
    fig.tight_layout()
    note = f"{len(chosen)} of {len(panels)} panels" if len(panels) > len(chosen) else ""
    return _uri(fig), note


def _latency_panel(ax, lines: dict[str, list], names: list[str]) -> None:
    best: dict[float, float] = {}
    for pts in lines.values():
        for x, t in pts:
            best[x] = min(best.get(x, t), t)
    drawn = {}
    for b, pts in sorted(lines.items()):
        pts.sort()
        xs, ys = [p[0] for p in pts], [p[1] / best[p[0]] for p in pts]
        drawn[b] = (xs, ys)
    top = min(CAP, max(y for _, ys in drawn.values() for y in ys))
    top = max(top * 1.12, 1.12)
    bottom = 0.8
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(bottom, top)
    span = math.log(top / bottom)
    ends = []
    for b, (xs, ys) in drawn.items():
        c = _color(names, b)
        shown = [min(y, CAP) for y in ys]
        ax.plot(xs, shown, "-o", ms=3, lw=1.2, color=c)
        for x, y in zip(xs, ys, strict=True):
            if y > CAP:  # clipped: a triangle on the edge, with its value
                ax.plot([x], [CAP], marker="^", ms=6, color=c, clip_on=False)
                ax.annotate(f"{y:.3g}×", (x, CAP), xytext=(0, 5), textcoords="offset points", fontsize=6.5,
                            color=c, ha="center", va="bottom", annotation_clip=False)  # fmt: skip
        ends.append((b, xs[-1], shown[-1]))
    # backend names at their lines' ends, moved apart so that none overlaps another
    fracs = [math.log(y / bottom) / span for _, _, y in ends]
    height_pt = ax.get_window_extent().height * 72 / ax.figure.dpi
    for (b, x, y), f, g in zip(ends, fracs, spread(fracs, 9 / max(height_pt, 1)), strict=True):
        ax.annotate(b, (x, y), xytext=(3, (g - f) * height_pt), textcoords="offset points", fontsize=7,
                    color=_color(names, b), va="center", annotation_clip=False)  # fmt: skip
    # the absolute scale: the best time at each length, staggered where neighbours are close
    xs = sorted(best)
    lx = [math.log2(x) for x in xs]
    close = (max(lx) - min(lx)) * 0.16 if len(lx) > 1 else 1.0
    last = {0: -math.inf, 1: -math.inf}
    for x, l in zip(xs, lx, strict=True):
        row = 0 if l - last[0] >= close else (1 if l - last[1] >= close else None)
        if row is None:
            continue  # a third label this close would overlap: its time is in the winners view and tables
        last[row] = l
        ax.annotate(_short_us(best[x]), (x, 1), xytext=(0, -3 - 7 * row), textcoords="offset points", fontsize=6,
                    color="0.4", ha="center", va="top")  # fmt: skip
    ticks = ratio_ticks(top)
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.margins(x=0.25)
    ax.grid(which="major", alpha=0.25)


def fast_p(rows, op: str, names: list[str] | None = None) -> str | None:
    """fast_p (flashinfer-bench's): per backend, the fraction of the op's cases on which it is correct and
    within p× of the case's best time, for p from 1 to 4 (a step curve: higher and further left is better).
    Cases: those with a ranked row (ranking.ranks). A backend ranked only as a known finding is marked †."""
    wins = {cid: w for cid, w in ranking.case_winners(rows).items() if w.op == op}
    if len(wins) < 2:
        return None
    backends = sorted({b for w in wins.values() for b in w.times})
    names = names or backends
    ps = [1.0 + 3.0 * i / 300 for i in range(301)]
    fig, ax = plt.subplots(figsize=(5.6, 3.2))
    for b in backends:
        ratios = [w.times[b] / w.best_us for w in wins.values() if b in w.times]
        ys = [sum(x <= p * (1 + 1e-9) for x in ratios) / len(wins) for p in ps]
        marked = any(w.marks.get(b) for w in wins.values())
        ax.step(ps, ys, where="post", lw=1.4, color=_color(names, b), label=b + (" †" if marked else ""))
    ax.set_xscale("log")
    ax.set_xlim(1, 4)
    ax.set_ylim(-0.02, 1.05)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([1, 1.25, 1.5, 2, 3, 4]))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.set_xlabel("p: time within p× of the case's best")
    ax.set_ylabel(f"cases correct and within p× (of {len(wins)})")
    ax.grid(which="major", alpha=0.25)
    ax.set_title(f"{op}: fast_p (passing GPU-timed rows; † known finding, ranked on its passing outputs)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _uri(fig)


def panel_label(case_ids: set[str]) -> str:
    """What the cases of one panel share: the id segments common to all of them, in order
    (`b16-h32x8-d128-p16-bf16` for decode ids that differ only in `l…`), at most two lines."""
    split = [c.split("-") for c in sorted(case_ids)]
    common = [seg for seg in split[0] if all(seg in other for other in split[1:])]
    text = "-".join(common)
    if len(text) > 44:
        cut = text.rfind("-", 0, 44)
        text = text[:cut] + "\n" + text[cut + 1 :]
    return text


_PEAK_KEY = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp32": "fp32_tflops"}


def roofline(rows, op: str, peaks: dict | None, names: list[str] | None = None) -> str | None:
    """Achieved TFLOP/s against arithmetic intensity (log-log) below the measured roofs: passing rows only."""
    measured = (peaks or {}).get("measured") or {}
    bw = measured.get("copy_tbps")
    pts = [r for r in rows if r.op == op and ranking.rankable(r) and (r.derived or {}).get("intensity")]
    pts = [r for r in pts if r.derived.get("tflops")]
    if not pts or not bw:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    xs = [r.derived["intensity"] for r in pts]
    lo, hi = min(xs) / 10, max(xs) * 10
    for i, dt in enumerate(sorted({r.dtype for r in pts})):
        pf = measured.get(_PEAK_KEY.get(dt, ""))
        if not pf:
            continue
        xr = sorted({lo, min(max(pf / bw, lo), hi), hi})
        ax.plot(xr, [min(pf, x * bw) for x in xr], "--", color="0.45", lw=1)
        ax.annotate(f"{dt} roof: {pf:.0f} TFLOP/s, {bw:.2f} TB/s", (xr[-1], min(pf, xr[-1] * bw)), fontsize=7,
                    ha="right", va="top", color="0.35", xytext=(0, -2 - 10 * i), textcoords="offset points")  # fmt: skip
    backends = sorted({r.backend for r in pts})
    names = names or backends
    for b in backends:
        mine = [r for r in pts if r.backend == b]
        ax.scatter([r.derived["intensity"] for r in mine], [r.derived["tflops"] for r in mine], s=14,
                   color=_color(names, b), alpha=0.85, zorder=3, rasterized=len(pts) > _RASTER)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("arithmetic intensity, FLOP/byte")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(which="major", alpha=0.25)
    ax.set_title(f"{op}: roofline (passing rows, measured peaks)")
    _legend_outside(fig, backends, names)
    return _uri(fig)


def _seq_len(params: dict) -> int | None:
    if "kv_len" in params:
        return params["kv_len"]
    if "q_len" in params:
        return params.get("prefix_len", 0) + params["q_len"]
    return None


def error_vs_length(rows, op: str, names: list[str] | None = None) -> str | None:
    """Relative max error of `o` against sequence length, per backend (marker: distribution)."""
    pts = defaultdict(list)
    for r in rows:
        m = (r.metrics or {}).get("o", {})
        L = _seq_len(r.params or {})
        if r.op == op and L and m.get("scale") and "max_abs" in m and m["max_abs"] < float("inf"):
            pts[(r.backend, r.params.get("distribution", "normal"))].append((L, max(m["max_abs"] / m["scale"], 1e-9)))
    if len({L for v in pts.values() for L, _ in v}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    backends = sorted({b for b, _ in pts})
    names = names or backends
    dists = sorted({d for _, d in pts})
    markers = "os^vD<>xP*"
    many = sum(map(len, pts.values())) > _RASTER
    for (b, d), v in sorted(pts.items()):
        ax.plot([x for x, _ in v], [y for _, y in v], marker=markers[dists.index(d) % len(markers)], ls="", ms=4,
                alpha=0.75, color=_color(names, b), rasterized=many)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (keys per request)")
    ax.set_ylabel("max |o − ref| / max |ref|")
    ax.grid(which="major", alpha=0.25)
    ax.set_title(f"{op}: error growth with length")
    handles = [plt.Line2D([], [], color=_color(names, b), marker="o", ls="", label=b) for b in backends]
    if len(dists) > 1:
        handles += [plt.Line2D([], [], color="0.3", marker=markers[i % len(markers)], ls="", label=d)
                    for i, d in enumerate(dists)]  # fmt: skip
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=7)
    return _uri(fig)


HEAT_MAX = 2.0  # error heatmaps: error / bound from 0 to this (above: the top colour, the colour bar says so)


def error_heatmap(
    heat: list[list[float]], title: str, xlabel: str, ylabel: str, bound: float | None = None
) -> str | None:
    """Max abs error per (head, row bin) on a fixed scale, error / `bound` from 0 to HEAT_MAX (1: at the
    bound), the bound stated on the colour bar, so a uniform offset reads as uniform; NaN/Inf cells cyan.
    Without a bound, the absolute error. None when it carries no information (a single cell, or every
    finite cell equal and nothing non-finite)."""
    vals = [x for row in heat for x in row]
    bad = [x for x in vals if x is None or not math.isfinite(x)]
    finite = [x for x in vals if x is not None and math.isfinite(x)]
    if len(vals) < 2 or (not bad and max(finite) - min(finite) <= 1e-12 * max(1.0, max(finite))):
        return None
    scaled = bool(bound) and bound > 0 and math.isfinite(bound)
    data = [[float("nan") if x is None or not math.isfinite(x) else (x / bound if scaled else x) for x in row]
            for row in heat]  # fmt: skip
    cmap = matplotlib.colormaps["magma"].with_extremes(bad="#00c8d7")
    fig, ax = plt.subplots(figsize=(5.2, 2.4))
    kw = {"vmin": 0.0, "vmax": HEAT_MAX} if scaled else {}
    im = ax.imshow(data, aspect="auto", cmap=cmap, interpolation="nearest", **kw)
    if finite:
        if scaled:
            top = max(finite) / bound
            cb = fig.colorbar(im, ax=ax, extend="max" if top > HEAT_MAX else "neither",
                              label=f"max abs error / bound\n(bound {bound:.3g}; 1 = at the bound)")  # fmt: skip
            cb.ax.axhline(1.0, color="white", lw=1)
        else:
            fig.colorbar(im, ax=ax, label="max abs error")
    if bad:
        title += f" — {len(bad)} of {len(vals)} cells NaN/Inf (cyan)"
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=8)
    return _uri(fig)


def change_plot(changes) -> str | None:
    """Compare: new/base median ratio of every timed row (log scale), sorted, with each row's threshold band."""
    timed = sorted((c for c in changes if c.change is not None and c.change > -1), key=lambda c: c.change)
    if not timed:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = range(len(timed))
    colors = {"slower": "#cf222e", "faster": "#1a7f37", "noisy": "#9a6700"}
    ax.fill_between(x, [1 / (1 + c.threshold) for c in timed], [1 + c.threshold for c in timed], color="0.9",
                    step="mid", label="threshold max(3%, 3 CV)")  # fmt: skip
    ax.scatter(x, [1 + c.change for c in timed], s=10, zorder=3, c=[colors.get(c.verdict, "#57606a") for c in timed],
               rasterized=len(timed) > _RASTER)  # fmt: skip
    ax.axhline(1, color="0.5", lw=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.2g}×"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("rows, sorted by change")
    ax.set_ylabel("new / base median (log)")
    ax.grid(axis="y", which="major", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("speed changes (red: slower, green: faster, amber: noisy)")
    return _uri(fig)
