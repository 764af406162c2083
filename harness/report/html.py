"""report.html: one self-contained page (inline CSS, JS and PNG plots; no network).

Sections: overview, measurement (timing modes, throttling, NVML clocks, peaks, harness cost),
capability matrix, one section per op (plots, error heatmaps, results and correctness tables),
speedup over a baseline backend, environment, conventions.
"""

from __future__ import annotations

import html
import math
import shlex
import statistics
from collections import Counter
from importlib import resources

import jinja2

from attnbench.capability import matrix_from_rows
from attnbench.report import plots
from attnbench.results import status_counts
from attnbench.tolerance import DEFAULT_FACTOR, DEFAULT_FLOOR

_AXES = ("kv_len", "q_len", "prefix_len", "batch", "tokens")


def asset(name: str) -> str:
    return resources.files("attnbench.report").joinpath(name).read_text(encoding="utf-8")


def template(name: str) -> jinja2.Template:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined)
    env.filters["fmt"] = fmt
    return env.from_string(asset(name))


def fmt(x, digits: int = 3) -> str:
    if x is None or x == "":
        return ""
    if isinstance(x, float):
        if x == 0:
            return "0"
        if math.isinf(x) or math.isnan(x):
            return str(x)
        if abs(x) >= 1e5 or abs(x) < 1e-2:
            return f"{x:.{digits - 1}e}"
        if abs(x) >= 10**digits:
            return f"{x:.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def _plugins(run: dict) -> list[str]:
    argv, out = list(run.get("argv") or []), []
    for i, a in enumerate(argv):
        if a == "--plugin" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--plugin="):
            out.append(a.split("=", 1)[1])
    return out


def repro(r, run: dict) -> str:
    """The command that re-runs one row alone."""
    parts = ["attnbench", "sweep", "--case", r.case_id, "--backend", r.backend]
    if run.get("device"):  # the run's device (a run from before run.json named it: env.json's)
        parts += ["--device", run["device"]]
    for p in run.get("plugins") or _plugins(run):
        parts += ["--plugin", p]
    return shlex.join(parts)


def _flags(t: dict) -> list[dict]:
    out = []
    if t.get("mode") == "cuda-graph":
        out.append(
            {
                "s": "G",
                "t": f"CUDA graph: {t.get('calls_per_sample')} calls per replay over {t.get('copies')} "
                f"input copies ({fmt((t.get('working_set_bytes') or 0) / 2**20)} MiB rotated)",
            }
        )
    if not t.get("converged", True):
        out.append({"s": "*", "t": "the CI target was not met within the time/count budget"})
    if t.get("n_throttled"):
        used = " (used: too few clean ones)" if t.get("throttled") else " (set aside and retaken)"
        out.append(
            {
                "s": "T",
                "t": f"{t['n_throttled']} samples ran throttled{used}: {', '.join(t.get('throttle', []))}",
            }
        )
    return out


def _row_view(r, run: dict, base_us: float | None) -> dict:
    t, d, m = r.timing or {}, r.derived or {}, r.metrics or {}
    errs = []
    for name, mm in m.items():
        if mm.get("exact"):
            errs.append(f"{name} {'exact' if not mm['wrong'] else str(mm['wrong']) + ' wrong'}")
        elif "max_abs" in mm:
            errs.append(f"{name} {fmt(mm['max_abs'])} / {fmt(mm['bound'])}")
    med = t.get("median_us")
    ci = t.get("ci95_us") or [None, None]
    speedup = base_us / med if base_us and med else None
    return {
        "case": r.case_id,
        "backend": r.backend,
        "status": r.status,
        "reason": r.reason,
        "errors": errs,
        "median": med,
        "median_s": fmt(med),
        "ci": f"{fmt(ci[0])}–{fmt(ci[1])}" if t else "",
        "spread": f"{fmt(t.get('p10_us'))}–{fmt(t.get('p90_us'))}" if t else "",
        "min": fmt(t.get("min_us")),
        "cv": f"{100 * t['cv']:.1f}%" if t else "",
        "cv_v": t.get("cv"),
        "n": t.get("n", ""),
        "flags": _flags(t) if t else [],
        "tflops": fmt(d.get("tflops")) if t else "",
        "tbps": fmt(d.get("tbps")) if t else "",
        "ai": fmt(d.get("intensity")),
        "roof": f"{d['roofline_pct']:.0f}%" if "roofline_pct" in d else "",
        "roof_v": d.get("roofline_pct"),
        "limiter": d.get("limiter", ""),
        "speedup": f"{speedup:.2f}×" if speedup else "",
        "speedup_v": speedup,
        "prepare": fmt(r.prepare_s),
        "prepare_info": ", ".join(f"{k} {fmt(v)}" for k, v in (r.prepare_info or {}).items()),
        "repro": repro(r, run),
        "why": r.tolerance_why,
    }


def _correctness_rows(op_rows) -> list[dict]:
    out = []
    for r in op_rows:
        for name, mm in (r.metrics or {}).items():
            row = {"case": r.case_id, "backend": r.backend, "status": r.status, "output": name}
            if mm.get("exact"):
                row |= {"exact": True, "wrong": mm.get("wrong", 0)}
            else:
                ratio = mm["max_abs"] / mm["bound"] if mm.get("bound") and "max_abs" in mm else None
                row |= {
                    "max_abs": fmt(mm.get("max_abs")),
                    "bound": fmt(mm.get("bound")),
                    "ratio": fmt(ratio),
                    "ratio_v": ratio,
                    "max_rel": fmt(mm.get("max_rel")),
                    "rel_l2": fmt(mm.get("rel_l2")),
                    "cos": f"{mm['cos']:.6f}" if mm.get("cos") is not None else "",
                    "mismatch": f"{100 * mm['mismatch']:.3g}%" if mm.get("mismatch") is not None else "",
                    "nonfinite": mm.get("nonfinite", ""),
                    "twin": fmt(mm.get("twin_max_abs")),
                    "worst": " ".join(f"{k} {v}" for k, v in (mm.get("worst") or {}).items()),
                }
            out.append(row)
    return out


def _heatmaps(op_rows) -> list[dict]:
    heat = []
    for r in op_rows:
        for out, mm in (r.metrics or {}).items():
            if r.status == "fail" and mm.get("heat"):
                worst = " ".join(f"{k} {v}" for k, v in (mm.get("worst") or {}).items())
                heat.append(
                    {
                        "title": f"{r.case_id} [{r.backend}] {out}: max abs {fmt(mm.get('max_abs'))} "
                        f"(bound {fmt(mm.get('bound'))}), worst at {worst}",
                        "png": plots.error_heatmap(
                            mm["heat"],
                            f"{r.backend}: |{out} - ref| per head and row",
                            "row (binned to at most 64)",
                            "head",
                        ),
                    }
                )
    return heat


def _baseline_medians(rows, baseline: str) -> dict[str, float]:
    return {r.case_id: r.timing["median_us"] for r in rows if r.backend == baseline and r.timing}


def speedups(rows, baseline: str) -> list[dict]:
    """Per op and backend: geometric-mean speedup over `baseline`, and wins/losses, on cases both timed."""
    base = _baseline_medians(rows, baseline)
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.backend != baseline and r.timing and r.case_id in base and r.timing["median_us"] > 0:
            acc.setdefault((r.op, r.backend), []).append(base[r.case_id] / r.timing["median_us"])
    return [
        {
            "op": op,
            "backend": b,
            "speedup": fmt(math.exp(sum(map(math.log, v)) / len(v))),
            "cases": len(v),
            "min": fmt(min(v)),
            "max": fmt(max(v)),
            "wins": sum(x > 1 for x in v),
        }
        for (op, b), v in sorted(acc.items())
    ]


def measurement(rows) -> dict:
    """Timing modes, fallbacks, throttling and NVML ranges over the timed rows."""
    timed = [r for r in rows if r.timing]
    modes = Counter(f"{r.timing.get('clock')} / {r.timing.get('mode', 'per-call')}" for r in timed)
    notes = Counter(r.timing["note"] for r in timed if r.timing.get("note"))
    snaps = [s for r in timed for s in ((r.timing.get("nvml") or {}).values()) if s]

    def rng(key):
        v = [s[key] for s in snaps if s.get(key) is not None]
        return (min(v), statistics.median(v), max(v)) if v else None

    return {
        "timed": len(timed),
        "modes": sorted(modes.items()),
        "notes": notes.most_common(8),
        "unconverged": sum(not r.timing.get("converged", True) for r in timed),
        "throttled_rows": sum(bool(r.timing.get("n_throttled")) for r in timed),
        "throttled_used": sum(bool(r.timing.get("throttled")) for r in timed),
        "throttle_reasons": Counter(x for r in timed for x in r.timing.get("throttle", [])).most_common(6),
        "nvml": bool(snaps),
        "sm": rng("sm_mhz"),
        "mem": rng("mem_mhz"),
        "temp": rng("temp_c"),
        "power": rng("power_w"),
        "sm_max": next((s.get("sm_max_mhz") for s in snaps if s.get("sm_max_mhz")), None),
        "power_limit": next((s.get("power_limit_w") for s in snaps if s.get("power_limit_w")), None),
    }


def harness_cost(rows, run: dict) -> dict:
    """Where the run's wall time went: references, prepares, checks, timing (of which kernel time)."""
    per_case_ref = {r.case_id: r.reference_s for r in rows if r.reference_s}
    per_case_timing = {r.case_id: r.timing.get("wall_s", 0.0) for r in rows if r.timing}
    parts = {
        "precompile (batched JIT before the cases)": sum(r.get("s", 0.0) for r in run.get("precompile", [])),
        "float64 references (+ native twins, inputs)": sum(per_case_ref.values()),
        "prepare (layout, plan, JIT, compile)": sum(r.prepare_s or 0.0 for r in rows),
        "correctness checks": sum(r.check_s or 0.0 for r in rows),
        "timing (warm-up, pilot, graph capture, sampling)": sum(per_case_timing.values()),
    }
    kernel = sum(r.timing.get("kernel_s", 0.0) for r in rows if r.timing)
    wall = run.get("wall_s")
    out = [{"what": k, "s": v, "pct": 100 * v / wall if wall else None} for k, v in parts.items()]
    if wall:
        out.append(
            {
                "what": "other (input copies, stale-output runs, writing)",
                "s": wall - sum(parts.values()),
                "pct": 100 * (wall - sum(parts.values())) / wall,
            }
        )
    return {"parts": out, "kernel_s": kernel, "wall_s": wall, "complete": run.get("complete", True)}


def peaks_view(env: dict) -> list[dict]:
    p = env.get("peaks") or {}
    m, s = p.get("measured") or {}, p.get("spec") or {}
    rows = []
    for label, mk, sk, unit in (
        ("copy bandwidth (read + write)", "copy_tbps", "hbm_tbps", "TB/s"),
        ("dense bf16 matmul", "bf16_tflops", "bf16_tflops", "TFLOP/s"),
        ("dense fp16 matmul", "fp16_tflops", "fp16_tflops", "TFLOP/s"),
        ("dense fp32 matmul (no TF32)", "fp32_tflops", None, "TFLOP/s"),
    ):
        if mk in m:
            spec = s.get(sk) if sk else None
            rows.append(
                {
                    "what": label,
                    "measured": fmt(m[mk]),
                    "spec": fmt(spec) if spec else "",
                    "unit": unit,
                    "pct": f"{100 * m[mk] / spec:.0f}%" if spec else "",
                }
            )
    return rows


def determinism(rows) -> list[dict]:
    """Per backend: how many checked rows were deterministic / batch invariant."""
    out = []
    for b in sorted({r.backend for r in rows}):
        mine = [r for r in rows if r.backend == b]
        det = [r.deterministic for r in mine if r.deterministic is not None]
        inv = [r.batch_invariant for r in mine if r.batch_invariant is not None]
        if det or inv:
            out.append({"backend": b, "det": f"{sum(det)}/{len(det)}", "inv": f"{sum(inv)}/{len(inv)}" if inv else "not checked",
                        "nondet": [r.case_id for r in mine if r.deterministic is False][:5],
                        "variant": [r.case_id for r in mine if r.batch_invariant is False][:5]})  # fmt: skip
    return out


def default_baseline(rows) -> str:
    names = sorted({r.backend for r in rows})
    return "torch" if "torch" in names else (names[0] if names else "")


def render_html(rows, env: dict, run: dict, baseline: str | None = None) -> str:
    baseline = baseline or default_baseline(rows)
    by_backend = status_counts(rows)
    names, cap = matrix_from_rows(rows)
    base_us = _baseline_medians(rows, baseline)
    sections = []
    for op in dict.fromkeys(r.op for r in rows):
        op_rows = [r for r in rows if r.op == op]
        figs = [plots.latency_by_case(op_rows, op), plots.roofline(op_rows, op, env.get("peaks"))]
        figs.append(plots.error_vs_length(op_rows, op))
        figs += [plots.latency_vs_axis(op_rows, op, a) for a in _AXES]
        heat = _heatmaps(op_rows)
        sections.append(
            {
                "op": op,
                "rows": [_row_view(r, run, base_us.get(r.case_id) if r.backend != baseline else None) for r in op_rows],
                "correctness": _correctness_rows(op_rows),
                "figs": [f for f in figs if f],
                "heat": heat[:12],
                "heat_more": max(0, len(heat) - 12),
            }
        )
    return template("template.html.j2").render(
        rows=rows,
        env=env,
        run=run,
        counts=by_backend,
        total=Counter(r.status for r in rows),
        cases=len({r.case_id for r in rows}),
        cap_names=names,
        cap=cap,
        determinism=determinism(rows),
        sections=sections,
        speedups=speedups(rows, baseline),
        baseline=baseline,
        backends=names,
        meas=measurement(rows),
        cost=harness_cost(rows, run),
        peaks=peaks_view(env),
        factor=DEFAULT_FACTOR,
        floor=DEFAULT_FLOOR,
        css=asset("style.css"),
        js=asset("tables.js"),
        esc=html.escape,
    )
