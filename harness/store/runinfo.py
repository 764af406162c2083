"""Run metadata (`run.json`): what a run directory holds and how it was made, one shape for every run.

`attnbench sweep` writes it at the start and again as the run goes (precompile, finish, stop);
`attnbench merge` writes the same shape with `kind: "merge"` and the runs it combined in `merged_from`.
Files from before versioning (no `schema_version`; a merge's old `{"merged": [...], "rows": N}`) stay
readable: `read_run` fills the device from the run's env.json where run.json lacks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from attnbench.store.results import SCHEMA_VERSION, SchemaError, check_version

SOURCE_PATHS = ("harness", "kernels", "references", "suites", "pyproject.toml")  # what a run's results depend on


class Git(BaseModel):
    """The attnbench source the run used: commit, whether the tree had uncommitted changes, and `source`,
    the fingerprint of the files under `SOURCE_PATHS` as they were (`source_fingerprint`): a dirty run
    (a tree copied to a GPU machine over an older .git) names its exact source through it. The
    fingerprint of a commit's files is `git ls-tree -r --format='%(objectname) %(path)' COMMIT --
    harness kernels references suites pyproject.toml | LC_ALL=C sort | sha256sum` (`commit_fingerprint`)."""

    commit: str | None = None
    dirty: bool | None = None
    source: str | None = None


class Shard(BaseModel):
    """Shard `k` of `n` (1-based) of a sweep's ordered case selection."""

    k: int
    n: int

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


class Source(BaseModel):
    """One run a merge combined."""

    model_config = ConfigDict(extra="allow")

    path: str
    device: str | None = None
    shard: Shard | None = None
    rows: int = 0
    kept: int = 0  # its first rows, which its wall time does not hold (a resumed run's earlier processes')
    complete: bool | None = None
    git: Git | None = None


class RunInfo(BaseModel):
    """run.json. Unknown fields are kept (read and written back unchanged)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["sweep", "merge"] = "sweep"
    attnbench: str | None = None  # the package version that wrote the run
    git: Git | None = None
    argv: list[str] = []
    device: str | None = None  # where the kernels ran: the device every repro command names
    devices: list[str] = []  # worker devices (--gpus)
    suites: list[str] = []
    traces: list[str] = []  # replayed traces (docs/trace.md): built-in by name, else the path given
    backends: list[str] = []
    named_backends: list[dict[str, Any]] = []  # each -b argument: {arg, pattern, backends} (attnbench.store.verified)
    plugins: list[str] = []
    tolerances: list[dict[str, Any]] = []  # the suites' loosened tolerances: suite, op, factor, floor, why, cases
    filters: dict[str, Any] = {}
    shard: Shard | None = None
    timing: bool | None = None  # False: correctness only (--no-timing, --sanitize)
    executor: str | None = None  # in-process | isolated | sanitizer
    isolated: bool | None = None
    sanitize: dict[str, Any] | None = None
    started: str | None = None
    finished: str | None = None
    wall_s: float | None = None
    complete: bool | None = None
    stopped_by: str | None = None
    resumed: list[dict[str, Any]] = []
    precompile: list[dict[str, Any]] = []
    references: dict[str, Any] | None = None  # computed, from_cache, cache (directory or "off"), problems
    costs: dict[str, float] = {}  # wall time outside the cases: worker_start_s, record_s, report_s
    merged_from: list[Source] = []  # kind "merge": the runs combined
    missing_shards: list[str] = []  # kind "merge" with --partial: the shards K/N not among them
    rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (fields left unset, None, are not written)."""
        return self.model_dump(mode="json", exclude_none=True)

    def shards(self) -> list[Shard]:
        """The shards whose rows this run holds (a merge: its sources' shards)."""
        if self.kind == "merge":
            return [s.shard for s in self.merged_from if s.shard]
        return [self.shard] if self.shard else []


def write_run(info: RunInfo, run_dir: Path) -> None:
    """Write run.json (via a temporary file, so a crash leaves the old one or the new one)."""
    path = Path(run_dir) / "run.json"
    tmp = path.with_name("run.json.tmp")
    tmp.write_text(json.dumps(info.to_dict(), indent=2), encoding="utf-8")
    os.replace(tmp, path)


def read_run(run_dir: Path) -> RunInfo:
    """A run directory's run.json as a RunInfo (an empty one when the file is absent).

    Raises SchemaError (file and what is wrong) for a file that is not JSON, not a run, or of a newer
    schema version. Older files: the device comes from env.json when run.json has none.
    """
    run_dir = Path(run_dir)
    path = run_dir / "run.json"
    if not path.is_file():
        info = RunInfo(schema_version=1)
    else:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SchemaError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise SchemaError(f"{path}: not a JSON object")
        try:
            check_version(d.get("schema_version", 1), str(path))
            if "merged" in d and "merged_from" not in d:  # the shape merge wrote before version 2
                d = {"kind": "merge", "merged_from": [{"path": p} for p in d.pop("merged")]} | d
            d.setdefault("schema_version", 1)
            info = RunInfo.model_validate(d)
        except ValidationError as e:
            err = e.errors()[0]
            raise SchemaError(f"{path}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
        if info.shard is None and isinstance(info.filters.get("shard"), list | tuple):
            k, n = info.filters["shard"]  # version 1 kept the shard among the filters only
            info.shard = Shard(k=k, n=n)
    if info.device is None:
        env = run_dir / "env.json"
        try:
            info.device = json.loads(env.read_text(encoding="utf-8")).get("device")
        except (OSError, ValueError, AttributeError):
            pass
    return info


def git_info(root: Path | None = None) -> Git | None:
    """Commit and dirty flag of the attnbench checkout this code runs from. Where the code is not a git
    checkout (an installed copy, a tree copied to a GPU runner without .git) the commit comes from
    `$ATTNBENCH_GIT_COMMIT` (and `$ATTNBENCH_GIT_DIRTY`, 1/0) when set, else None."""
    root = Path(root) if root else Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / ".git").exists():
        return _git_from_env()

    commit = _git_out(root, "rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git_out(root, "status", "--porcelain", "--untracked-files=no")
    return Git(
        commit=commit.strip(), dirty=None if status is None else bool(status.strip()), source=source_fingerprint(root)
    )


def _fingerprint(lines: list[str]) -> str:
    return hashlib.sha256("".join(f"{line}\n" for line in sorted(lines, key=str.encode)).encode()).hexdigest()


def _git_out(root: Path, *args: str, stdin: str | None = None) -> str | None:
    """`git -C root ARGS`'s stdout, or None where git is missing, fails or takes over 10 s."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], input=stdin, capture_output=True, text=True, timeout=10
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def source_fingerprint(root: Path) -> str | None:
    """sha256 of the `<blob id> <path>` lines (sorted bytewise, one per line) of every file under
    `SOURCE_PATHS` in the checkout at `root` as it is on disk: tracked and untracked files that git
    does not ignore, a deleted tracked file left out. Equal to `commit_fingerprint` of a commit exactly
    when the files are that commit's. None where git cannot say."""
    listed = _git_out(root, "ls-files", "-co", "--exclude-standard", "-z", "--", *SOURCE_PATHS)
    if listed is None:
        return None
    paths = sorted({p for p in listed.split("\0") if p and (root / p).is_file()})
    if not paths:
        return _fingerprint([])
    blobs = _git_out(root, "hash-object", "--stdin-paths", stdin="".join(f"{p}\n" for p in paths))
    if blobs is None or len(blobs.split()) != len(paths):
        return None
    return _fingerprint([f"{b} {p}" for b, p in zip(blobs.split(), paths)])


def commit_fingerprint(root: Path, commit: str = "HEAD") -> str | None:
    """The `source_fingerprint` of `commit`'s files (its tree, whatever is on disk)."""
    listed = _git_out(root, "ls-tree", "-r", "--format=%(objectname) %(path)", commit, "--", *SOURCE_PATHS)
    return None if listed is None else _fingerprint(listed.splitlines())


def _git_from_env() -> Git | None:
    commit = os.environ.get("ATTNBENCH_GIT_COMMIT", "").strip()
    if not commit:
        return None
    dirty = {"1": True, "0": False}.get(os.environ.get("ATTNBENCH_GIT_DIRTY", "").strip())
    return Git(commit=commit, dirty=dirty)
