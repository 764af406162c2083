"""Who is fastest: only rows that passed, and only GPU timings, are ever ranked or turned into speedups.

A failing, erroring, xfail or xpass row keeps its timing in the tables (marked) but never wins, never
sets the "best" a ratio is taken against, and never appears in a speedup. One exception, always marked:
a known finding (`known_finding`), an xfail row whose every failure is in outputs its expectation
declares (`outputs: [lse]`) and whose other outputs passed, is ranked on those passing outputs and
carries its mark ("o ✓, lse known finding") wherever it is ranked. Host-clock timings (CPU) and
Triton under TRITON_INTERPRET=1 are labelled and never compared with anything.

Ties: two timings whose medians' 95% CIs overlap, or that differ by less than the gate's threshold
(max(3%, 3 x CV), attnbench.report.compare.GateRule), are tied (`tied`), and shown as tied ("a ≈ b"). A class's
fastest is decided over all its cases: the geometric mean of each backend's time over the per-case
best, never by counting wins that noise decided.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from attnbench.plan.expectations import failed_parts
from attnbench.report.compare import GateRule
from attnbench.store.counts import FAILING, status_of
from attnbench.store.results import Status

TIE_RULE = GateRule()  # the gate's rule: a difference it would call "same" or "noisy" is a tie here

# what clock a row's timing came from (attnbench.store.clocks; re-exported: the report's readers use them from here)
from attnbench.store.clocks import GPU, HOST, INTERPRETER, timing_kind  # noqa: E402, F401


def rankable(r) -> bool:
    """A row whose time may be ranked: it passed (not xpass: a row that fails the run is never ranked) and
    it was timed on a GPU clock."""
    ok = status_of(r) == Status.PASS.value
    return ok and timing_kind(r) == GPU and (r.timing.get("median_us") or 0) > 0


def known_finding(r) -> str | None:
    """The mark of a row ranked on its passing outputs ("o ✓, lse known finding"), or None.

    A row qualifies when it is xfail, timed on a GPU clock, its expectation declared `outputs:`, every
    part that failed (attnbench.plan.expectations.failed_parts, known) is one of them, and at least one other
    output was checked and passed. An expectation without `outputs:`, or any undeclared failure
    (another output, a canary, staleness, a modified input), leaves the row unranked.
    """
    if status_of(r) != "xfail" or timing_kind(r) != GPU or not (median_us(r) or 0) > 0:
        return None
    declared = {x for x in str((r.expected or {}).get("outputs") or "").split(",") if x}
    failed = failed_parts(r)
    if not declared or not failed or not failed <= declared:
        return None
    passing = sorted(n for n in (r.metrics or {}) if n not in failed)
    if not passing:
        return None
    return f"{', '.join(passing)} ✓, {', '.join(sorted(failed))} known finding"


def ranks(r) -> bool:
    """A row that takes part in ranking: rankable, or a known finding (ranked with its mark)."""
    return rankable(r) or known_finding(r) is not None


def mark(r) -> str:
    """'' for a clean rankable row, else its known-finding mark."""
    return "" if rankable(r) else (known_finding(r) or "")


def marked(name: str, note: str) -> str:
    return f"{name} ({note})" if note else name


def median_us(r) -> float | None:
    return (r.timing or {}).get("median_us")


def _cv(t: dict) -> float:
    return t["rcv"] if t.get("rcv") is not None else (t.get("cv") or 0.0)


def threshold(a, b) -> float:
    """The gate's threshold for two rows' timings: max(3%, 3 x the larger CV)."""
    return TIE_RULE.threshold(_cv(a.timing), _cv(b.timing))


def tied(a, b) -> bool:
    """Whether two timed rows are indistinguishable: their medians' 95% CIs overlap, or they differ by
    no more than the gate's threshold."""
    ma, mb = median_us(a), median_us(b)
    lo_a, hi_a = a.timing.get("ci95_us") or (ma, ma)
    lo_b, hi_b = b.timing.get("ci95_us") or (mb, mb)
    if lo_a <= hi_b and lo_b <= hi_a:
        return True
    return max(ma, mb) / min(ma, mb) - 1 <= threshold(a, b)


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


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
    runner_up: str | None  # the fastest backend not tied with the best
    margin: float | None  # runner-up time / best time (>= 1)
    roofline_pct: float | None
    passing: int  # how many backends passed and were GPU-timed (known findings included)
    tied: list[str] = field(default_factory=list)  # backends tied with the best (CIs overlap or under the threshold)
    times: dict[str, float] = field(default_factory=dict)  # median µs of every ranked backend
    marks: dict[str, str] = field(default_factory=dict)  # known-finding marks of ranked backends (none: clean)
    rows: dict = field(default_factory=dict)  # backend -> the ranked row


def case_winners(rows) -> dict[str, CaseWinner]:
    """Per case with at least one ranked row (`ranks`): the fastest backend, the backends tied with it,
    and the margin of the fastest one that is not tied."""
    by_case: dict[str, list] = {}
    for r in rows:
        if ranks(r):
            by_case.setdefault(r.case_id, []).append(r)
    out = {}
    for cid, rs in by_case.items():
        rs.sort(key=lambda r: (median_us(r), r.backend))
        best = rs[0]
        tie = [r.backend for r in rs[1:] if tied(best, r)]
        second = next((r for r in rs[1:] if r.backend not in tie), None)
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
            tied=tie,
            times={r.backend: median_us(r) for r in rs},
            marks={r.backend: mark(r) for r in rs if mark(r)},
            rows={r.backend: r for r in rs},
        )
    return out


def class_summary(rows) -> list[dict]:
    """Per shape class: the fastest backend over all its cases, and the backends tied with it.

    Each backend's score is the geometric mean, over the class's cases where it was ranked, of its time
    over the case's best time (1.0: fastest on every case). Only backends ranked on at least half as many
    cases as the best-covered one compete (a backend that ran one easy case cannot lead). The leader has
    the lowest score; a competitor is tied with it when, over the cases both ran, every per-case pair is
    tied (`tied`) or the geometric mean of their time ratio is within the median per-case threshold.
    `margin` is the geometric mean ratio of the fastest backend not tied with the leader (runner_up).
    Known findings are ranked with their mark (`marks`); failing backends are listed, never ranked.
    """
    winners = case_winners(rows)
    cases_per_class = Counter(shape_class(r) for r in {r.case_id: r for r in rows}.values())
    failed: dict[str, Counter] = {}
    for r in rows:
        if (status_of(r) in FAILING or status_of(r) == "xfail") and not ranks(r):
            failed.setdefault(shape_class(r), Counter())[r.backend] += 1
    by_cls: dict[str, list[CaseWinner]] = {}
    for w in winners.values():
        by_cls.setdefault(w.cls, []).append(w)
    out = []
    for cls, ws in sorted(by_cls.items(), key=lambda kv: _class_order(kv[0])):
        ratios: dict[str, list[float]] = {}
        marks: dict[str, Counter] = {}
        for w in ws:
            for b, t in w.times.items():
                ratios.setdefault(b, []).append(t / w.best_us)
                if w.marks.get(b):
                    marks.setdefault(b, Counter())[w.marks[b]] += 1
        most = max(len(v) for v in ratios.values())
        score = {b: geomean(v) for b, v in ratios.items() if 2 * len(v) >= most}
        order = sorted(score, key=lambda b: (score[b], -len(ratios[b]), b))
        lead = order[0]
        ties = [b for b in order[1:] if _class_tied(ws, lead, b)]
        rest = [b for b in order[1:] if b not in ties]
        runner = rest[0] if rest else None
        roofs = [w.roofline_pct for w in ws if w.best == lead and w.roofline_pct is not None]
        decided = Counter(w.best for w in ws if not w.tied)
        note = {b: marks[b].most_common(1)[0][0] for b in marks}
        out.append(
            {
                "cls": cls,
                "op": ws[0].op,
                "best": " ≈ ".join(marked(b, note.get(b, "")) for b in [lead, *ties]),
                "leaders": [lead, *ties],
                "marks": note,
                "score": score[lead],
                "covered": len(ratios[lead]),
                "wins": decided[lead],
                "ranked": len(ws),
                "cases": cases_per_class[cls],
                "others": ", ".join(f"{marked(b, note.get(b, ''))} {score[b]:.2f}×" for b in rest),
                "margin": _pair_ratio(ws, lead, runner) if runner else None,
                "runner_up": marked(runner, note.get(runner, "")) if runner else None,
                "roofline_pct": statistics.median(roofs) if roofs else None,
                "failed": ", ".join(f"{b} ×{k}" if k > 1 else b for b, k in sorted(failed.get(cls, {}).items())),
            }
        )
    return out


def _common(ws: list[CaseWinner], a: str, b: str) -> list[CaseWinner]:
    return [w for w in ws if a in w.times and b in w.times]


def _pair_ratio(ws: list[CaseWinner], a: str, b: str) -> float | None:
    """Geometric mean of b's time over a's on the cases both were ranked on (None: no such case)."""
    common = _common(ws, a, b)
    return geomean(w.times[b] / w.times[a] for w in common) if common else None


def _class_tied(ws: list[CaseWinner], a: str, b: str) -> bool:
    common = _common(ws, a, b)
    if not common:
        return False
    if all(tied(w.rows[a], w.rows[b]) for w in common):
        return True
    limit = statistics.median(threshold(w.rows[a], w.rows[b]) for w in common)
    return abs(_pair_ratio(ws, a, b) - 1) <= limit


BASELINE_RULE = (
    "torch when it has passing GPU-timed rows; else the backend with the most passing GPU-timed rows "
    "(fewer failing rows, then the name, break a tie); only passing rows enter a speedup, so a backend "
    "that passed nothing is never the baseline"
)


def speed_baseline(rows) -> str:
    """The backend speedups are taken over, by BASELINE_RULE ('' when no backend has a passing GPU-timed row)."""
    ranked = Counter(r.backend for r in rows if rankable(r))
    failing = Counter(r.backend for r in rows if status_of(r) in FAILING)
    if ranked.get("torch"):
        return "torch"
    return min(ranked, key=lambda b: (-ranked[b], failing[b], b)) if ranked else ""


def speedups(rows, baseline: str) -> list[dict]:
    """Per op and backend: geometric-mean speedup over `baseline` on the cases where both were ranked on a
    GPU clock (the baseline's rows must pass; a known finding's rows form their own, marked, entry)."""
    base = {r.case_id: median_us(r) for r in rows if r.backend == baseline and rankable(r)}
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.backend != baseline and ranks(r) and r.case_id in base:
            acc.setdefault((r.op, marked(r.backend, mark(r))), []).append(base[r.case_id] / median_us(r))
    return [
        {
            "op": op,
            "backend": b,
            "speedup": geomean(v),
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
    bad = sum(1 for r in rows if timing_kind(r) == GPU and not ranks(r))
    if bad:
        notes.append(f"{bad} timed rows that did not pass: shown, marked, never ranked")
    known = sum(1 for r in rows if known_finding(r))
    if known:
        notes.append(f"{known} known-finding rows ranked on their passing outputs only, marked †")
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
