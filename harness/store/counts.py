"""The one place that counts a run's rows by status: the console, summary.md, junit.xml and report.html
all print these numbers, so they always agree.

Statuses: pass | fail | xfail | xpass | skip | error. A run *fails* when any row is fail, error or xpass
(an expected failure that now passes: the expectation is stale); xfail rows are known failures with a
reason and do not fail the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from attnbench.store.results import STATUSES, Status

FAILING = tuple(s for s in STATUSES if Status(s).is_failure)  # fail, xpass, error


def status_of(row) -> str:
    """A row's status as a plain string (an enum member's value, or the string itself)."""
    s = row.status
    return str(getattr(s, "value", s))


@dataclass(frozen=True)
class Counts:
    """Rows per status, in total and per backend (every Counter has all six statuses as keys)."""

    total: Counter = field(default_factory=Counter)
    by_backend: dict[str, Counter] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(self.total.values())

    @property
    def failing(self) -> int:
        """Rows that fail the run: fail + error + xpass."""
        return sum(self.total[s] for s in FAILING)

    def line(self) -> str:
        """`14 pass · 5 fail · 2 xfail · 0 xpass · 9 skip · 0 error`"""
        return " · ".join(f"{self.total[s]} {s}" for s in STATUSES)

    def verdict(self, complete: bool = True) -> str:
        """One line: did anything break (and did the run finish)."""
        if self.failing:
            parts = ", ".join(f"{self.total[s]} {s}" for s in FAILING if self.total[s])
            head = f"FAILED: {self.failing} failing row{'s' if self.failing != 1 else ''} ({parts})"
        elif not self.total["pass"] and not self.total["xfail"]:
            head = "NOTHING RAN: no row passed or failed"
        elif not complete:  # never "OK" over rows that are missing
            return "INCOMPLETE RUN: nothing failing among the rows there, but not every case ran or was merged"
        else:
            head = "OK: nothing failing"
        if not complete:
            head += "; INCOMPLETE RUN (it stopped before every case ran)"
        return head

    def junit(self) -> dict[str, int]:
        """JUnit's four numbers: xpass counts as a failure, xfail as skipped (with its reason)."""
        t = self.total
        return {
            "tests": self.rows,
            "failures": t["fail"] + t["xpass"],
            "errors": t["error"],
            "skipped": t["skip"] + t["xfail"],
        }


def count(rows: Iterable) -> Counts:
    """Count rows by status, in total and per backend (backends sorted by name)."""
    total: Counter = Counter({s: 0 for s in STATUSES})
    by: dict[str, Counter] = {}
    for r in rows:
        s = status_of(r)
        total[s] += 1
        by.setdefault(r.backend, Counter({x: 0 for x in STATUSES}))[s] += 1
    return Counts(total=total, by_backend=dict(sorted(by.items())))
