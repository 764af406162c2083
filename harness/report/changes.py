"""What changed between two runs, with sizes: the presentation of a Comparison (attnbench.report.compare) shared by
the first screen (report.html, summary.md), compare.md, compare.html and the terminal.

Every changed row says base → new µs and Δ%; rows come in order of severity (the comparison's order:
broke, slower, xpass…, larger changes first); the rows judged "same" are summed up in one line (their
median and worst change); rows absent from one run because the runs' plans differ (the other run has
no row of that case at all) are kept apart from the rows that broke or slowed down. The verdicts and
what the gate counts are attnbench.report.compare's: this module only sizes, orders and groups them.
"""

from __future__ import annotations

import statistics

from attnbench.report.common import fmt

PLAN = "plan differs"  # the group of rows one run has and the other's plan lacks (no row of the case at all)


def size(c) -> str:
    """'266 → 2404 µs (+803%)'; '' when either run has no time for the row."""
    if c.base_us is None or c.new_us is None:
        return ""
    pct = f" ({100 * c.change:+.1f}%)" if c.change is not None else ""
    return f"{fmt(c.base_us)} → {fmt(c.new_us)} µs{pct}"


def plan_absent(changes) -> set[tuple[str, str]]:
    """(case, backend) of "missing" rows whose case NEW lacks entirely, and of "new" rows whose case BASE
    lacks entirely: the plans differ, nothing about the backend changed."""
    in_base = {c.case_id for c in changes if c.base_status is not None}
    in_new = {c.case_id for c in changes if c.new_status is not None}
    return {
        (c.case_id, c.backend)
        for c in changes
        if (c.verdict == "missing" and c.case_id not in in_new) or (c.verdict == "new" and c.case_id not in in_base)
    }


def same_spread(changes) -> str:
    """One line for the rows judged the same: 'same 42: median change 0.14%, worst +0.5% (case [backend])'."""
    same = [c for c in changes if c.verdict == "same"]
    timed = [c for c in same if c.change is not None]
    if not same:
        return ""
    if not timed:
        return f"same {len(same)} (untimed)"
    worst = max(timed, key=lambda c: abs(c.change))
    med = statistics.median(abs(c.change) for c in timed)
    return (
        f"same {len(same)}: median change {100 * med:.2f}%, worst {100 * worst.change:+.2f}% "
        f"({worst.case_id} [{worst.backend}])"
    )


def groups(cmp) -> dict:
    """{"regressions": changed rows the gate counts, plan rows left out, in severity order;
    "plan": the rows absent because the plans differ (regressions or not); "others": every other
    changed row (faster, fixed, noisy, not comparable, …); "same": the one-line spread; "counts"}."""
    plan = plan_absent(cmp.changes)
    key = lambda c: (c.case_id, c.backend)  # noqa: E731
    return {
        "regressions": [c for c in cmp.changes if c.regression and key(c) not in plan],
        "plan": [c for c in cmp.changes if key(c) in plan],
        "others": [c for c in cmp.changes if not c.regression and key(c) not in plan and c.verdict != "same"],
        "same": same_spread(cmp.changes),
        "counts": [(v, n) for v, n in cmp.counts().items() if n],
    }


def line(c) -> str:
    """One changed row as text: verdict, case [backend], size, note."""
    parts = [c.verdict, f"{c.case_id} [{c.backend}]"]
    if s := size(c):
        parts.append(s)
    if c.verdict in ("slower", "faster", "noisy") and c.threshold is not None:
        parts.append(f"threshold ±{100 * c.threshold:.1f}%")
    text = " ".join(parts)
    return f"{text}: {c.note}" if c.note else text


def plan_line(plan) -> str:
    """The rows absent because the plans differ, in one line (empty when none)."""
    if not plan:
        return ""
    gone = sum(c.verdict == "missing" for c in plan)
    added = len(plan) - gone
    bits = [f"{gone} rows of cases the new run did not plan (missing)"] if gone else []
    bits += [f"{added} rows of cases the base run did not plan (new)"] if added else []
    counted = sum(c.regression for c in plan)
    tail = f"; the gate counts {counted} as coverage loss (--allow-missing to allow)" if counted else ""
    return "plans differ: " + ", ".join(bits) + tail


def text_lines(cmp, limit: int = 30) -> list[str]:
    """What changed, for the terminal: regressions with sizes (at most `limit`, then 'and N more'), the
    plan difference, the other changes' count and the spread of the same rows."""
    g = groups(cmp)
    out = [line(c) for c in g["regressions"][:limit]]
    if len(g["regressions"]) > limit:
        out.append(f"… and {len(g['regressions']) - limit} more regressions (compare.md has them all)")
    if p := plan_line(g["plan"]):
        out.append(p)
    if g["same"]:
        out.append(g["same"])
    return out
