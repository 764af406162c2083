"""Result rows: one per (case, backend), appended to `results.jsonl` as soon as each exists.

A run directory's rows are read in one place, `read_run_results` (or `results_file` for the path): a
run kept compressed (`results.jsonl.gz`, as reports/examples stores its larger runs) reads exactly as
one with `results.jsonl`.

The row schema is versioned: every row carries `schema_version` (files written before versioning have
none and read as version 1). A reader refuses rows of a newer version than it knows, with one line.

    {"schema_version": 2, "case_id": "decode/b1-l512-h8x2-d64-p16-bf16", "op": "decode",
     "backend": "torch", "status": "pass", "reason": "", "params": {...}, "metrics": {"o": {...}},
     "timing": {"median_us": ..., ...} | null, "derived": {...}, "env": {"device": "cpu", ...}, ...}

The sub-records (`timing`, `derived`, `env`, each output's `metrics`) are typed dicts: their known
fields are validated on read, unknown ones are kept, and readers use them as plain dicts.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, with_config
from typing_extensions import TypedDict

from attnbench.errors import AttnbenchError

SCHEMA_VERSION = 2  # 1: the unversioned rows and run.json written before (read as they are)
RESULTS = "results.jsonl"  # a run directory's rows, appended as they arrive
GZIPPED = RESULTS + ".gz"  # the same rows stored compressed (reports/examples); read, never appended to


class Status(StrEnum):
    """A row's verdict. `xfail`/`xpass` come from expectations (a known failure, declared with a why)."""

    PASS = "pass"
    FAIL = "fail"
    XFAIL = "xfail"  # failed, as an expectation said it would: does not fail the run
    XPASS = "xpass"  # an expected failure that passed: fails the run (the expectation is stale)
    SKIP = "skip"
    ERROR = "error"

    @property
    def is_failure(self) -> bool:
        """True for the statuses that fail a run (exit code 1): fail, error, xpass."""
        return self in _FAILURES

    @property
    def checks_passed(self) -> bool:
        """True when the outputs passed their checks (pass, xpass): the rows whose timings may be ranked."""
        return self in (Status.PASS, Status.XPASS)

    @property
    def ran(self) -> bool:
        """False for skip: the backend never ran the case."""
        return self is not Status.SKIP


_FAILURES = frozenset({Status.FAIL, Status.ERROR, Status.XPASS})
STATUSES = tuple(s.value for s in Status)  # display order of summaries


def counts_as_failure(status: str) -> bool:
    """Whether a row with `status` fails the run (the one rule for exit codes and summaries)."""
    return Status(status).is_failure


def _record(cls):
    return with_config(ConfigDict(extra="allow"))(cls)


@_record
class Timing(TypedDict, total=False):
    """attnbench.run.timing.TimingStats as stored: microseconds per call, and how the samples were taken."""

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    mean_us: float
    cv: float
    ci95_us: tuple[float, float]
    n: int
    clock: str  # "cuda-events" | "host"
    l2_flush: bool
    converged: bool
    mode: str  # "per-call" | "cuda-graph"
    calls_per_sample: int
    copies: int
    working_set_bytes: float | None
    note: str
    q1_us: float
    q3_us: float
    max_us: float
    stdev_us: float
    rcv: float
    n_throttled: int
    throttled: bool
    throttle: list[str]
    retired: bool  # sampling stopped early, far from every other closure (docs/measurement.md)
    nvml: dict[str, Any] | None
    wall_s: float
    kernel_s: float
    phases: dict[str, float]  # wall_s by phase: attnbench.run.timing.PHASES (the case's, on each of its rows)
    samples_us: list[float]


@_record
class Derived(TypedDict, total=False):
    """FLOPs and bytes of the case (docs/measurement.md), the rates they give, and the roofline."""

    flops: float
    bytes: float
    tflops: float
    tbps: float
    intensity: float
    bound_us: float
    roofline_pct: float
    limiter: str  # "memory" | "compute"


@_record
class OutputMetrics(TypedDict, total=False):
    """Errors of one output against the float64 reference (attnbench.check.checks)."""

    max_abs: float
    max_rel: float
    rel_l2: float
    cos: float
    mismatch: float
    bound: float
    twin_max_abs: float
    scale: float
    nonfinite: int
    worst: dict[str, int]
    exact: bool  # integer outputs: compared exactly
    wrong: int
    untouched_changed: int
    unspecified: int


@_record
class RowEnv(TypedDict, total=False):
    """The few environment fields every row carries (the run's env.json has the rest)."""

    device: str
    gpu: str
    cpu: str
    torch: str | None


class Result(BaseModel):
    """One row. `timing` holds TimingStats fields; `derived` FLOPs, bytes, TFLOP/s, TB/s."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    schema_version: int = SCHEMA_VERSION
    case_id: str
    op: str
    backend: str
    status: Status
    reason: str = ""
    params: dict[str, Any] = {}
    dtype: str = ""
    seed: int = 0
    suite: str = ""
    count: int = 1  # a replayed batch (docs/trace.md): how many times the server ran it
    features: list[str] = []
    metrics: dict[str, OutputMetrics] = {}
    timing: Timing | None = None
    derived: Derived = {}
    prepare_s: float | None = None  # layout conversion, plan(), JIT, compilation: never in `timing`
    prepare_info: dict[str, Any] = {}  # a backend's breakdown (jit_s, plan_s, variant)
    reference_s: float | None = None  # float64 reference + twin (computed or loaded), shared by the case's rows
    reference_from: str | None = None  # "computed" | "cache" (the reference cache, harness/store/refcache.py)
    reference_note: str = ""  # a reference cache problem met on the way (a corrupt entry, a full disk)
    inputs_s: float | None = None  # building the case's inputs, shared by every backend of the case
    call_s: float | None = None  # the checked call of this row's closure and the copy of the inputs it writes
    check_s: float | None = None  # the correctness checks of this row (outputs, side effects, staleness)
    check_parts: dict[str, float] = {}  # check_s by check: outputs, determinism, invariance, stale
    case_s: float | None = None  # the whole case in its process (every row of it), shared by its rows
    tolerance_why: str = ""
    deterministic: bool | None = None  # two calls on the same inputs gave bitwise identical outputs
    batch_invariant: bool | None = None  # a request's outputs were bitwise the same alone and in a reordered batch
    sanitizer: dict[str, Any] | None = None  # --sanitize: tool, findings (count), log (path in the run directory)
    env: RowEnv = {}
    failed: list[str] = []  # what failed a check: output names, or the problem (expectations.subjects)
    expected: dict[str, str] | None = None  # xfail/xpass: the expectation (why, where, link)

    def to_json(self) -> str:
        d = self.model_dump()
        d["schema_version"] = SCHEMA_VERSION
        return json.dumps(d, default=_jsonable, allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        """A row from its JSON object (any schema version up to SCHEMA_VERSION; else SchemaError)."""
        check_version(d.get("schema_version", 1), "row")
        return cls.model_validate(d)


def _jsonable(o):
    if isinstance(o, tuple):
        return list(o)
    return str(o)


class SchemaError(AttnbenchError):
    """A file attnbench cannot read: written by a newer version, or not what it should be."""


def check_version(version: Any, what: str) -> None:
    """Refuse a record written by a newer attnbench (one line, no traceback)."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SchemaError(f"{what} has an invalid schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{what} was written by a newer attnbench (schema {version}; this one reads up to {SCHEMA_VERSION}):"
            " upgrade attnbench to read it"
        )


class ResultWriter:
    """Appends rows to `results.jsonl`, flushed and fsynced as each batch (a case's rows) arrives
    (nothing the supervisor received is lost on a crash).

    A torn last line left by a crash mid-write is moved to `results.jsonl.torn` (kept, and no longer
    in the way of the rows appended after it).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size:
            _set_aside_torn_tail(self.path)
        self._f = open(self.path, "a", encoding="utf-8")

    def append(self, r: Result) -> None:
        self.extend([r])

    def extend(self, rows: list[Result]) -> None:
        """Append `rows` (a case's, as they arrive together), then flush and fsync once: each fsync costs
        milliseconds, and one per row was a fifth of a small CPU sweep's wall time."""
        self._f.write("".join(r.to_json() + "\n" for r in rows))
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _set_aside_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    with open(path.with_name(path.name + ".torn"), "ab") as f:
        f.write(data[cut:] + b"\n")
    with open(path, "r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())


_warned: set[str] = set()


def _print_warning(message: str) -> None:
    if message not in _warned:  # the same file is often read more than once per command
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr)


def results_file(run: Path) -> Path | None:
    """The file holding a run's rows: `run` itself when it is a file; in a run directory `results.jsonl`,
    else `results.jsonl.gz` (the rows stored compressed); None when the directory has neither.
    With both present `results.jsonl` is read: it is the one a sweep appends to (`gunzip -k` leaves both)."""
    run = Path(run)
    if run.is_file():
        return run
    return next((f for f in (run / RESULTS, run / GZIPPED) if f.is_file()), None)


def read_run_results(run: Path, on_warning: Callable[[str], None] | None = None) -> list[Result]:
    """Rows of a run directory (or of a results file, plain or gzipped), as `read_results` reads them.
    AttnbenchError "RUN: no results.jsonl here" when there are none."""
    path = results_file(run)
    if path is None:
        raise AttnbenchError(f"{run}: no {RESULTS} here (nor {GZIPPED})")
    return read_results(path, on_warning)


def _text(path: Path) -> str:
    """A results file's text; a `.gz` file is decompressed. SchemaError naming the file when unreadable."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SchemaError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise SchemaError(f"{path}: not a whole gzip file ({e or type(e).__name__})") from None


def read_results(path: Path, on_warning: Callable[[str], None] | None = None) -> list[Result]:
    """Rows of a `results.jsonl` (or of a gzipped `results.jsonl.gz`); nothing is dropped without a word.

    A torn last line (a crash mid-write) is left out with a warning naming `file:line` (given to
    `on_warning`; by default printed once to stderr). Any other line that is not a valid row raises
    SchemaError naming `file:line` and what is wrong, as does a row of a newer schema version.
    """
    path = Path(path)
    lines = _text(path).splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}:{i + 1}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            if i == last:
                (on_warning or _print_warning)(f"{where}: torn last line (a crash mid-write?) left out: {e.msg}")
                continue
            raise SchemaError(f"{where}: not a JSON row ({e.msg} at column {e.colno})") from None
        if not isinstance(d, dict):
            raise SchemaError(f"{where}: not a JSON object")
        try:
            rows.append(Result.from_dict(d))
        except SchemaError as e:
            raise SchemaError(f"{where}: {e}") from None
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(x) for x in err["loc"])
            raise SchemaError(f"{where}: {field}: {err['msg']}") from None
    return rows
