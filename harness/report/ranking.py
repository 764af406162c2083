"""Who is fastest: only rows that passed, and only GPU timings, are ever ranked or turned into speedups.

A failing, erroring, xfail or xpass row keeps its timing in the tables (marked) but never wins, never
sets the "best" a ratio is taken against, and never appears in a speedup. Host-clock timings (CPU) and
Triton under TRITON_INTERPRET=1 are labelled and never compared with anything.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass

from attnbench.counts import FAILING, status_of
from attnbench.results import Status

GPU = "gpu"
HOST = "host clock (CPU)"
INTERPRETER = "host clock under TRITON_INTERPRET=1 (Triton kernels interpreted)"


def timing_kind(r) -> str | None:
    """What clock a row's timing came from: GPU, HOST or INTERPRETER (None when untimed)."""
    t = r.timing
    if not t:
        return None
    env = r.env or {}
    interp = t.get("interpreter") or env.get("triton_interpret") or str(env.get("TRITON_INTERPRET", "")) == "1"
    if interp or "interpret" in str(t.get("clock", "")):
        return INTERPRETER
    return GPU if t.get("clock") == "cuda-events" else HOST


def rankable(r) -> bool:
    """A row whose time may be ranked: it passed (not xpass: a row that fails the run is never ranked) and
    it was timed on a GPU clock."""
    ok = status_of(r) == Status.PASS.value
    return ok and timing_kind(r) == GPU and (r.timing.get("median_us") or 0) > 0


def median_us(r) -> float | None:
    return (r.timing or {}).get("median_us")


def shape_class(r) -> str:
    """The class a case is summarised under: op, head layout (first feature), batch regime; a replayed
    extend batch (explicit `q_lens`, docs/trace.md) also by its mix: decodes, prefill chunks or both."""
    parts = [r.op]
    if r.features:
        parts.append(r.features[0])
    q = (r.params or {}).get("q_lens")
    if r.op == "extend" and isinstance(q, list | tuple) and q:
        parts.append("all q=1" if max(q) == 1 else ("all q>1" if min(q) > 1 else "mixed q"))
    b = (r.params or {}).get("batch")
    if isinstance(b, int):
        parts.append("b=1" if b == 1 else ("b≤16" if b <= 16 else "b>16"))
    return " · ".join(parts)


_REGIMES = {"b=1": 0, "b≤16": 1, "b>16": 2}


def _class_order(cls: str) -> tuple:
    """Classes by op and layout, then batch regimes small to large."""
    head, _, last = cls.rpartition(" · ")
    return (head, _REGIMES[last], "") if last in _REGIMES else (cls, -1, "")


@dataclass
class CaseWinner:
    case_id: str
    op: str
    cls: str
    best: str  # the fastest passing backend
    best_us: float
    runner_up: str | None
    margin: float | None  # runner-up time / best time (>= 1)
    roofline_pct: float | None
    passing: int  # how many backends passed and were GPU-timed


def case_winners(rows) -> dict[str, CaseWinner]:
    """Per case with at least one rankable row: the fastest passing backend and its margin."""
    by_case: dict[str, list] = {}
    for r in rows:
        if rankable(r):
            by_case.setdefault(r.case_id, []).append(r)
    out = {}
    for cid, rs in by_case.items():
        rs.sort(key=median_us)
        best = rs[0]
        second = rs[1] if len(rs) > 1 else None
        out[cid] = CaseWinner(
            case_id=cid,
            op=best.op,
            cls=shape_class(best),
            best=best.backend,
            best_us=median_us(best),
            runner_up=second.backend if second else None,
            margin=median_us(second) / median_us(best) if second else None,
            roofline_pct=(best.derived or {}).get("roofline_pct"),
            passing=len(rs),
        )
    return out


def class_summary(rows) -> list[dict]:
    """Per shape class: the backend that is fastest on most cases, how often, by how much, % of roofline,
    and which backends failed there (never ranked, but a reader must see them beside the winner)."""
    winners = case_winners(rows)
    cases_per_class = Counter(shape_class(r) for r in {r.case_id: r for r in rows}.values())
    failed: dict[str, Counter] = {}
    for r in rows:
        if status_of(r) in FAILING or status_of(r) == "xfail":
            failed.setdefault(shape_class(r), Counter())[r.backend] += 1
    by_cls: dict[str, list[CaseWinner]] = {}
    for w in winners.values():
        by_cls.setdefault(w.cls, []).append(w)
    out = []
    for cls, ws in sorted(by_cls.items(), key=lambda kv: _class_order(kv[0])):
        wins = Counter(w.best for w in ws)
        top, n = wins.most_common(1)[0]
        mine = [w for w in ws if w.best == top]
        margins = [w.margin for w in mine if w.margin]
        roofs = [w.roofline_pct for w in mine if w.roofline_pct is not None]
        runner = Counter(w.runner_up for w in mine if w.runner_up).most_common(1)
        out.append(
            {
                "cls": cls,
                "op": ws[0].op,
                "best": top,
                "wins": n,
                "ranked": len(ws),
                "cases": cases_per_class[cls],
                "others": ", ".join(f"{b} {k}" for b, k in wins.most_common() if b != top),
                "margin": statistics.median(margins) if margins else None,
                "runner_up": runner[0][0] if runner else None,
                "roofline_pct": statistics.median(roofs) if roofs else None,
                "failed": ", ".join(f"{b} ×{k}" if k > 1 else b for b, k in sorted(failed.get(cls, {}).items())),
            }
        )
    return out


def speedups(rows, baseline: str) -> list[dict]:
    """Per op and backend: geometric-mean speedup over `baseline` on the cases where both passed on a GPU clock."""
    base = {r.case_id: median_us(r) for r in rows if r.backend == baseline and rankable(r)}
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.backend != baseline and rankable(r) and r.case_id in base:
            acc.setdefault((r.op, r.backend), []).append(base[r.case_id] / median_us(r))
    return [
        {
            "op": op,
            "backend": b,
            "speedup": math.exp(sum(map(math.log, v)) / len(v)),
            "cases": len(v),
            "min": min(v),
            "max": max(v),
            "wins": sum(x > 1 for x in v),
        }
        for (op, b), v in sorted(acc.items())
    ]


def timing_kinds(rows) -> Counter:
    """How many timed rows came from each clock."""
    return Counter(k for k in map(timing_kind, rows) if k)


def unranked_note(rows) -> str:
    """Why some timed rows are not ranked (non-GPU clocks, or rows that did not pass); '' when all are."""
    kinds = timing_kinds(rows)
    notes = [f"{n} timed with a {k}: shown, labelled, never ranked" for k, n in kinds.items() if k != GPU]
    bad = sum(1 for r in rows if timing_kind(r) == GPU and not rankable(r))
    if bad:
        notes.append(f"{bad} timed rows that did not pass: shown, marked, never ranked")
    return "; ".join(notes)


def replay_totals(rows) -> list[dict]:
    """Per replayed trace (rows of batches with explicit lengths, docs/trace.md, grouped by suite): each
    backend's server time, sum of count x median over the batches it passed with a GPU timing, and the
    same over the batches every listed backend passed (`common`), the one total that compares backends.
    Backends with no such batch are left out; fastest on the common batches first."""
    by_suite: dict[str, dict[str, dict]] = {}
    for r in rows:
        p = r.params or {}
        if p.get("kv_lens") is None and p.get("q_lens") is None:
            continue
        by_suite.setdefault(r.suite, {}).setdefault(r.case_id, {})[r.backend] = r
    out = []
    for suite, cases in by_suite.items():
        timed: dict[str, dict[str, float]] = {}
        for cid, per in cases.items():
            for b, r in per.items():
                if rankable(r):
                    timed.setdefault(b, {})[cid] = getattr(r, "count", 1) * median_us(r)
        if not timed:
            continue
        common = set.intersection(*(set(t) for t in timed.values()))
        backends = [
            {"backend": b, "batches": len(t), "total_ms": sum(t.values()) / 1e3,
             "common_ms": sum(t[c] for c in common) / 1e3 if common else None}
            for b, t in timed.items()
        ]  # fmt: skip
        backends.sort(key=lambda d: (d["common_ms"] is None, d["common_ms"] or 0.0, d["backend"]))
        out.append({"suite": suite, "batches": len(cases), "common": len(common), "backends": backends})
    return out
