"""Result rows: one per (case, backend), appended to `results.jsonl` as soon as each exists."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("pass", "fail", "skip", "error")


@dataclass
class Result:
    """One row. `timing` holds TimingStats fields; `derived` FLOPs, bytes, TFLOP/s, TB/s."""

    case_id: str
    op: str
    backend: str
    status: str  # pass | fail | skip | error
    reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    dtype: str = ""
    seed: int = 0
    suite: str = ""
    features: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] | None = None
    derived: dict[str, float] = field(default_factory=dict)
    prepare_s: float | None = None  # layout conversion, plan(), JIT, compilation: never in `timing`
    prepare_info: dict[str, Any] = field(default_factory=dict)  # a backend's breakdown (jit_s, plan_s, variant)
    reference_s: float | None = None  # float64 reference + twin, shared by every backend of the case
    check_s: float | None = None  # the correctness checks of this row (outputs, side effects, staleness)
    tolerance_why: str = ""
    deterministic: bool | None = None  # two calls on the same inputs gave bitwise identical outputs
    batch_invariant: bool | None = None  # a request's outputs were bitwise the same alone and in a reordered batch
    sanitizer: dict[str, Any] | None = None  # --sanitize: tool, findings (count), log (path in the run directory)
    env: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=_jsonable, allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _jsonable(o):
    if isinstance(o, tuple):
        return list(o)
    return str(o)


class ResultWriter:
    """Appends rows to `results.jsonl`, flushed and fsynced row by row (nothing lost on a crash)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.path.exists() and self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n")
        self._f = open(self.path, "a", encoding="utf-8")
        if torn:  # a crash mid-write left half a line: end it, so the next row starts on its own line
            self._f.write("\n")

    def append(self, r: Result) -> None:
        self._f.write(r.to_json() + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def status_counts(rows: list[Result]) -> dict[str, Counter]:
    """Per backend, how many rows have each status."""
    by: dict[str, Counter] = {}
    for r in rows:
        by.setdefault(r.backend, Counter())[r.status] += 1
    return by


def read_results(path: Path) -> list[Result]:
    """Rows of a `results.jsonl` (a torn last line, from a crash mid-write, is ignored)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(Result.from_dict(json.loads(line)))
            except json.JSONDecodeError:
                continue
    return rows
