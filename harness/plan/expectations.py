"""Expected failures: known findings that do not fail a run, and fail it again once they are fixed.

An expectations file (`attnbench sweep --expect FILE`; the same entries may sit under `expect:` in a
suite, and the built-in ones in suites/expectations/ apply by default):

    expect:
      - backend: flashinfer                 # a backend name (a glob such as `flashinfer-*` works too)
        cases: ["decode/b1-l1024-*"]        # globs on case ids: one string or a list
        outputs: [lse]                      # optional: only these may fail; any other failing output or
                                            # check (canary, stale output, modified input, ...) still fails;
                                            # `replay:<output>`: it may fail on the replay check's batch
                                            # alone (a numerical property that batch shows, said in `why`)
        errors: ["*illegal memory access*"] # optional: globs on an error row's reason that are this finding
        versions: {flashinfer-python: "==0.7.2.post1"}   # optional: applies only where these match
        why: "fa2 LSE is summed from bf16 probabilities (docs/findings.md)"   # required
        link: https://github.com/flashinfer-ai/flashinfer/issues/...          # optional

Semantics (strict, as pytest's `xfail(strict=True)`):
- a `fail` row that an applicable expectation covers becomes `xfail`: shown with the expectation's
  why, not counted as a failure;
- a `pass` row that an applicable expectation matches becomes `xpass` and fails the run: the
  finding is gone (fixed upstream, or the expectation is too broad), so the expectation must go;
- `skip` rows are never changed; an `error` row (an exception, crash or timeout) is not a known finding
  unless the expectation names it: `errors` globs, matched against the row's reason, for a bug whose
  outcome depends on what it hits (an int32 offset that wraps reads NaN from one pool and faults on
  another). Without `errors`, error rows stay errors;
- an expectation whose `versions` do not match the installed libraries (or a library that is not
  installed) does not apply. Tolerances never change: an expectation documents a failure, it never
  makes one pass.

Every validation error is a SuiteError `file:line: ...` (exit 2 on the command line).
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from attnbench.errors import SuiteError
from attnbench.plan import yamlines

XFAIL, XPASS = "xfail", "xpass"


class ExpectationSpec(BaseModel):
    """One entry as written in YAML (validated; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    backend: StrictStr = Field(min_length=1)
    cases: StrictStr | list[StrictStr] = Field(min_length=1)
    outputs: list[StrictStr] | None = Field(None, min_length=1)
    errors: list[StrictStr] | None = Field(None, min_length=1)
    versions: dict[StrictStr, StrictStr] = {}
    why: StrictStr = Field(min_length=3, description="required: the finding this failure is")
    link: StrictStr | None = None

    @field_validator("versions")
    @classmethod
    def _versions(cls, v: dict[str, str]) -> dict[str, str]:
        for dist, spec in v.items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                raise ValueError(
                    f"{dist}: {spec!r} is not a version specifier (e.g. '==0.7.2.post1', '>=0.7,<0.8')"
                ) from None
        return v


@dataclass(frozen=True)
class Expectation:
    """A loaded expectation; `where` is `file:line` of its entry (shown with every row it changes)."""

    backend: str
    cases: tuple[str, ...]
    why: str
    outputs: frozenset[str] | None = None
    versions: tuple[tuple[str, str], ...] = ()
    errors: tuple[str, ...] = ()
    link: str | None = None
    where: str = ""

    def matches(self, case_id: str, backend: str) -> bool:
        return fnmatch.fnmatchcase(backend, self.backend) and any(fnmatch.fnmatchcase(case_id, g) for g in self.cases)

    def applies(self, version_of: Callable[[str], str | None]) -> bool:
        """True when every pinned library is installed at a version inside its range."""
        return all(_pin_holds(version_of(dist), spec) for dist, spec in self.versions)

    def covers(self, failed: set[str] | None) -> bool:
        """Whether a fail row whose failing parts are `failed` (None: unknown) is this known failure."""
        if self.outputs is None:
            return True
        if not failed:
            return False
        # `replay:<output>`: the output failed on the replayed batch as well. The same known failure
        # when this expectation allows the output and it failed on the case's own batch too; alone (it
        # passed eagerly) it is what the graph got wrong, unless the expectation names `replay:<output>`
        # itself (a numerical edge of that batch's inputs, diagnosed, not a graph problem).
        again = {f.removeprefix("replay:") for f in failed if f.startswith("replay:")}
        eager = {f for f in failed if not f.startswith("replay:")}
        plain = {o for o in self.outputs if not o.startswith("replay:")}
        on_replay = {o.removeprefix("replay:") for o in self.outputs if o.startswith("replay:")}
        return eager <= plain and again <= (plain & eager) | on_replay

    def covers_error(self, reason: str) -> bool:
        """Whether an error row with this reason is this known failure (one of the `errors` globs)."""
        return any(fnmatch.fnmatchcase(reason, g) for g in self.errors)

    def label(self) -> str:
        return f"{self.why} [{self.where}]" + (f" {self.link}" if self.link else "")


def _pin_holds(got: str | None, spec: str) -> bool:
    """Whether an installed version (None: not installed) is inside the pinned range."""
    if got is None:
        return False
    try:
        return Version(got) in SpecifierSet(spec, prereleases=True)
    except InvalidVersion:
        return False


# ---- loading --------------------------------------------------------------------------------------
def parse(entries: Any, path: Path | str, lines: dict, at: tuple = ("expect",)) -> list[Expectation]:
    """Validate YAML entries (a list) found at key path `at` of `path`."""
    if not isinstance(entries, list):
        raise SuiteError(path, yamlines.line_of(lines, at), f"{_dotted(at)}: a list of expectations")
    out = []
    for i, raw in enumerate(entries):
        try:
            spec = ExpectationSpec.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and ("[" in x or "(" in x)))
            where = at + (i,) + loc
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key (expected backend, cases, outputs, errors, versions, why, link)"
            elif err["type"] == "missing":
                msg = "required key missing"
            raise SuiteError(path, yamlines.line_of(lines, where), f"{_dotted(where)}: {msg}") from None
        globs = (spec.cases,) if isinstance(spec.cases, str) else tuple(spec.cases)
        line = yamlines.line_of(lines, at + (i,))
        out.append(
            Expectation(
                backend=spec.backend,
                cases=globs,
                why=" ".join(spec.why.split()),
                outputs=frozenset(spec.outputs) if spec.outputs else None,
                versions=tuple(sorted(spec.versions.items())),
                errors=tuple(spec.errors or ()),
                link=spec.link,
                where=f"{_short(path)}:{line}" if line else _short(path),
            )
        )
    return out


def load(path: Path | str) -> list[Expectation]:
    """An expectations file: a mapping with an `expect:` list (and an optional `description`), or a bare list."""
    path = Path(path)
    if not path.is_file():
        raise SuiteError(path, None, "no such expectations file")
    data, lines = yamlines.load(path)
    if isinstance(data, list):
        return parse(data, path, lines, ())
    if not isinstance(data, dict) or "expect" not in data:
        raise SuiteError(path, 1, "an expectations file is a mapping with an `expect:` list (or a bare list)")
    extra = [k for k in data if k not in ("expect", "description")]
    if extra:
        raise SuiteError(
            path, yamlines.line_of(lines, (extra[0],)), f"{extra[0]}: unknown key (expected expect, description)"
        )
    return parse(data["expect"], path, lines, ("expect",))


def builtin_dir() -> Path:
    return Path(str(resources.files("attnbench.suites"))) / "expectations"


def builtin() -> list[Expectation]:
    """The shipped expectations (suites/expectations/*.yaml): today's documented findings, version-pinned."""
    return [e for p in sorted(builtin_dir().glob("*.yaml")) for e in load(p)]


def _dotted(loc) -> str:
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or "file"


def _short(path) -> str:
    """A path relative to the working directory, or to the package for built-in files."""
    p = Path(path)
    for root, prefix in ((Path.cwd(), ""), (builtin_dir().parent, "attnbench/suites/")):
        try:
            return prefix + str(p.resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(p)


# ---- what failed in a row ---------------------------------------------------------------------------
def failed_parts(row) -> set[str] | None:
    """The outputs (and written inputs) of a `fail` row that failed a check; None when not known.

    Read from the row's `failed` list (the checks' subjects, written by the runner) when it has one;
    rows written before it existed fall back to their metrics (numeric bound, NaN/Inf, wrong exact
    elements, untouched elements changed), which cannot see canary, shape or staleness problems and
    so are trusted only when they explain the failure at all.
    """
    listed = getattr(row, "failed", None)
    if listed:
        return set(listed)
    found = set()
    for name, m in (row.metrics or {}).items():
        if not isinstance(m, dict):
            continue
        over = m.get("max_abs") is not None and m.get("bound") is not None and m["max_abs"] > m["bound"]
        if over or m.get("nonfinite") or m.get("wrong") or m.get("untouched_changed"):
            found.add(name)
    return found or None


# ---- applying ---------------------------------------------------------------------------------------
def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions_from_env(env: dict) -> Callable[[str], str | None]:
    """Library versions as a run recorded them (env.json `libraries`), else as installed here."""
    libs = (env or {}).get("libraries", {})
    return lambda dist: libs.get(dist) if dist in libs else installed_version(dist)


def applicable(expectations: Iterable[Expectation], version_of=installed_version) -> list[Expectation]:
    """The expectations whose version ranges match (the others do not apply)."""
    return [e for e in expectations if e.applies(version_of)]


def apply_one(row, expectations: list[Expectation]):
    """The row with its expected status: fail -> xfail when covered, pass -> xpass when expected to fail,
    error -> xfail when an expectation's `errors` globs match its reason.

    `expectations` must already be filtered by `applicable`. The row's `expected` records the
    expectation (why, link, where); an xfail row keeps the failure's reason after the why.
    """
    if row.status not in ("fail", "pass", "error"):
        return row
    matching = [e for e in expectations if e.matches(row.case_id, row.backend)]
    if not matching:
        return row
    if row.status == "error":
        for e in matching:
            if e.covers_error(row.reason or ""):
                return _with(row, status=XFAIL, reason=f"expected: {e.why} | {row.reason}", expected=_record(e))
        return row
    if row.status == "pass":
        e = matching[0]
        reason = f"expected to fail ({e.why}) but passed: remove the expectation at {e.where}"
        return _with(row, status=XPASS, reason=reason, expected=_record(e))
    failed = failed_parts(row)
    for e in matching:
        if e.covers(failed):
            return _with(row, status=XFAIL, reason=f"expected: {e.why} | {row.reason}", expected=_record(e))
    allowed = ", ".join(sorted(matching[0].outputs or ()))
    what = ", ".join(sorted(failed)) if failed else "something other than an output"
    note = f" (not the expected failure at {matching[0].where}: it allows only {allowed}, and {what} failed)"
    return _with(row, reason=row.reason + note)


def apply(rows: list, expectations: list[Expectation]) -> list:
    return [apply_one(r, expectations) for r in rows]


def _with(row, **changes):
    """A copy of a result row with `changes` (dataclass or pydantic model)."""
    if hasattr(row, "model_copy"):
        new = row.model_copy()
        for k, v in changes.items():  # assignment validates (a status string becomes the Status enum)
            setattr(new, k, v)
        return new
    return replace(row, **changes)


def _record(e: Expectation) -> dict[str, str]:
    """What a row keeps of its expectation: why, where, link, and the outputs it declares (comma-joined:
    the report ranks an xfail row on its other outputs only when its failures are all declared)."""
    out = {"why": e.why, "where": e.where} | ({"link": e.link} if e.link else {})
    return out | ({"outputs": ",".join(sorted(e.outputs))} if e.outputs else {})


def warnings(
    expectations: Iterable[Expectation], case_ids: Iterable[str], backends: Iterable[str], version_of=installed_version
) -> list[str]:
    """What is off about the user's expectations (as pytest warns of unknown marks): one that names no
    registered backend, matches no case of the sweep, or whose version pin does not apply here."""
    ids, names = list(case_ids), list(backends)
    out = []
    for e in expectations:
        if not any(fnmatch.fnmatchcase(b, e.backend) for b in names):
            out.append(f"{e.where}: expectation names backend {e.backend!r}, which no loaded backend matches")
        if not any(fnmatch.fnmatchcase(i, g) for i in ids for g in e.cases):
            out.append(f"{e.where}: expectation matches no case of this sweep ({', '.join(e.cases)})")
        for dist, spec in e.versions:
            if not _pin_holds(got := version_of(dist), spec):
                have = f"{dist} {got} is installed" if got else f"{dist} is not installed"
                out.append(f"{e.where}: expectation does not apply: it pins {dist} {spec}, and {have}")
    return out


def gather(suites: Iterable = (), files: Iterable[Path | str] = (), builtin_too: bool = True) -> list[Expectation]:
    """Every expectation of a run: the built-in ones, the suites' `expect:` entries, then `files`."""
    out = builtin() if builtin_too else []
    for s in suites:
        out += getattr(s, "expectations", [])
    for f in files:
        out += load(f)
    return out
