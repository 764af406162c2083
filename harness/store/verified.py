"""Whether a run verified anything: a run that skipped everything, or a backend the user named that
skipped every case, must not pass (a plugin that stopped loading in CI, a library missing on the runner).

`attnbench sweep` and `attnbench gate` both ask `unverified(rows, named)`; each line it returns fails
the run (exit 1) unless `--allow-skipped` is given, which turns them into notes. A row *ran* when its
status is anything but `skip` (error rows ran, and fail the run on their own). The rules:

- **nothing ran**: no row of the run ran (every row skipped, or there are no rows at all); one line
  per backend then says why it skipped;
- **a backend named with `-b NAME`** (a name or a knob variant `NAME:k=v`) ran none of its rows;
- **a pattern `-b 'triton*'`** selected backends of which none ran a row. A pattern asks for "whichever
  of these can run here", so one matched backend that skips everything (e.g. flashinfer-fa3 on a GPU
  before Hopper) is not an error as long as another one it matched ran.

`named` is run.json's `named_backends`: `[{"arg": "-b argument", "pattern": bool, "backends": [names]}]`.

`missing_rows(run, rows)` compares results.jsonl with the row count run.json recorded: `gate` fails on
a difference, `compare` and `report` say so (see each).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from attnbench.store.counts import status_of


def _why_skipped(rows: Sequence) -> str:
    reasons = Counter(r.reason for r in rows)
    top, _ = reasons.most_common(1)[0]
    more = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
    return f"{top or 'no reason given'}{more}"


def _skipped_all(rows: Sequence) -> bool:
    return bool(rows) and all(status_of(r) == "skip" for r in rows)


def unverified(rows: Iterable, named: Sequence[dict[str, Any]] = ()) -> list[str]:
    """Why this run verified nothing, or nothing of what the user named; [] when it did (see module)."""
    rows = list(rows)
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r.backend, []).append(r)
    if not any(status_of(r) != "skip" for r in rows):
        lines = [f"nothing ran: {'all ' + str(len(rows)) + ' rows skipped' if rows else 'no rows'}"]
        lines += [f"{name} skipped all {len(mine)} of its rows: {_why_skipped(mine)}" for name, mine in by.items()]
        return lines
    lines = []
    for arg in named:
        names = [n for n in arg.get("backends", []) if n in by]
        if not names or not all(_skipped_all(by[n]) for n in names):
            continue
        if arg.get("pattern"):
            each = "; ".join(f"{n}: {_why_skipped(by[n])}" for n in names)
            lines.append(f"-b {arg['arg']!r}: none of the backends it matched ran a case ({each})")
        else:
            n = names[0]
            lines.append(f"{n} (named with -b) skipped all {len(by[n])} of its rows: {_why_skipped(by[n])}")
    return lines


def missing_rows(run: dict[str, Any], rows: Sequence) -> list[str]:
    """What results.jsonl lacks (or holds twice) against run.json (`run`, a dict): [] when they agree.

    run.json records the rows a sweep or merge wrote (`rows`); a results file with fewer (torn, emptied,
    truncated by hand) or more (another process wrote into it) does not hold what the run verified. A
    (case, backend) row appearing twice is reported too. run.json without `rows` (older, or synthetic)
    is compared on duplicates only.
    """
    lines = []
    recorded = run.get("rows")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded != len(rows):
        if len(rows) < recorded:
            lines.append(f"results.jsonl holds {len(rows)} rows but run.json recorded {recorded}: "
                         f"{recorded - len(rows)} rows are missing (a torn or emptied results file)")  # fmt: skip
        else:
            lines.append(f"results.jsonl holds {len(rows)} rows but run.json recorded {recorded}: "
                         "another process wrote into this run")  # fmt: skip
    pairs = Counter((r.case_id, r.backend) for r in rows)
    twice = sum(1 for n in pairs.values() if n > 1)
    if twice:
        lines.append(f"{twice} (case, backend) rows appear more than once in results.jsonl")
    return lines


def missing_in(run: Path) -> list[str]:
    """`missing_rows` of a run directory (or of its results.jsonl), read from its files."""
    from attnbench.store.results import read_run_results

    directory = Path(run) if Path(run).is_dir() else Path(run).parent
    try:
        info = json.loads((directory / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = {}
    return missing_rows(info if isinstance(info, dict) else {}, read_run_results(run))
