"""pytest plugin (entry point `pytest11: attnbench`): run attnbench suites as parametrized tests.

    pytest --attnbench smoke --attnbench-backend torch
    pytest --attnbench decode --attnbench-benchmark-json bench.json -n 2   # one GPU per xdist worker

Each (case, backend) of the suites becomes one test, `attnbench:<suite>::<case id>[<backend>]`, that
asserts the correctness verdict (a skip row is a pytest skip; a fail or error row fails with the
reason and the command that re-runs it). The suites run through the same session as `attnbench
sweep` (harness/run/session.py): the same backends and expectations, so a known failure (the built-in
findings, a suite's `expect:`, `--attnbench-expect FILE`) is an xfail, and an expected failure that
passes (xpass) fails, as it fails a sweep. With `--attnbench-benchmark-json PATH` (or
`--attnbench-timing`) passing rows are also timed by the harness's timing function, one backend at a
time (use `attnbench sweep` for backends interleaved), and PATH receives the timings in
pytest-benchmark's JSON format, so `pytest-benchmark compare PATH ...` works on it.

Under pytest-xdist, worker gwN runs on cuda:N (modulo the GPUs present) when the device is `auto` or
`cuda` and several GPUs are visible; the controller gathers every worker's timings into PATH.

A backend that kills its process (os._exit, a segfault, a lost CUDA context) fails its test and
pytest goes on: cases run in an attnbench worker process, as in `attnbench sweep`, a batch of
upcoming tests at a time (`--attnbench-in-process` runs them in pytest's process instead). Under
xdist, tests run in the xdist worker, which xdist replaces when it dies. Backends registered in a
conftest cannot be re-created in a worker, so they always run in pytest's process. With `--attnbench`
and no test paths on the command line, pytest collects only the suites, not the project's own tests.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
from pathlib import Path

import pytest

_KEY = "attnbench-benchmark"
_ISOLATED = pytest.StashKey["Isolated"]()
_SESSION = pytest.StashKey["object"]()  # attnbench.run.session.Session
BATCH = 32  # tests run in one attnbench worker before it is replaced (a worker start costs seconds)


def pytest_addoption(parser):
    group = parser.getgroup("attnbench")
    group.addoption(
        "--attnbench", action="append", default=[], metavar="SUITE", help="run this attnbench suite as tests"
    )
    group.addoption("--attnbench-backend", action="append", default=[], metavar="NAME", help="only these backends")
    group.addoption("--attnbench-device", default="auto", help="auto, cpu, cuda or cuda:N")
    group.addoption(
        "--attnbench-plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="import backends from this file or module",
    )
    group.addoption(
        "--attnbench-expect",
        action="append",
        default=[],
        metavar="YAML",
        help="expected failures, as `attnbench sweep --expect` (covered fails are xfail, passes fail as xpass)",
    )
    group.addoption(
        "--attnbench-no-expect",
        action="store_true",
        help="apply no expectations (built-in, suites', --attnbench-expect): every fail fails",
    )
    group.addoption("--attnbench-timing", action="store_true", help="time every passing case")
    group.addoption(
        "--attnbench-in-process",
        action="store_true",
        help="run cases in pytest's process (faster to start; a backend that crashes takes pytest down)",
    )
    group.addoption(
        "--attnbench-timeout", type=float, default=900.0, help="seconds a case may take in a worker (default 900)"
    )
    group.addoption(
        "--attnbench-benchmark-json",
        default=None,
        metavar="PATH",
        help="write the timings to PATH in pytest-benchmark's JSON format (implies timing)",
    )


def worker_device(requested: str, worker: str | None, n_gpus: int) -> str:
    """The device one pytest process uses: xdist worker gwN gets cuda:N mod n_gpus when several GPUs exist."""
    if requested == "auto":
        requested = "cuda" if n_gpus > 0 else "cpu"
    m = re.fullmatch(r"gw(\d+)", worker or "")
    if requested == "cuda" and m and n_gpus > 1:
        return f"cuda:{int(m.group(1)) % n_gpus}"
    return requested


def _device(config) -> str:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return worker_device(config.getoption("attnbench_device"), os.environ.get("PYTEST_XDIST_WORKER"), n)


def pytest_report_header(config):
    if config.getoption("attnbench"):
        return f"attnbench: suites {', '.join(config.getoption('attnbench'))} on {_device(config)}"
    return None


def _collects_only_suites(config) -> bool:
    """`pytest --attnbench SUITE` without test paths: the suites are the tests, not the project's files."""
    if not config.getoption("attnbench"):
        return False
    source = getattr(config, "args_source", None)
    return source is not None and source != pytest.Config.ArgsSource.ARGS


def pytest_ignore_collect(collection_path, config):
    if _collects_only_suites(config):
        return True
    return None


def rerun_command(case, backend: str, plugins: list[str]) -> str:
    """The `attnbench sweep` line that re-runs one (case, backend), with the plugins it needs."""
    args = ["attnbench", "sweep", "--case", case.id, "--backend", backend, "--device", case.device]
    for p in plugins:
        args += ["--plugin", p]
    if case.trace:  # a replayed batch: its id names its lengths by digest, the trace holds them
        args += ["--trace", case.trace]
    return shlex.join(args)


def _worker_loadable(backend, plugins: list[str]) -> bool:
    """Whether a fresh attnbench worker has this backend: built in, a named plugin, or an entry point."""
    import importlib.metadata

    module = type(backend).__module__
    if module.startswith(("attnbench.", "attnbench_plugin_")) or module in plugins:
        return True
    eps = importlib.metadata.entry_points(group="attnbench.backends")
    return any(module == ep.value.split(":")[0] or module.startswith(ep.value.split(":")[0] + ".") for ep in eps)


class Isolated:
    """Runs AttnbenchItems in attnbench worker processes, a batch of upcoming items per worker."""

    def __init__(self, config):
        self.config = config
        self.rows: dict[tuple[str, str], object] = {}
        self.problems: list[str] = []

    def row(self, item: AttnbenchItem):
        key = (item.case.id, item.backend.name)
        if key not in self.rows:
            self._run(self._batch(item))
        row = self.rows.pop(key, None)
        if row is None:
            from attnbench.run.runner import error_row

            row = error_row(item.case, item.backend.name, "the worker returned no row; " + "; ".join(self.problems))
        return row

    def _batch(self, item: AttnbenchItem) -> list[AttnbenchItem]:
        items = item.session.items
        start = items.index(item) if item in items else 0
        batch = [item]
        for other in items[start + 1 :]:
            if len(batch) >= BATCH:
                break
            if isinstance(other, AttnbenchItem) and other.isolated and other.case.device == item.case.device:
                batch.append(other)
        return batch

    def _run(self, batch: list[AttnbenchItem]) -> None:
        from attnbench.run.executor import Isolated
        from attnbench.run.runner import RunOptions

        jobs: dict[str, tuple] = {}
        for it in batch:
            jobs.setdefault(it.case.id, (it.case, []))[1].append(it.backend.name)

        def record(case, case_rows):
            for r in case_rows:
                self.rows[(r.case_id, r.backend)] = r

        cfg = self.config
        workers = Isolated((batch[0].case.device,), RunOptions(timing=batch[0].timing),
                           plugins=tuple(cfg.getoption("attnbench_plugin")), timeout_s=cfg.getoption("attnbench_timeout"),
                           on_problem=self.problems.append)  # fmt: skip
        workers.run(list(jobs.values()), record)


class CaseFailed(Exception):
    """A fail or error row."""

    def __init__(self, row, repro: str):
        super().__init__(row.reason)
        self.row, self.repro = row, repro


class SuiteNode(pytest.Collector):
    """The parent of one suite's items (collected by the plugin, not from a file)."""

    def collect(self):
        return []


class AttnbenchItem(pytest.Item):
    """One (case, backend): runs it through the harness's runner and asserts its verdict."""

    def __init__(self, *, case, backend, timing: bool, isolated: bool = False, **kw):
        super().__init__(**kw)
        self.case, self.backend, self.timing, self.isolated = case, backend, timing, isolated
        self.row = None

    def runtest(self):
        from attnbench.run.runner import RunOptions, run_case

        if self.isolated:
            row = self.row = self.config.stash[_ISOLATED].row(self)
        else:
            row = self.row = run_case(self.case, [self.backend], RunOptions(timing=self.timing))[0]
        row = self.row = self.config.stash[_SESSION].verdicts([row])[0]
        if row.status == "skip":
            pytest.skip(row.reason)
        if row.status == "xfail":
            expected = row.expected or {}
            pytest.xfail(f"{row.reason} (known failure: {expected.get('why', '')} [{expected.get('where', '')}])")
        if row.status in ("fail", "error", "xpass"):
            plugins = self.config.getoption("attnbench_plugin")
            raise CaseFailed(row, rerun_command(self.case, self.backend.name, plugins))
        if row.timing:
            self.user_properties.append((_KEY, benchmark_entry(self, row)))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            e = excinfo.value
            return f"{e.row.status}: {e.row.reason}\nre-run alone: {e.repro}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"attnbench {self.case.id} [{self.backend.name}]"


def benchmark_entry(item: AttnbenchItem, row) -> dict:
    """One benchmark of pytest-benchmark's JSON (stats in seconds per call) from a timed row."""
    from pytest_benchmark.stats import Stats

    t, d = row.timing, row.derived or {}
    stats = Stats()
    for us in t["samples_us"]:
        stats.update(us * 1e-6)
    extra = {k: t.get(k) for k in ("clock", "mode", "median_us", "ci95_us", "converged", "n_throttled", "l2_flush")}
    extra |= {k: d[k] for k in ("tflops", "tbps", "intensity", "roofline_pct") if k in d}
    return {
        "group": row.op,
        "name": item.name,
        "fullname": item.nodeid,
        "params": {"case": row.case_id, "backend": row.backend},
        "param": f"{row.case_id}-{row.backend}",
        "extra_info": extra | {"device": item.case.device},
        "options": {
            "timer": t["clock"],
            "warmup": True,
            "disable_gc": False,
            "min_rounds": None,
            "max_time": None,
            "min_time": None,
        },
        "stats": stats.as_dict() | {"iterations": t.get("calls_per_sample", 1)},
    }


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so that they apply to these items
def pytest_collection_modifyitems(session, config, items):
    suites = config.getoption("attnbench")
    if not suites:
        return
    from attnbench.errors import AttnbenchError
    from attnbench.run.session import Session
    from attnbench.run.sweep import Selection

    timing = bool(config.getoption("attnbench_timing") or config.getoption("attnbench_benchmark_json"))
    expect_files, no_expect = config.getoption("attnbench_expect"), config.getoption("attnbench_no_expect")
    try:
        if expect_files and no_expect:
            raise AttnbenchError("--attnbench-expect and --attnbench-no-expect contradict each other")
        sel = Selection(
            suites=tuple(suites),
            device=_device(config),
            backends=tuple(config.getoption("attnbench_backend") or ()),
            expect_files=tuple(expect_files or ()),
            expect=not no_expect,
        )
        s = Session.open(sel, config.getoption("attnbench_plugin") or ())
    except AttnbenchError as e:
        raise pytest.UsageError(f"attnbench: {e}") from None
    for w in s.warnings:
        config.issue_config_time_warning(pytest.PytestConfigWarning(f"attnbench: {w}"), stacklevel=2)
    config.stash[_SESSION] = s
    p = s.plan
    nodes = {
        s.name: SuiteNode.from_parent(session, name=f"attnbench:{s.name}", nodeid=f"attnbench:{s.name}")
        for s in p.suites
    }
    plugins = config.getoption("attnbench_plugin")
    isolate = not config.getoption("attnbench_in_process") and os.environ.get("PYTEST_XDIST_WORKER") is None
    loadable = {b.name: isolate and _worker_loadable(b, plugins) for b in p.backends}
    config.stash[_ISOLATED] = Isolated(config)
    for case in p.cases:
        for b in p.backends:
            items.append(
                AttnbenchItem.from_parent(
                    nodes[case.suite], name=f"{case.id}[{b.name}]", case=case, backend=b, timing=timing,
                    isolated=loadable[b.name],
                )
            )  # fmt: skip


def pytest_configure(config):
    if config.getoption("attnbench_benchmark_json"):
        try:
            import pytest_benchmark.stats  # noqa: F401
        except ImportError:
            raise pytest.UsageError("--attnbench-benchmark-json needs pytest-benchmark installed") from None
        config.pluginmanager.register(BenchmarkRecorder(config), "attnbench-benchmark-recorder")


class BenchmarkRecorder:
    """Gathers timed rows from the test reports (on the xdist controller too); writes the JSON at the end."""

    def __init__(self, config):
        self.config, self.benchmarks = config, []

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.benchmarks += [value for key, value in report.user_properties if key == _KEY]

    def pytest_sessionfinish(self, session, exitstatus):
        if hasattr(self.config, "workerinput"):  # xdist workers send their reports; the controller writes
            return
        write_benchmark_json(self.config, self.benchmarks, Path(self.config.getoption("attnbench_benchmark_json")))


def _machine_info(config) -> dict:
    from attnbench.store import env

    info = {
        "node": platform.node(),
        "processor": platform.processor(),
        "machine": platform.machine(),
        "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(),
        "python_build": list(platform.python_build()),
        "release": platform.release(),
        "system": platform.system(),
        "cpu": {},
    }
    try:
        info["attnbench"] = env.capture(_device(config))
    except Exception as e:  # a description of the machine must not fail the session
        info["attnbench"] = {"error": str(e)}
    return info


def write_benchmark_json(config, benchmarks: list[dict], path: Path) -> None:
    import pytest_benchmark
    from pytest_benchmark.utils import get_commit_info

    try:
        commit = get_commit_info()
    except Exception:
        commit = {}
    doc = {
        "machine_info": _machine_info(config),
        "commit_info": commit,
        "benchmarks": sorted(benchmarks, key=lambda b: b["fullname"]),
        "datetime": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": pytest_benchmark.__version__,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
