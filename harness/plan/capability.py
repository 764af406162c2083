"""The capability matrix: per op and per (op, feature), which backend runs how many cases, and why not.

Built from (case, backend, skip reason or None) observations: live from `supports()` for
`attnbench list backends` (which reads each backend's declared implementation: `available()`, then
the declared limits; harness/backend.py), or from result rows for the report (skip rows carry their
reason). The two agree: tests/kernels/test_declared_support_agrees.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Cell:
    supported: int = 0
    total: int = 0
    reasons: Counter = field(default_factory=Counter)

    def text(self) -> str:
        if self.total == 0:
            return ""
        if self.supported == self.total:
            return f"yes {self.supported}/{self.total}"
        why = "; ".join(r for r, _ in self.reasons.most_common(2))
        return f"{self.supported}/{self.total}: {why}"


def aggregate(observations: Iterable[tuple[str, tuple[str, ...], str, str | None]], backends: list[str]):
    """observations: (op, features, backend, reason or None) -> {row key: [Cell per backend]}."""
    rows: dict[str, dict[str, Cell]] = {}
    for op, features, backend, reason in observations:
        for key in (op, *(f"{op} / {f}" for f in features)):
            cell = rows.setdefault(key, {b: Cell() for b in backends}).setdefault(backend, Cell())
            cell.total += 1
            if reason is None:
                cell.supported += 1
            else:
                cell.reasons[reason] += 1
    return {k: [v[b] for b in backends] for k, v in sorted(rows.items())}


def matrix(cases, backends) -> dict[str, list[Cell]]:
    """Live matrix from each backend's `supports()` (a raising `supports` counts as its message)."""

    def obs():
        for c in cases:
            for b in backends:
                try:
                    reason = b.supports(c)
                except Exception as e:
                    reason = f"supports() raised {type(e).__name__}: {e}"
                yield c.op_name, c.features, b.name, reason

    return aggregate(obs(), [b.name for b in backends])


def matrix_from_rows(rows) -> tuple[list[str], dict[str, list[Cell]]]:
    names = sorted({r.backend for r in rows})
    obs = ((r.op, tuple(r.features), r.backend, r.reason if r.status == "skip" else None) for r in rows)
    return names, aggregate(obs, names)
