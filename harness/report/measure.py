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


CHECK_KINDS = {  # the built-in checks' names in a row's check_parts, in the order they run (checklist.py)
    "outputs": "checks: outputs against the reference",
    "determinism": "checks: determinism repeats",
    "invariance": "checks: batch invariance",
    "stale": "checks: stale-output run",
    "replay": "checks: CUDA-graph replay",
}


def check_kinds(rows) -> dict[str, str]:
    """Every check the rows timed (`check_parts`), built-in ones first in their order, then any other
    (a plugin's check) as "checks: <name>": each is an item of the wall breakdown, none is "other"."""
    seen = {k: None for r in rows for k in (r.check_parts or {})}
    return {k: what for k, what in CHECK_KINDS.items() if k in seen} | {
        k: f"checks: {k}" for k in seen if k not in CHECK_KINDS
    }


def counted_rows(rows: list, run: dict) -> list:
    """The rows whose seconds `run`'s wall time holds, in the order of the results file.

    A sweep's `wall_s` is its own process's: a resumed sweep (run.json `resumed`) keeps the rows of the
    earlier processes first in results.jsonl (a sweep only appends), `resumed[-1].rows_kept` of them,
    and their seconds were spent inside those processes' walls, so they are left out. A merge's
    `wall_s` is the sum of its runs' walls: each run's rows follow one another in merge order
    (`merged_from`, with `rows` each) and the first `kept` rows of each (its earlier processes' rows, or
    all of a run that recorded no wall) are left out. Where run.json does not say (older files, row
    counts that disagree with the file), every row counts.
    """
    if run.get("kind") == "merge":
        sources = run.get("merged_from") or []
        if sum(src.get("rows", 0) for src in sources) != len(rows):
            return list(rows)
        out, at = [], 0
        for src in sources:
            n = src.get("rows", 0)
            out += rows[at + min(n, src.get("kept", 0)) : at + n]
            at += n
        return out
    resumed = run.get("resumed") or []
    kept = resumed[-1].get("rows_kept", 0) if resumed and isinstance(resumed[-1], dict) else 0
    return list(rows[kept:]) if isinstance(kept, int) and 0 < kept <= len(rows) else list(rows)


def timing_parts(by_case: dict[str, list], total: float) -> dict[str, float]:
    """The timing's seconds by phase (attnbench.run.timing.PHASES), summed over the cases (each case's
    from any of its rows); the cases of older runs, which kept no phases, as one "timing" item."""
    from attnbench.run.timing import PHASES

    got = {p: 0.0 for p in PHASES}
    seen = 0.0
    for rs in by_case.values():
        t = next((r.timing for r in rs if r.timing and r.timing.get("phases")), None)
        if t:
            for p, v in t["phases"].items():
                got[p] = got.get(p, 0.0) + v
            seen += t.get("wall_s", 0.0)
    out = {f"timing: {p}": v for p, v in got.items() if v}
    if total - seen > 1e-9 or not out:
        out["timing: (phases not recorded)" if out else "timing: warm-up, pilot, graph capture, sampling"] = (
            total - seen
        )
    return out


def harness_cost(rows, run: dict) -> dict:
    """Where the run's wall time went, item by item, and "other" (the wall time no item accounts for).

    Only the rows this wall time produced count (`counted_rows`): rows a resumed sweep kept from its
    earlier processes are left out (`rows_left_out`), so no item holds seconds spent outside the wall.

    Per case (counted once, from any of its rows): building inputs, the references (computed or loaded
    from the reference cache), the timing of all its backends, and the case's own bookkeeping (its
    time in the worker beyond the items: supports(), cost model, rows). Per row: prepare, the checked
    call (with the copy of the inputs it writes), each check. Per run (run.json `costs`): set-up
    (environment capture, peaks, git, run.json), precompile, worker start-up, writing the rows, messaging between the processes, worker shutdown,
    and in a run stopped mid-way the cases its workers were running (they produced no rows). With several
    workers (`--gpus`) the items are machine time summed over them, measured against wall x workers.
    """
    costs = run.get("costs") or {}
    everything, rows = rows, counted_rows(list(rows), run)
    by_case: dict[str, list] = {}
    for r in rows:
        by_case.setdefault(r.case_id, []).append(r)

    def per_case(get) -> float:
        return sum(next((v for r in rs if (v := get(r))), 0.0) for rs in by_case.values())

    inputs = per_case(lambda r: r.inputs_s)
    refs = per_case(lambda r: r.reference_s)
    timing = per_case(lambda r: (r.timing or {}).get("wall_s"))
    kinds = check_kinds(rows)
    checks = {k: sum((r.check_parts or {}).get(k, 0.0) for r in rows) for k in kinds}
    unsplit = sum(r.check_s or 0.0 for r in rows if r.check_s and not r.check_parts)  # rows of older runs
    rows_s = sum((r.prepare_s or 0.0) + (r.call_s or 0.0) + (r.check_s or 0.0) for r in rows)
    case_s = per_case(lambda r: r.case_s)
    bookkeeping = max(0.0, case_s - inputs - refs - timing - rows_s) if case_s else 0.0
    made = {(r.case_id, r.reference_from) for r in rows if r.reference_from}
    computed = sum(src == "computed" for _, src in made)
    loaded = sum(src == "cache" for _, src in made)
    ref_what = "float64 references (+ native twins"
    ref_what += f"; {computed} computed, {loaded} from the cache)" if made else ", inputs)"
    parts = {
        "run set-up (environment, peaks, git, run.json, kept rows)": costs.get("setup_s", 0.0),
        # run.json before costs.precompile_s: the batched builds alone
        "precompile (available(), supports(), what to build; batched JIT before the cases)": costs.get(
            "precompile_s", sum(r.get("s", 0.0) for r in run.get("precompile", []))
        ),
        "worker start-up (import, load backends)": costs.get("worker_start_s", 0.0),
        "input building": inputs,
        ref_what: refs,
        "prepare (layout, plan, JIT, compile)": sum(r.prepare_s or 0.0 for r in rows),
        "checked calls (one per row, with its copy of the inputs)": sum(r.call_s or 0.0 for r in rows),
        **{what: checks[k] for k, what in kinds.items()},
        **timing_parts(by_case, timing),
        "per-case bookkeeping (supports, cost model, rows)": bookkeeping,
        "writing rows (results.jsonl, fsynced) and progress": costs.get("record_s", 0.0),
        # a worker's job ends when its rows are written: what is left is sending cases and rows between processes
        "worker messaging (cases and rows between processes)": max(
            0.0, costs.get("jobs_s", 0.0) - case_s - costs.get("record_s", 0.0)
        )
        if costs.get("jobs_s")
        else 0.0,
        "worker shutdown": costs.get("worker_stop_s", 0.0),
        "cases cut off when the run stopped (no rows)": costs.get("unfinished_s", 0.0),
    }
    if unsplit:
        parts["correctness checks"] = unsplit
    parts = {k: v for k, v in parts.items() if v or k.startswith(("float64", "prepare", "timing:", "precompile"))}
    kernel = sum(r.timing.get("kernel_s", 0.0) for r in rows if r.timing)
    wall = run.get("wall_s")
    workers = max(1, len(run.get("devices") or ())) if run.get("executor") == "isolated" else 1
    budget = wall * workers if wall else None
    out = [{"what": k, "s": v, "pct": 100 * v / budget if budget else None} for k, v in parts.items()]
    if budget:
        rest = budget - sum(parts.values())
        out.append({"what": "other (not attributed)", "s": rest, "pct": 100 * rest / budget})
    return {
        "parts": out,
        "kernel_s": kernel,
        "wall_s": wall,
        "rows_counted": len(rows),
        "rows_left_out": len(everything) - len(rows),
        "workers": workers,
        "report_s": costs.get("report_s"),
        "references": run.get("references"),
        "complete": run.get("complete", True),
    }


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
