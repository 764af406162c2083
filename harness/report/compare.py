"""Compare two runs row by row: the regression gate behind `attnbench compare BASE NEW`.

Rows match on (case id, backend). Correctness: a row that passed in BASE and fails or errors in NEW
is always a regression ("broke"), and so is an expected failure (xfail) that now fails uncovered (the
expectation no longer applies, or another output fails too); a row that newly fails but an
expectation covers (xfail) is "expected", a failing row that still fails (covered or not) "still
failing", and an expected failure that passes (xpass) a regression: its expectation must go. Speed: NEW is slower only when the 95% confidence intervals of the
two medians do not overlap AND the change exceeds max(3%, 3 x CV), CV being the larger coefficient
of variation of the two; the same rule in the other direction marks "faster" (so that a baseline
gets updated). CV is the robust coefficient of variation of the samples (1.4826 x MAD / median: the
same as std / mean for normal noise, but blind to outliers as long as they are fewer than half of the
samples: preempted or interrupted samples must not blind the gate). A change over the threshold
whose CIs overlap is "noisy"; timings taken in different modes (per-call events, CUDA graph), timed
in one run only, on different hardware (the rows' GPU), or whose median or CI is not a finite
positive number (NaN, zero, infinite) are "not comparable".

Host-clock timings (a CPU run, Triton under TRITON_INTERPRET=1) are correctness-only: their times are
carried into the comparison (base_us, new_us) but never judged, so such a row gets a correctness
verdict (same, broke, fixed...) and never slower, faster, noisy or "not comparable" for its clock.

Coverage loss fails the gate too: a row of BASE that NEW lacks ("missing") or now skips ("now
skipped") counts as a regression unless the rule allows it (`--allow-missing`); new rows never do.
A comparison that compares nothing fails with a reason (`Comparison.nothing_compared`): no rows in
common, or every common row not comparable or skipped in both runs.

Several baseline runs (`attnbench compare BASE NEW --also BASE2 ...`) carry what one run cannot: the
noise between runs (clocks, power, the process). Their rows are pooled (`pool_runs`): the baseline
median is the median of the runs' medians, its CI the hull of their CIs, and its CV at least the
spread between the runs (their medians' standard deviation over mean), so a kernel whose speed moves
between runs needs a larger change to count.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.store.clocks import GPU, timing_kind
from attnbench.store.results import Result, read_results, results_file

REGRESSIONS = ("broke", "slower", "xpass")
COVERAGE_LOSS = ("missing", "now skipped")
ORDER = (
    "broke",
    "slower",
    "xpass",
    "noisy",
    "not comparable",
    "missing",
    "now skipped",
    "faster",
    "fixed",
    "expected",
    "still failing",
    "new",
    "same",
)


@dataclass(frozen=True)
class GateRule:
    """Speed changes count when the CIs separate and |change| > max(min_change, cv_multiple x CV).

    CV: the larger robust CV (1.4826 x MAD / median) of the two timings.
    """

    min_change: float = 0.03
    cv_multiple: float = 3.0
    allow_missing: bool = False  # coverage loss (missing or newly skipped rows) does not fail the gate

    def is_regression(self, verdict: str) -> bool:
        return verdict in REGRESSIONS or (verdict in COVERAGE_LOSS and not self.allow_missing)

    def threshold(self, cv_base: float, cv_new: float) -> float:
        return max(self.min_change, self.cv_multiple * max(cv_base, cv_new))

    def describe(self) -> str:
        coverage = "allowed" if self.allow_missing else "a regression"
        return (
            f"slower/faster: the medians' 95% CIs separate and |change| > max({self.min_change:.0%}, "
            f"{self.cv_multiple:g} x CV); pass -> fail/error always a regression; missing or newly skipped rows "
            f"{coverage}"
        )


@dataclass
class Change:
    """The comparison of one (case, backend) row."""

    case_id: str
    op: str
    backend: str
    verdict: str
    base_status: str | None
    new_status: str | None
    base_us: float | None = None
    new_us: float | None = None
    change: float | None = None  # new / base - 1
    threshold: float | None = None
    ci_separate: bool | None = None
    note: str = ""
    regression: bool = False  # set from the verdict by the gate rule (compare_pair)


@dataclass
class Comparison:
    base: str
    new: str
    rule: GateRule
    changes: list[Change]
    base_env: dict = field(default_factory=dict)
    new_env: dict = field(default_factory=dict)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def counts(self) -> Counter:
        return Counter(c.verdict for c in self.changes)

    def nothing_compared(self) -> str | None:
        """Why this comparison judged nothing (then the gate fails), or None.

        Nothing is judged when the runs have no (case, backend) row in common, or when every common row
        is "not comparable" (timed differently, or on different hardware) or skipped in both runs.
        """
        common = [c for c in self.changes if c.base_status is not None and c.new_status is not None]
        if not common:
            nb = sum(c.base_status is not None for c in self.changes)
            nn = sum(c.new_status is not None for c in self.changes)
            return f"no rows in common (base has {nb}, new has {nn}): nothing was compared"
        judged = [
            c
            for c in common
            if c.verdict != "not comparable" and not (c.base_status == "skip" and c.new_status == "skip")
        ]
        if judged:
            return None
        why = Counter(c.note for c in common if c.verdict == "not comparable")
        said = "; ".join(f"{note} ({n})" for note, n in why.most_common(3))
        return f"none of the {len(common)} common rows can be compared" + (f": {said}" if said else " (all skipped)")

    def env_warnings(self) -> list[str]:
        """Differences between the two environments that make speed comparisons doubtful."""
        out = []
        for key in ("gpu", "driver", "cuda", "device", "cpu"):
            a, b = self.base_env.get(key), self.new_env.get(key)
            if a != b and (a or b):
                out.append(f"{key} differs: {a or 'not recorded'} -> {b or 'not recorded'}")
        la, lb = self.base_env.get("libraries", {}), self.new_env.get("libraries", {})
        for lib in sorted(set(la) | set(lb)):
            if la.get(lib) != lb.get(lib):
                out.append(f"{lib} {la.get(lib) or 'not installed'} -> {lb.get(lib) or 'not installed'}")
        return out

    def to_dict(self) -> dict:
        return {
            "base": self.base,
            "new": self.new,
            "rule": asdict(self.rule),
            "counts": dict(self.counts()),
            "regressions": len(self.regressions),
            "nothing_compared": self.nothing_compared(),
            "env_warnings": self.env_warnings(),
            "changes": [asdict(c) for c in self.changes],
        }


def _cv(t: dict) -> float:
    """The robust CV of a timing (std / mean for results written before it existed)."""
    return t["rcv"] if t.get("rcv") is not None else t.get("cv", 0.0)


def _mode(t: dict) -> tuple[str, str]:
    """How a timing was taken: (clock, mode); timings are comparable only within one."""
    return t.get("clock"), t.get("mode", "per-call")


def _unusable(t: dict) -> str | None:
    """Why a timing cannot be compared (its median or CI is not a finite positive number), or None."""
    med, ci = t.get("median_us"), t.get("ci95_us")
    if not _positive(med):
        return f"median {med}"
    if not (isinstance(ci, list | tuple) and len(ci) == 2 and all(_positive(x) for x in ci)):
        return f"CI {ci}"
    return None


def _positive(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _speed(b: dict, n: dict, rule: GateRule) -> tuple[str, dict]:
    """Speed verdict of two timing dicts: slower | faster | noisy | same | not comparable."""
    mode_b, mode_n = _mode(b), _mode(n)
    info = {"base_us": b.get("median_us"), "new_us": n.get("median_us")}
    if mode_b != mode_n:
        return "not comparable", info | {
            "note": f"timed as {'/'.join(map(str, mode_b))} then {'/'.join(map(str, mode_n))}"
        }
    bad = [f"{label} {why}" for label, t in (("base", b), ("new", n)) if (why := _unusable(t))]
    if bad:
        return "not comparable", info | {"note": f"not a finite positive timing: {'; '.join(bad)}"}
    change = n["median_us"] / b["median_us"] - 1
    thr = rule.threshold(_cv(b), _cv(n))
    (blo, bhi), (nlo, nhi) = b["ci95_us"], n["ci95_us"]
    slower_apart, faster_apart = nlo > bhi, nhi < blo
    info |= {"change": change, "threshold": thr, "ci_separate": slower_apart or faster_apart}
    notes = []
    for label, t in (("base", b), ("new", n)):
        if t.get("n_throttled"):
            notes.append(f"{label}: {t['n_throttled']} throttled samples")
        if not t.get("converged", True):
            notes.append(f"{label}: CI target not met")
    info["note"] = "; ".join(notes)
    if slower_apart and change > thr:
        return "slower", info
    if faster_apart and -change > thr:
        return "faster", info
    if abs(change) > thr:
        return "noisy", info
    return "same", info


def _judged(r: Result) -> dict | None:
    """The timing a speed verdict may use: a GPU clock's (host clocks are correctness-only), else None."""
    return r.timing if r.timing and timing_kind(r) == GPU else None


def _hardware(r: Result) -> str | None:
    """The GPU (or CPU) a row was measured on, when the row says."""
    return (r.env or {}).get("gpu") or (r.env or {}).get("cpu")


def compare_pair(base: Result | None, new: Result | None, rule: GateRule) -> Change:
    """The verdict for one (case, backend): correctness first, then speed; `regression` by the rule."""
    ch = _verdict(base, new, rule)
    ch.regression = rule.is_regression(ch.verdict)
    return ch


def _verdict(base: Result | None, new: Result | None, rule: GateRule) -> Change:
    ref = new or base
    ch = Change(ref.case_id, ref.op, ref.backend, "same", base and base.status, new and new.status)
    if base is None:
        ch.verdict = "new"
        return ch
    if new is None:
        ch.verdict = "missing"
        return ch
    # xfail: a failure an expectation covers; xpass: a pass where one was expected (attnbench.plan.expectations)
    ok, bad = base.status in ("pass", "xpass"), new.status in ("fail", "error")
    was_bad = base.status in ("fail", "error", "xfail")
    if new.status == "xpass":
        ch.verdict, ch.note = "xpass", new.reason
    elif (ok or base.status == "xfail") and bad:
        ch.verdict, ch.note = "broke", new.reason
    elif ok and new.status == "xfail":
        ch.verdict, ch.note = "expected", new.reason
    elif was_bad and new.status == "pass":
        ch.verdict = "fixed"
    elif was_bad and (bad or new.status == "xfail"):
        ch.verdict, ch.note = "still failing", new.reason
    elif base.status != "skip" and new.status == "skip":
        ch.verdict, ch.note = "now skipped", new.reason
    elif base.status == "skip" and new.status != "skip":
        ch.verdict = "new"
    bt, nt = _judged(base), _judged(new)
    if (base.timing and not bt) or (new.timing and not nt):  # host clock: times shown, never judged
        ch.base_us, ch.new_us = (base.timing or {}).get("median_us"), (new.timing or {}).get("median_us")
        said = "host-clock timing: correctness only, speed not judged"
        ch.note = f"{ch.note}; {said}" if ch.note else said
    if bool(bt) != bool(nt) and ch.verdict == "same":
        ch.verdict = "not comparable"
        ch.note = "timed in base only" if bt else "timed in new only"
    elif bt and nt and _hardware(base) != _hardware(new):
        if ch.verdict == "same":
            ch.verdict = "not comparable"
            ch.note = f"timed on {_hardware(base)} then {_hardware(new)}"
    elif bt and nt:
        speed, info = _speed(bt, nt, rule)
        note = info.pop("note", "")
        for k, v in info.items():
            setattr(ch, k, v)
        if ch.verdict == "same":
            ch.verdict = speed
        if note:
            ch.note = f"{ch.note}; {note}" if ch.note else note
    return ch


def compare_rows(base: list[Result], new: list[Result], rule: GateRule | None = None) -> list[Change]:
    """Changes of every (case, backend) in either run, regressions first."""
    rule = rule or GateRule()
    b = {(r.case_id, r.backend): r for r in base}
    n = {(r.case_id, r.backend): r for r in new}
    keys = list(dict.fromkeys([*b, *n]))
    changes = [compare_pair(b.get(k), n.get(k), rule) for k in keys]
    rank = {v: i for i, v in enumerate(ORDER)}
    return sorted(changes, key=lambda c: (rank.get(c.verdict, 99), -(abs(c.change or 0.0))))


def _results_path(run: Path) -> Path:
    path = results_file(run)
    if path is None:
        raise AttnbenchError(f"{run}: no results.jsonl here (nor results.jsonl.gz)")
    return path


def _env(results: Path) -> dict:
    try:
        return json.loads((results.parent / "env.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def pool_runs(runs: list[list[Result]]) -> list[Result]:
    """One baseline from several runs of the same rows: status from the first run; timing pooled.

    Pooled timing (rows timed the same way in every run): median_us the median of the medians,
    ci95_us the hull of the CIs, rcv the largest of the runs' robust CVs and of the between-run CV
    (standard deviation of the medians over their mean), `runs` how many were pooled.
    """
    if len(runs) == 1:
        return runs[0]
    others = [{(r.case_id, r.backend): r for r in run} for run in runs[1:]]
    pooled = []
    for row in runs[0]:
        key = (row.case_id, row.backend)
        if not row.timing:
            pooled.append(row)
            continue
        timings = [row.timing] + [o[key].timing for o in others if key in o and o[key].timing]
        timings = [t for t in timings if _mode(t) == _mode(row.timing) and not _unusable(t)]
        if len(timings) > 1 and not _unusable(row.timing):
            medians = [t["median_us"] for t in timings]
            mean = statistics.fmean(medians)
            between = statistics.stdev(medians) / mean if mean > 0 else 0.0
            timing = dict(row.timing)
            timing |= {
                "median_us": statistics.median(medians),
                "ci95_us": [min(t["ci95_us"][0] for t in timings), max(t["ci95_us"][1] for t in timings)],
                "rcv": max([between] + [_cv(t) for t in timings]),
                "runs": len(timings),
                "n_throttled": sum(t.get("n_throttled", 0) for t in timings),
                "converged": all(t.get("converged", True) for t in timings),
            }
            row = row.model_copy(update={"timing": timing})
        pooled.append(row)
    return pooled


def compare_runs(base: Path | list[Path], new: Path, rule: GateRule | None = None) -> Comparison:
    """Compare run directories (or results.jsonl files): one baseline run or several, pooled."""
    rule = rule or GateRule()
    bases = list(base) if isinstance(base, list | tuple) else [base]
    paths = [_results_path(b) for b in bases]
    pn = _results_path(new)
    changes = compare_rows(pool_runs([read_results(p) for p in paths]), read_results(pn), rule)
    label = " + ".join(str(b) for b in bases)
    return Comparison(label, str(new), rule, changes, _env(paths[0]), _env(pn))
