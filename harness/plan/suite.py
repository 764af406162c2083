"""Suites: YAML files of sweeps, validated (pydantic, unknown keys are errors) and expanded into cases.

    name: decode
    device: cuda                     # what the suite is sized for: any | cuda
    dtypes: [bf16]                   # default for every entry
    cases:
      - op: decode
        model: llama3-8b             # a preset from suites/models/presets.yaml (optional)
        params: {page_size: 16}      # fixed values, over the preset
        sweep:                       # Cartesian product, first axis outermost
          batch: [1, 64]
          kv_len: {pow2: [10, 13]}   # 1024 .. 8192; also {range: [start, stop, step]}, inclusive
        zip:                         # axes varied together (one group, or a list of groups)
          head_dim: [64, 192]
          head_dim_v: [64, 128]
        tolerance: {factor: 3, why: "soft cap: tanh amplifies rounding"}
        require: [deterministic, batch_invariant]   # a backend without them fails here
      - trace: traces/serving.jsonl  # replayed batches (attnbench.plan.trace, docs/trace.md), beside the suite
    expect:                          # known failures: xfail, not failures (attnbench.plan.expectations)
      - {backend: flashinfer, cases: "decode/*", outputs: [lse], why: "..."}

Every error (YAML syntax, unknown key, wrong type, impossible shape) is a SuiteError `file:line: ...`.
A suite whose sweeps would expand into more than `max_cases` cases (default `MAX_CASES`; `sweep
--max-cases N` raises it) is refused before anything is expanded, with the count per entry.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from attnbench.case import Case, Tolerance
from attnbench.check.tolerance import DEFAULT_FACTOR, DEFAULT_FLOOR, MAX_FACTOR, MAX_FLOOR
from attnbench.dtypes import DTYPES
from attnbench.errors import AttnbenchError, SuiteError
from attnbench.ops import OPS
from attnbench.plan import expectations, trace, yamlines
from attnbench.plan.presets import presets, suites_dir

Scalar = StrictInt | StrictFloat | StrictStr | bool | None
MAX_CASES = 10_000  # cases one suite may expand into unless the caller raises it (sweep --max-cases)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _axis(v: Any, info: ValidationInfo) -> list[Any]:
    """An axis: a list of values, `{range: [start, stop(, step)]}` (inclusive) or `{pow2: [lo, hi]}`.

    A range or pow2 longer than the validation context's `max_cases` is refused before it is listed.
    """
    values = _axis_values(v, (info.context or {}).get("max_cases", MAX_CASES))
    if not values:  # an empty axis would silently select no case from its whole entry
        raise ValueError("an axis needs at least one value; this one has none (an empty list or range)")
    return values


def _axis_values(v: Any, limit: int) -> list[Any]:
    if isinstance(v, list):
        for x in v:
            if isinstance(x, (dict, list)):
                raise ValueError(f"axis values must be scalars, got {x!r}")
        return v
    if isinstance(v, dict) and len(v) == 1:
        ((kind, args),) = v.items()
        ints = isinstance(args, list) and all(isinstance(a, int) and not isinstance(a, bool) for a in args)
        if kind == "range" and ints and len(args) in (2, 3):
            start, stop, *step = args
            if step and step[0] <= 0:
                raise ValueError("range step must be positive")
            values = range(start, stop + 1, step[0] if step else 1)
            if len(values) > limit:
                raise ValueError(
                    f"range has {len(values):,} values, more than the {limit:,} cases allowed (--max-cases)"
                )
            return list(values)
        if kind == "pow2" and ints and len(args) == 2:
            exps = range(args[0], args[1] + 1)
            if exps and (exps[0] < 0 or exps[-1] > 63):
                raise ValueError("pow2 exponents run from 0 to at most 63")
            return [2**e for e in exps]
        if kind in ("range", "pow2"):
            raise ValueError(
                f"{kind} takes " + ("[start, stop] or [start, stop, step]" if kind == "range" else "[lo, hi]")
            )
    raise ValueError("an axis is a list of values, {range: [start, stop(, step)]} or {pow2: [lo, hi]}")


Axis = Annotated[list[Any], BeforeValidator(_axis)]


class ToleranceSpec(_Strict):
    """A sweep's own tolerance (attnbench.check.tolerance): finite, `factor` at most MAX_FACTOR and `floor`
    at most MAX_FLOOR, with a written `why` that the console and the reports show."""

    factor: float | None = Field(None, gt=0)
    floor: float | None = Field(None, ge=0)
    why: str = Field(min_length=3, description="required: why this sweep needs a different tolerance")

    @field_validator("factor", "floor", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:  # before the bounds: NaN would fail `ge=0` with a vaguer message
        try:
            finite = v is None or math.isfinite(float(v))
        except (TypeError, ValueError):
            return v  # not a number: pydantic says so
        if not finite:
            raise ValueError(f"must be a finite number, got {v}: a tolerance that is not finite passes anything")
        return v

    @field_validator("factor", "floor")
    @classmethod
    def _bounded(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None:
            return v
        limit, default = (MAX_FACTOR, DEFAULT_FACTOR) if info.field_name == "factor" else (MAX_FLOOR, DEFAULT_FLOOR)
        if v > limit:
            raise ValueError(
                f"{v:g} loosens the tolerance beyond the most a suite may ({limit:g}; the default is {default:g}, "
                "docs/conventions.md says why); a kernel that needs more is a known failure (expect:), not a pass"
            )
        return v


class Entry(_Strict):
    op: str | None = None
    trace: str | None = Field(None, description="a JSONL trace of batches (docs/trace.md), relative to the suite")
    model: str | None = None
    params: dict[str, Scalar] = {}
    sweep: dict[str, Axis] = {}
    zip: dict[str, Axis] | list[dict[str, Axis]] = []
    dtypes: list[str] | None = None
    seeds: list[int] | None = None
    tolerance: ToleranceSpec | None = None
    require: list[Literal["deterministic", "batch_invariant"]] = Field(
        [], description="properties a backend must have here, or its row fails (determinism checks)"
    )
    invariance: bool = Field(False, description="also check (and report) batch invariance, without requiring it")

    @model_validator(mode="after")
    def _op_or_trace(self):
        if (self.op is None) == (self.trace is None):
            raise ValueError("an entry names an op (a sweep) or a trace (replayed batches), not both or neither")
        if self.trace is not None:
            given = [k for k in ("model", "params", "sweep", "zip", "dtypes", "seeds") if k in self.model_fields_set]
            if given:
                raise ValueError(
                    f"a trace entry takes trace, tolerance, require, invariance; {', '.join(given)} belong in its lines"
                )
        return self

    @field_validator("op")
    @classmethod
    def _op(cls, v: str | None) -> str | None:
        if v is not None and v not in OPS:
            raise ValueError(f"unknown op {v!r}; available: {', '.join(sorted(OPS))}")
        return v

    @field_validator("dtypes")
    @classmethod
    def _dtypes(cls, v):
        for d in v or ():
            if d not in DTYPES:
                raise ValueError(f"unknown dtype {d!r}; expected one of {', '.join(DTYPES)}")
        return v


class SuiteSpec(_Strict):
    name: str | None = None
    description: str = ""
    device: Literal["any", "cuda"] = "any"
    backends: list[str] | None = None
    dtypes: list[str] = ["bf16"]
    seeds: list[int] = [0]
    require: list[Literal["deterministic", "batch_invariant"]] = []
    cases: list[Entry] = Field(min_length=1)
    expect: list[Any] = Field([], description="expected failures (attnbench.plan.expectations), validated there")

    _check_dtypes = field_validator("dtypes")(Entry._dtypes.__func__)


class Suite:
    """A loaded, validated suite: its spec and its expanded cases (deduplicated by id)."""

    def __init__(self, path: Path, spec: SuiteSpec, cases: list[Case], expectations: list | None = None):
        self.path, self.spec, self.cases = path, spec, cases
        self.expectations = expectations or []  # its `expect:` entries (attnbench.plan.expectations.Expectation)

    @property
    def traces(self) -> list[Path]:
        """The trace files its `trace:` entries replay."""
        base = Path(self.path).parent
        return [trace.resolve(e.trace, base) for e in self.spec.cases if e.trace is not None]

    @property
    def name(self) -> str:
        return self.spec.name or self.path.stem


# ---- locating suites -----------------------------------------------------------------------------
def builtin_dir() -> Path:
    return suites_dir()


def builtin_names() -> list[str]:
    root = builtin_dir()
    names = [p.stem for p in root.glob("*.yaml")]
    names += [f"models/{p.stem}" for p in (root / "models").glob("*.yaml") if p.stem != "presets"]
    return sorted(names)


def resolve(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise SuiteError(p, None, "no such suite file")
        return p
    candidate = builtin_dir() / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    raise SuiteError(name_or_path, None, f"no such suite; built-in suites: {', '.join(builtin_names())}")


def from_trace(name_or_path: str, device: str = "cpu", max_cases: int | None = None) -> Suite:
    """`sweep --trace X`: a suite of one trace entry (its name: the trace's file stem)."""
    path = trace.resolve(name_or_path)
    spec = SuiteSpec(name=path.stem, cases=[Entry(trace=str(path))])
    return Suite(path, spec, [b.case for b in trace.read(path, device, max_cases, suite=path.stem)])


# ---- loading --------------------------------------------------------------------------------------
def load(name_or_path: str, device: str = "cpu", max_cases: int = MAX_CASES, plan_only: bool = False) -> Suite:
    """Read, validate and expand a suite (built-in name or YAML path) for `device`.

    Raises SuiteError (`file:line: what is wrong`) on any problem, including a suite that would expand
    into more than `max_cases` cases (counted before expanding). `plan_only` (a dry run: nothing runs)
    lets a GPU suite expand on a CPU device.
    """
    path = resolve(name_or_path)
    data, lines = yamlines.load(path)
    if not isinstance(data, dict):
        raise SuiteError(path, 1, "a suite is a mapping with at least a `cases:` list")
    try:
        spec = SuiteSpec.model_validate(data, context={"max_cases": max_cases})
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and ("[" in x or "(" in x)))
        raise SuiteError(path, yamlines.line_of(lines, loc), f"{_dotted(loc)}: {_msg(err)}") from None
    _check_backends(spec, path, lines)
    expect = expectations.parse(spec.expect, path, lines) if spec.expect else []
    if spec.device == "cuda" and not device.startswith("cuda") and not plan_only:
        raise SuiteError(
            path, yamlines.line_of(lines, ("device",)),
            f"suite {spec.name or path.stem!r} is sized for a GPU (device: cuda) but the run device is {device}; "
            "on a CPU run `smoke` or a suite of your own",
        )  # fmt: skip
    _check_size(spec, path, lines, max_cases)
    known = presets()
    cases: dict[str, Case] = {}
    for i, entry in enumerate(spec.cases):
        for case in _expand(entry, i, spec, known, path, lines, device, max_cases):
            cases.setdefault(case.id, case)
    return Suite(path, spec, list(cases.values()), expect)


def entry_size(entry: Entry, spec: SuiteSpec, base: Path | None = None) -> tuple[int, str]:
    """How many cases an entry expands into (before deduplication), and the product spelled out.

    A trace entry: the batches of its trace (`base`: the suite's folder), or 0 when it cannot be read
    (loading says why)."""
    if entry.trace is not None:
        try:
            n = trace.count_batches(trace.resolve(entry.trace, base))
        except (AttnbenchError, OSError):
            n = 0
        return n, f"{n:,} batches of {entry.trace}"
    groups = entry.zip if isinstance(entry.zip, list) else ([entry.zip] if entry.zip else [])
    factors = [(len(v), k) for k, v in entry.sweep.items()]
    factors += [(max((len(v) for v in g.values()), default=0), "zip(" + ",".join(g) + ")") for g in groups]
    factors += [(len(entry.dtypes or spec.dtypes), "dtypes"), (len(entry.seeds or spec.seeds), "seeds")]
    n = 1
    for size, _ in factors:
        n *= size
    return n, " x ".join(f"{size:,} {name}" for size, name in factors)


def _check_size(spec: SuiteSpec, path, lines, max_cases: int) -> None:
    sizes = [entry_size(e, spec, Path(path).parent) for e in spec.cases]
    total = sum(n for n, _ in sizes)
    if total > max_cases:
        i = max(range(len(sizes)), key=lambda j: sizes[j][0])
        raise SuiteError(
            path,
            yamlines.line_of(lines, ("cases", i)),
            f"the suite expands to {total:,} cases, more than {max_cases:,} (raise the limit with --max-cases); "
            f"the largest entry, cases[{i}], is {sizes[i][1]} = {sizes[i][0]:,}",
        )


def _check_backends(spec: SuiteSpec, path, lines) -> None:
    """Every `backends:` entry names a registered backend, or a knob variant of one (`NAME:k=v`)."""
    from attnbench.backend import all_backends, get_backend

    if not all_backends():
        return
    for i, b in enumerate(spec.backends or ()):
        try:
            get_backend(b)
        except AttnbenchError as e:
            raise SuiteError(path, yamlines.line_of(lines, ("backends", i)), str(e)) from None


def _dotted(loc) -> str:
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or "suite"


def _msg(err: dict) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required key missing"
    return msg


def _key_paths(at, key):
    yield at + ("sweep", key)
    yield at + ("params", key)
    yield at + ("zip", key)
    for g in range(16):
        yield at + ("zip", g, key)


def _replay(entry: Entry, i: int, spec: SuiteSpec, path, lines, device, max_cases) -> list[Case]:
    """A trace entry's batches, as cases of this suite (errors name the trace's file and line)."""
    try:
        found = trace.resolve(entry.trace, Path(path).parent)
    except SuiteError as e:
        raise SuiteError(path, yamlines.line_of(lines, ("cases", i, "trace")), e.message) from None
    tol = entry.tolerance and Tolerance(entry.tolerance.factor, entry.tolerance.floor, entry.tolerance.why)
    require = frozenset(entry.require) | frozenset(spec.require)
    batches = trace.read(found, device, max_cases, spec.name or Path(path).stem, tol, require, entry.invariance)
    return [b.case for b in batches]


def _expand(entry: Entry, i: int, spec: SuiteSpec, known, path, lines, device, max_cases=MAX_CASES) -> list[Case]:
    if entry.trace is not None:
        return _replay(entry, i, spec, path, lines, device, max_cases)
    op = OPS[entry.op]
    at = ("cases", i)
    base: dict[str, Any] = {}
    if entry.model is not None:
        if entry.model not in known:
            raise SuiteError(
                path,
                yamlines.line_of(lines, at + ("model",)),
                f"unknown model {entry.model!r}; presets: {', '.join(known)}",
            )
        base.update(known[entry.model].get(getattr(op, "preset_key", op.family), {}))
    base.update(entry.params)
    names = list(op.Params.model_fields)
    for section in ("params", "sweep"):
        for key in getattr(entry, section):
            if key not in names:
                raise SuiteError(
                    path,
                    yamlines.line_of(lines, at + (section, key)),
                    f"{entry.op} has no parameter {key!r}; parameters: {', '.join(names)}",
                )
    groups = entry.zip if isinstance(entry.zip, list) else ([entry.zip] if entry.zip else [])
    zipped: list[list[dict[str, Any]]] = []
    for g, group in enumerate(groups):
        zat = at + ("zip",) + ((g,) if isinstance(entry.zip, list) else ())
        cols = dict(group)
        for key in cols:
            if key not in names:
                raise SuiteError(path, yamlines.line_of(lines, zat + (key,)), f"{entry.op} has no parameter {key!r}")
        sizes = {len(v) for v in cols.values()}
        if len(sizes) > 1:
            raise SuiteError(path, yamlines.line_of(lines, zat), f"zipped axes differ in length: {sorted(sizes)}")
        n = sizes.pop() if sizes else 0
        zipped.append([{k: v[j] for k, v in cols.items()} for j in range(n)])
    axes = dict(entry.sweep)
    dtypes = entry.dtypes or spec.dtypes
    seeds = entry.seeds or spec.seeds
    tol = entry.tolerance and Tolerance(entry.tolerance.factor, entry.tolerance.floor, entry.tolerance.why)
    suite_name = spec.name or Path(path).stem
    out = []
    for combo in itertools.product(*axes.values()):
        for zs in itertools.product(*zipped):
            values = dict(base)
            values.update(zip(axes, combo))
            for z in zs:
                values.update(z)
            try:
                params = op.Params(**values)
            except ValidationError as e:
                err = e.errors()[0]
                key = err["loc"][0] if err["loc"] else None
                # a cross-field error names no key: point at the first key its message mentions
                named = [key] if key is not None else [k for k in values if k in err["msg"]]
                line = next((lines[p] for k in named for p in _key_paths(at, k) if p in lines), None)
                shown = ", ".join(f"{k}={v}" for k, v in values.items())
                where = f"{key}: " if key else ""
                raise SuiteError(
                    path, line or yamlines.line_of(lines, at), f"{where}{_msg(err)} (at {shown})"
                ) from None
            for dtype in dtypes:
                for seed in seeds:
                    out.append(Case(entry.op, params, dtype, seed, tolerance=tol, suite=suite_name, device=device,
                                    require=frozenset(entry.require) | frozenset(spec.require),
                                    invariance=entry.invariance))  # fmt: skip
    return out
