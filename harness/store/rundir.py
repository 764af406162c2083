"""Where a sweep writes: a run directory it may use without losing or mixing results.

`prepare_run_dir` is called after the plan is validated and before anything runs. It refuses (an
AttnbenchError, exit 2, nothing touched) when:

- `--out` is a file, or a directory (or the nearest existing parent) that cannot be written;
- the directory already holds a run's files and neither `--resume` (keep its rows, run the rest) nor
  `--overwrite` (replace them) was given;
- `--resume` is asked of a directory whose rows are only compressed (`results.jsonl.gz`: gunzip it), or
  of a directory whose recorded plan (suites, backends, filters, device, timing)
  differs from this one: the message names what differs;
- another sweep is writing into the directory: each sweep holds an exclusive `flock` on
  `.attnbench.lock` in it for as long as it runs (the kernel releases it when the process ends, so
  a sweep that died, even by SIGKILL, leaves no stale lock behind).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any

from attnbench.errors import AttnbenchError
from attnbench.store.results import check_version, read_results

RUN_FILES = (
    "results.jsonl",
    "results.jsonl.gz",
    "run.json",
    "env.json",
    "report.html",
    "results.csv",
    "junit.xml",
    "summary.md",
)
PLAN_KEYS = ("device", "suites", "traces", "backends", "filters", "timing")


def planned(p: Any, timing: bool) -> dict[str, Any]:
    """The parts of a plan that must match for rows of two sweeps to share a run directory."""
    info = {
        "device": p.device,
        "suites": [str(s.path) for s in p.suites],
        "traces": list(getattr(p, "traces", ())),
        "backends": [b.name for b in p.backends],
        "filters": dict(p.filters),
        "timing": timing,
    }
    return json.loads(json.dumps(info))  # tuples as lists, as run.json has them


def plan_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old -> new` for every plan key whose recorded value differs."""
    out = []
    for key in PLAN_KEYS:
        a, b = old.get(key), new.get(key)
        if key == "filters":
            for k in sorted(set(a or {}) | set(b or {})):
                fa, fb = (a or {}).get(k), (b or {}).get(k)
                if fa != fb and (fa or fb):
                    out.append(f"filter {k}: {fa} -> {fb}")
        elif a != b and (a or b or key != "traces"):  # a run.json from before traces has none
            out.append(f"{key}: {a} -> {b}")
    return out


def check_writable(out: Path) -> None:
    """Create the output directory `out` or refuse it (AttnbenchError: a file, or not writable)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AttnbenchError(f"--out {out}: is a file, not a directory")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise AttnbenchError(f"--out {out}: {probe} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".attnbench-write-test-"):
            pass
    except OSError as e:
        raise AttnbenchError(f"--out {out}: cannot write there ({e.strerror or e})") from None


LOCK_FILE = ".attnbench.lock"


def lock_run_dir(out: Path) -> IO:
    """Take the run directory's lock (the directory exists) and return the open file that holds it:
    keep it referenced (open) while writing into the directory. Another holder: AttnbenchError."""
    import fcntl

    f = open(Path(out) / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held open until the process ends)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise AttnbenchError(
            f"--out {out} is in use by another sweep{f' ({holder})' if holder else ''}: wait for it, or choose "
            "another --out"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


def prepare_run_dir(out: Path, plan_info: dict[str, Any], resume: bool, overwrite: bool) -> IO:
    """Check (and create) the run directory and lock it (`lock_run_dir`: the returned file holds the
    lock; keep it while the sweep runs); see the module docstring for what is refused."""
    out = Path(out)
    if resume and overwrite:
        raise AttnbenchError("--resume keeps the rows in --out and --overwrite replaces them: choose one")
    check_writable(out)
    lock = lock_run_dir(out)
    try:
        _check_existing(out, plan_info, resume, overwrite)
    except BaseException:
        lock.close()
        raise
    return lock


def _check_existing(out: Path, plan_info: dict[str, Any], resume: bool, overwrite: bool) -> None:
    existing = [name for name in RUN_FILES if (out / name).exists()] if out.is_dir() else []
    if existing and not (resume or overwrite):
        raise AttnbenchError(
            f"--out {out} already holds a run ({', '.join(existing)}): add --resume to complete it "
            "or --overwrite to replace it, or choose another --out"
        )
    if resume and (out / "results.jsonl.gz").exists() and not (out / "results.jsonl").exists():
        raise AttnbenchError(
            f"--resume: {out} keeps its rows compressed (results.jsonl.gz) and a sweep appends to results.jsonl: "
            f"gunzip {out / 'results.jsonl.gz'} first"
        )
    if resume and (out / "results.jsonl").exists():
        try:
            old = json.loads((out / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise AttnbenchError(
                f"--resume: {out} has results but no readable run.json, so its plan cannot be checked"
            ) from None
        check_version(old.get("schema_version", 1) if isinstance(old, dict) else 1, str(out / "run.json"))
        if diffs := plan_differences(old, plan_info):
            raise AttnbenchError(f"--resume: {out} was run with another plan ({'; '.join(diffs)})")
        read_results(out / "results.jsonl")  # an unreadable row (file:line) refuses the resume before anything runs
    if overwrite:
        for name in existing:
            if os.path.isfile(out / name):
                (out / name).unlink()
