"""Measurement context of a run: timing modes and throttling, NVML ranges, harness cost, peaks, determinism."""

from __future__ import annotations

import statistics
from collections import Counter

from attnbench.report.common import fmt


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
