"""Replay what a server saw: a JSONL trace, one batch per line, read into cases of the existing ops.

    {"op": "decode", "model": "llama3-8b", "kv_lens": [812, 77, 4096], "page_size": 16, "count": 12}
    {"op": "extend", "heads_q": 32, "heads_kv": 8, "head_dim": 128, "q_lens": [512, 1, 1], "prefix_lens": [0, 900, 37]}

Keys (docs/trace.md): `op` (required: decode or extend), `model` (a preset, `attnbench list models`),
`dtype` (default bf16), `count` (default 1: how many times the server ran this batch); every other
key is a parameter of the op (`attnbench list ops`): the per-request lengths (decode `kv_lens`;
extend `q_lens` with `prefix_lens` or `kv_lens`, keys including the new tokens), the head
configuration, `page_size` and the features (`window`, `soft_cap`, `sinks`, `kv_dtype`, ...).
Each batch becomes a case with explicit lengths; its id names them by digest (`lens3fa2c1d0`), so a
case of a trace is re-run with the trace: `attnbench sweep --trace FILE --case ID`. Identical batches
are one case whose count is the sum.

Every problem is a SuiteError `file:line: what is wrong`, raised before anything runs.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from attnbench.case import Case, Tolerance
from attnbench.dtypes import DTYPES
from attnbench.errors import SuiteError
from attnbench.ops import OPS
from attnbench.plan.presets import presets, suites_dir

EXPLICIT_TOKEN = re.compile(r"(^|[/-])lens[0-9a-f]{8}(-|$)")  # a case id naming explicit lengths by digest
OPS_REPLAYED = ("decode", "extend")  # ops whose batches are per-request lengths over a paged cache
META = ("op", "model", "dtype", "count", "source")  # the rest of a line: the op's parameters
SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Batch:
    """One distinct batch of a trace: its case, how many times the server ran it, its first line."""

    case: Case
    count: int
    line: int


# ---- locating traces -------------------------------------------------------------------------------
def builtin_dir() -> Path:
    return suites_dir() / "traces"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob(f"*{SUFFIX}"))


def resolve(name_or_path: str | Path, base: Path | None = None) -> Path:
    """A built-in trace name (`serving`) or a file path (relative to `base`, a suite's folder, if given)."""
    p = Path(name_or_path)
    if base is not None and not p.is_absolute():
        p = base / p
    if p.is_file():
        return p
    if p.suffix != SUFFIX and (builtin_dir() / f"{name_or_path}{SUFFIX}").is_file():
        return builtin_dir() / f"{name_or_path}{SUFFIX}"
    raise SuiteError(p, None, f"no such trace file; built-in traces: {', '.join(builtin_names()) or 'none'}")


def label(path: Path) -> str:
    """How a run records a trace (run.json, repro commands): a built-in one by name, a file by its path."""
    builtin = builtin_dir() / f"{path.stem}{SUFFIX}"
    if builtin.is_file() and path.resolve() == builtin.resolve():
        return path.stem
    return str(path)


# ---- reading ---------------------------------------------------------------------------------------
def count_batches(path: Path) -> int:
    """Lines holding a batch (blank lines are not), without parsing them (suite size checks)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def read(
    path: Path,
    device: str = "cpu",
    max_cases: int | None = None,
    suite: str = "",
    tolerance: Tolerance | None = None,
    require: frozenset[str] = frozenset(),
    invariance: bool = False,
) -> list[Batch]:
    """Every distinct batch of the trace at `path`, in order of first appearance (counts summed).

    Raises SuiteError naming the file and line of the first problem; a trace of more than `max_cases`
    batches is refused before a line is parsed.
    """
    path = Path(path)
    if max_cases is not None and (n := count_batches(path)) > max_cases:
        raise SuiteError(path, None, f"the trace holds {n:,} batches, more than {max_cases:,} (raise --max-cases)")
    known = presets()
    found: dict[str, Batch] = {}
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise SuiteError(path, None, f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SuiteError(path, None, f"not UTF-8 text: {e.reason}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            case, count = parse_line(line, known)
        except ValueError as e:
            raise SuiteError(path, number, str(e)) from None
        case = Case(case.op_name, case.params, case.dtype, suite=suite or label(path), device=device,
                     tolerance=tolerance, require=require, invariance=invariance, trace=label(path))  # fmt: skip
        if case.id in found:
            old = found[case.id]
            found[case.id] = Batch(old.case, old.count + count, old.line)
        else:
            found[case.id] = Batch(case, count, number)
    if not found:
        raise SuiteError(path, None, "the trace holds no batch (one JSON object a line)")
    return [Batch(replace(b.case, count=b.count), b.count, b.line) for b in found.values()]


def parse_line(line: str, known: dict[str, Any]) -> tuple[Case, int]:
    """One line -> (case, count); ValueError with what is wrong (the caller adds file:line)."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"a batch is a JSON object, got {type(data).__name__}")
    op_name = data.get("op")
    if op_name not in OPS_REPLAYED:
        got = "no op" if op_name is None else f"op {op_name!r}"
        raise ValueError(f"{got}: a trace replays {' or '.join(OPS_REPLAYED)} batches (key `op`)")
    op = OPS[op_name]
    dtype = data.get("dtype", "bf16")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if not isinstance(data.get("source", ""), str):
        raise ValueError("source is free text (where the batch came from), a string")
    count = data.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"count {count!r}: a positive integer (how many times the server ran this batch)")
    values: dict[str, Any] = {}
    model = data.get("model")
    if model is not None:
        if model not in known:
            raise ValueError(f"unknown model {model!r}; presets: {', '.join(known)}")
        values.update(known[model].get(getattr(op, "preset_key", op.family), {}))
    params = {k: v for k, v in data.items() if k not in META}
    names = list(op.Params.model_fields)
    for key in params:
        if key not in names and not (op_name == "extend" and key == "kv_lens"):
            raise ValueError(f"{op_name} has no parameter {key!r}; parameters: {', '.join(names)}")
    need = "kv_lens" if op_name == "decode" else "q_lens"
    if need not in params:
        raise ValueError(f"{op_name} batch without {need!r}: a trace gives every request's length")
    if op_name == "extend" and "kv_lens" in params:
        params = _prefix_from_keys(params)
    values.update(params)
    try:
        p = op.Params(**values)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where + ': ' if where else ''}{msg}") from None
    return Case(op_name, p, dtype), count


def _prefix_from_keys(params: dict[str, Any]) -> dict[str, Any]:
    """extend given keys per request (prefix + new, as FlashInfer's paged prefill counts them)."""
    if "prefix_lens" in params:
        raise ValueError("give prefix_lens or kv_lens, not both (kv_lens = prefix_lens + q_lens)")
    kv, q = params.pop("kv_lens"), params["q_lens"]
    if not (isinstance(kv, list) and isinstance(q, list) and len(kv) == len(q)):
        raise ValueError("kv_lens and q_lens are lists of one length per request")
    if not all(isinstance(a, int) and isinstance(b, int) and a >= b for a, b in zip(kv, q)):
        raise ValueError("kv_lens counts the new tokens too: every kv_lens[i] >= q_lens[i]")
    return params | {"prefix_lens": [a - b for a, b in zip(kv, q)]}


def case_from_id(case_id: str, device: str = "cpu", traces: list[Path] = ()) -> Case:
    """The case an id names: a replayed batch's (explicit lengths by digest) from `traces` (paths) or the
    built-in traces, any other parsed (`Case.from_id`; ValueError when it cannot be)."""
    if EXPLICIT_TOKEN.search(case_id) and (found := find_case(case_id, traces, device)):
        return found
    return Case.from_id(case_id, device)


def find_case(case_id: str, traces: list[Path] = (), device: str = "cpu") -> Case | None:
    """The case of one of `traces` (then of the built-in traces) whose id is `case_id`, or None."""
    seen = {Path(p).resolve() for p in traces}
    extra = [p for p in sorted(builtin_dir().glob(f"*{SUFFIX}")) if p.resolve() not in seen]
    for path in [*map(Path, traces), *extra]:
        found = _index(str(path.resolve()), path.stat().st_mtime_ns).get(case_id)
        if found is not None:
            return replace(found, device=device)
    return None


@functools.lru_cache(maxsize=16)
def _index(path: str, mtime_ns: int) -> dict[str, Case]:
    """A trace's cases by id (read once per file version)."""
    return {b.case.id: b.case for b in read(Path(path))}
