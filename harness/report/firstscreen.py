"""What a reader sees first, in report.html and summary.md alike: did anything break (grouped by cause,
each with a repro), who is fastest where (passing GPU-timed rows only), and, given a baseline run, what
changed."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from attnbench.report import changes as changes_mod
from attnbench.report import ranking
from attnbench.report.common import md_text, repro
from attnbench.store.counts import FAILING, Counts, count, status_of
from attnbench.store.verified import missing_rows

_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?%?", re.IGNORECASE)


def cause(reason: str) -> str:
    """A reason with its numbers taken out and its detail cut: rows with one cause share this key."""
    first = re.split(r" \(|; |\n", reason or "no reason given", maxsplit=1)[0]
    return _NUM.sub("#", first)[:120]


CAUSE_CHARS = 600  # a first-screen cause longer than this loses its middle (`Group.summary`)


@dataclass
class Group:
    """Failing rows of one backend with one status and one cause."""

    backend: str
    status: str
    cause: str
    reason: str  # the first row's full reason
    case_id: str  # the first row's case
    repro: str
    ops: Counter = field(default_factory=Counter)

    @property
    def summary(self) -> str:
        """The first row's reason, whole (its first line; past `CAUSE_CHARS` its middle is cut to '…': the
        title and the case view have it all). A reason's start says what failed and its end is often the
        point (which bound, which expectation to remove, the problem after a long context), so both stay."""
        first = (self.reason or "no reason given").split("\n", 1)[0]
        if len(first) <= CAUSE_CHARS:
            return first
        head = CAUSE_CHARS * 2 // 3
        return first[:head] + " … " + first[len(first) - (CAUSE_CHARS - head - 3) :]

    @property
    def n(self) -> int:
        return sum(self.ops.values())

    def where(self) -> str:
        return ", ".join(f"{op} ×{k}" if k > 1 else op for op, k in self.ops.most_common())


def broken(rows, run: dict) -> list[Group]:
    """fail / error / xpass rows grouped by (backend, status, cause), largest groups first."""
    groups: dict[tuple, Group] = {}
    for r in rows:
        st = status_of(r)
        if st not in FAILING:
            continue
        key = (r.backend, st, cause(r.reason))
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(r.backend, st, key[2], r.reason, r.case_id, repro(r, run))
        g.ops[r.op] += 1
    return sorted(groups.values(), key=lambda g: (-g.n, g.backend, g.cause))


def xfails(rows) -> list:
    return [r for r in rows if status_of(r) == "xfail"]


@dataclass
class FirstScreen:
    counts: Counts
    verdict: str
    complete: bool
    stopped_by: str
    broken: list[Group]
    fastest: list[dict]
    unranked: str  # why some timed rows are not ranked
    kinds: dict  # timed rows per clock
    changes: dict | None  # compare verdict counts and regressions, with a baseline run
    missing: list[str] = field(default_factory=list)  # results.jsonl against run.json (attnbench.store.verified)
    loosened: list[str] = field(default_factory=list)  # the suites' looser tolerances, each with its why


def first_screen(rows, run: dict, comparison=None) -> FirstScreen:
    c = count(rows)
    complete = bool(run.get("complete", True))
    changes = None
    if comparison is not None:
        changes = {"base": str(comparison.base), **changes_mod.groups(comparison)}
    return FirstScreen(
        counts=c,
        verdict=c.verdict(complete),
        complete=complete,
        stopped_by=str(run.get("stopped_by") or ""),
        broken=broken(rows, run),
        fastest=ranking.class_summary(rows),
        unranked=ranking.unranked_note(rows),
        kinds=dict(ranking.timing_kinds(rows)),
        changes=changes,
        missing=missing_rows(run, rows),
        loosened=[loosened_line(t) for t in run.get("tolerances") or []],
    )


def loosened_line(t: dict) -> str:
    """One loosened tolerance (run.json `tolerances` record) as text: where, the rule against the
    default, and its why."""
    from attnbench.check.tolerance import DEFAULT_FACTOR, DEFAULT_FLOOR

    rule = []
    for key, default in (("factor", DEFAULT_FACTOR), ("floor", DEFAULT_FLOOR)):
        if t.get(key) is not None and t[key] != default:
            rule.append(f"{key} {t[key]:g} (default {default:g})")
    n = t.get("cases", 0)
    return (f"{t.get('suite')}/{t.get('op')}, {n} case{'s' * (n != 1)}: {', '.join(rule) or 'the default rule'}; "
            f"why: {t.get('why', '')}")  # fmt: skip


def _pct(x: float | None) -> str:
    if x is None:
        return ""
    return "<1%" if x < 1 else f"{x:.0f}%"


def fastest_cells(f: dict) -> dict:
    """One fastest-table row as text: shared by the HTML and Markdown renderers (ranking.class_summary)."""
    if f["margin"] is None:
        margin = "no other backend ranked" if not f["others"] and len(f["leaders"]) == 1 else "all tied"
    else:
        margin = f"{f['margin']:.2f}× over {f['runner_up']}"
    return {
        "cls": f["cls"],
        "best": f["best"],
        "score": f"{f['score']:.2f}×",
        "wins": f"{f['covered']}/{f['ranked']}",
        "margin": margin,
        "roof": _pct(f["roofline_pct"]),
        "others": f["others"],
        "failed": f["failed"],
    }


FASTEST_NOTE = (
    "fastest: lowest geometric mean, over the class's cases, of time over the case's best (1.00×: fastest on "
    "every case); a ≈ b: tied (95% CIs overlap or within the gate's max(3%, 3 x CV)); cases: cases it was "
    "ranked on / cases with a ranked row; margin: the fastest untied backend's time over the leader's "
    "(geometric mean on shared cases); (… known finding): ranked on its passing outputs only."
)


def first_screen_md(fs: FirstScreen, max_groups: int = 30) -> list[str]:
    """The first screen as Markdown lines (the top of summary.md)."""
    mark = "❌" if fs.counts.failing else ("⚠️" if not fs.complete else "✅")
    lines = [f"**{mark} {fs.verdict}**", "", fs.counts.line()]
    if not fs.complete:
        lines += [
            "",
            f"> **Incomplete run** ({fs.stopped_by or 'interrupted or crashed'}): these counts cover the rows written so far.",
        ]
    if fs.missing:
        lines += ["", "> **Rows missing:** " + md_text("; ".join(fs.missing)) + "."]
    if fs.loosened:
        lines += ["", "> **Loosened tolerances** (the suites' own, each with its why):"]
        lines += [f"> - {md_text(line)}" for line in fs.loosened]
    if fs.changes:
        lines += ["", f"### What changed (against `{fs.changes['base']}`)", ""]
        lines.append(", ".join(f"{v}: {n}" for v, n in fs.changes["counts"]) or "no rows in common")
        for ch in fs.changes["regressions"][:20]:
            size = f" {changes_mod.size(ch)}" if changes_mod.size(ch) else ""
            lines.append(f"- **{ch.verdict}** `{ch.case_id}` [{md_text(ch.backend)}]{size} {md_text(ch.note)}".rstrip())
        if len(fs.changes["regressions"]) > 20:
            lines.append(
                f"- … and {len(fs.changes['regressions']) - 20} more regressions (report.html, `attnbench compare`)"
            )
        for extra in (changes_mod.plan_line(fs.changes["plan"]), fs.changes["same"]):
            if extra:
                lines.append(f"- {md_text(extra)}")
    if fs.broken:
        lines += [
            "",
            "### What broke",
            "",
            "| rows | backend | status | cause | where | repro (first row) |",
            "|---:|---|---|---|---|---|",
        ]
        for g in fs.broken[:max_groups]:
            lines.append(
                f"| {g.n} | {md_text(g.backend)} | {g.status} | {md_text(g.summary)} | {g.where()} | `{g.repro}` |"
            )
        if len(fs.broken) > max_groups:
            lines.append(f"| | | | {len(fs.broken) - max_groups} more causes in report.html | | |")
    lines += ["", "### Fastest passing backend per shape class", ""]
    if fs.fastest:
        lines += [
            "| shape class | fastest (≈: tied) | time / per-case best | cases | margin | roofline | others | failed here (not ranked) |",
            "|---|---|---:|---:|---|---:|---|---|",
        ]
        for f in map(fastest_cells, fs.fastest):
            f = {k: md_text(v) for k, v in f.items()}  # backend names are a plugin's to choose
            failed = f"❌ {f['failed']}" if f["failed"] else ""
            lines.append(
                f"| {f['cls']} | **{f['best']}** | {f['score']} | {f['wins']} | {f['margin']} | {f['roof']} | {f['others']} | {failed} |"
            )
        lines += ["", FASTEST_NOTE]
    else:
        lines.append("No case has a passing GPU-timed row: nothing is ranked.")
    if fs.unranked:
        lines += ["", f"Not ranked: {md_text(fs.unranked)}."]
    return lines
