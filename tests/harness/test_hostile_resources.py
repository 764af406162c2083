"""Hostile inputs that must cost bounded resources and end in one line (issue #30, "Bounded resources").

Each entry is what a careless user or a broken plugin produces; each says its exit code and the words
of its one-line message. Plugins are written to tmp_path; runs are small (one merge_state case).
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app

CASE = "merge_state/t9-h2-d16-fp32"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(res, code: int, *words):
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output and not (res.exception and not isinstance(res.exception, SystemExit)), (
        res.output,
        res.exception,
    )
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.output
    for w in words:
        assert w in errors[0], (w, res.output)


def _plugin(tmp_path: Path, name: str, body: str) -> Path:
    """A plugin backend `name` that runs torch's kernel, with `body` run inside prepare (case, inputs)."""
    path = tmp_path / f"{name.replace('-', '_')}.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import os, subprocess, sys
            import attnbench
            from attnbench.backend import get_backend

            @attnbench.register_backend({name!r})
            class Hostile(attnbench.Backend):
                ops = ("merge_state",)

                def supports(self, case):
                    return None

                def prepare(self, case, inputs):
            """
        )
        + textwrap.indent(textwrap.dedent(body), " " * 8)
        + "\n        return get_backend('torch').prepare(case, inputs)\n"
    )
    return path


# ---- a plugin's output and processes --------------------------------------------------------------


def test_a_worker_log_is_capped_keeping_head_and_tail(tmp_path):
    plugin = _plugin(
        tmp_path,
        "chatty",
        """
        sys.stdout.write("FIRST-LINE\\n" + "x" * (12 << 20) + "\\nLAST-LINE\\n")
        sys.stdout.flush()
        """,
    )
    out = tmp_path / "run"
    res = invoke("sweep", "--case", CASE, "-b", "chatty", "--plugin", plugin, "--device", "cpu", "--out", out)
    assert res.exit_code == 0, res.output
    (log,) = (out / "logs").glob("worker-*.log")
    text = log.read_bytes()
    assert len(text) < 9 << 20  # 4 MiB head + 4 MiB tail + one line
    assert b"FIRST-LINE" in text and b"LAST-LINE" in text
    assert b"bytes of worker output cut here" in text


def test_processes_a_plugin_starts_end_with_their_worker(tmp_path):
    pids = tmp_path / "pids"
    plugin = _plugin(
        tmp_path,
        "spawner",
        f"""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pids)!r}, "a").write(f"{{child.pid}}\\n")
        """,
    )
    out = tmp_path / "run"
    res = invoke("sweep", "--case", CASE, "-b", "spawner", "--plugin", plugin, "--device", "cpu", "--out", out)
    assert res.exit_code == 0, res.output
    children = [int(p) for p in pids.read_text().split()]
    assert children
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [p for p in children if _alive(p)]
        time.sleep(0.1)
    assert not alive, f"processes the plugin started outlived their worker: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---- one line, exit 2: the battery ---------------------------------------------------------------


def _cpu_run(path: Path, **run) -> Path:
    rows = [synthetic.row(CASE, "torch", median_us=None)]
    info = {"device": "cpu", "complete": True, "timing": False, "rows": 1, "schema_version": 2} | run
    return synthetic.write_run(path, rows, env={"device": "cpu", "cpu": "x86_64"}, run=info)


def _a_file(tmp_path: Path) -> Path:
    f = tmp_path / "a-file"
    f.write_text("x")
    return f


def _suite(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hostile.yaml"
    p.write_text(text)
    return p


def _big_suite(tmp_path: Path) -> Path:  # 1.6 M values, 4.6 MB: refused before it is parsed
    return _suite(
        tmp_path, "cases:\n  - op: merge_state\n    sweep:\n      tokens: [" + ", ".join(["1"] * 1_600_000) + "]\n"
    )


def _many_nodes(tmp_path: Path) -> Path:  # under the byte cap, over the value cap
    return _suite(
        tmp_path, "cases:\n  - op: merge_state\n    sweep:\n      tokens: [" + ", ".join(["1"] * 210_000) + "]\n"
    )


HOSTILE = {
    # name: (argv builder (tmp_path) -> args, exit code, words of the one error line)
    "compare --out a file": (
        lambda t: ["compare", _cpu_run(t / "a"), _cpu_run(t / "b"), "--out", _a_file(t)], 2, ["--out", "a file"]),
    "compare --out under a file": (
        lambda t: ["compare", _cpu_run(t / "a"), _cpu_run(t / "b"), "--out", _a_file(t) / "x"], 2, ["--out", "a file"]),
    "gate --out a file": (lambda t: ["gate", _cpu_run(t / "a"), "--out", _a_file(t)], 2, ["--out", "a file"]),
    "gate --out unwritable": (lambda t: ["gate", _cpu_run(t / "a"), "--out", "/proc/attnbench-gate"], 2, ["--out"]),
    "merge --out a file": (lambda t: ["merge", _cpu_run(t / "a"), "--out", _a_file(t)], 2, ["--out", "a file"]),
    "merge --out unwritable": (lambda t: ["merge", _cpu_run(t / "a"), "--out", "/proc/attnbench-merge"], 2, ["--out"]),
    "merge of a run on tpu:0": (
        lambda t: ["merge", _cpu_run(t / "a", device="tpu:0"), "--out", t / "m"], 2, ["run.json", "unknown device", "tpu:0"]),
    "profile --out under a file": (
        lambda t: ["profile", CASE, "-b", "torch", "--device", "cpu", "--out", _a_file(t) / "p.md"], 2, ["--out"]),
    "profile --out a directory": (
        lambda t: ["profile", CASE, "-b", "torch", "--device", "cpu", "--out", t], 2, ["--out", "is a directory"]),
    "gate of a newer run.json": (
        lambda t: ["gate", _cpu_run(t / "a", schema_version=99)], 2, ["run.json", "newer attnbench"]),
    "sm_scale: .inf": (
        lambda t: ["sweep", _suite(t, "cases:\n  - op: decode\n    params: {sm_scale: .inf}\n"), "--dry-run"],
        2, ["hostile.yaml:3", "sm_scale", "finite"]),
    "sm_scale: .nan": (
        lambda t: ["sweep", _suite(t, "cases:\n  - op: decode\n    params: {sm_scale: .nan}\n"), "--dry-run"],
        2, ["hostile.yaml:3", "sm_scale", "finite"]),
    "a 4.6 MB suite": (lambda t: ["sweep", _big_suite(t), "--dry-run"], 2, ["hostile.yaml", "MiB", "at most 1 MiB"]),
    "a suite of 210,000 values": (lambda t: ["sweep", _many_nodes(t), "--dry-run"], 2, ["hostile.yaml:4", "200000 values"]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_is_one_line(name, tmp_path):
    build, code, words = HOSTILE[name]
    t0 = time.perf_counter()
    args = build(tmp_path)
    res = invoke(*args, *(["--device", "cpu"] if args[0] == "sweep" else []))
    assert time.perf_counter() - t0 < 30
    one_line_error(res, code, *words)


def test_a_plugin_that_changes_directory_under_no_isolate_keeps_a_relative_out(tmp_path, monkeypatch):
    """--out is resolved at the start: the run is written, reported and marked complete where asked."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plugin = _plugin(tmp_path, "wanderer", f"os.chdir({str(elsewhere)!r})")
    monkeypatch.chdir(tmp_path)
    res = invoke("sweep", "--case", CASE, "-b", "wanderer", "--plugin", plugin, "--device", "cpu", "--no-isolate",
                 "--out", "rel/run")  # fmt: skip
    os.chdir(tmp_path)
    assert res.exit_code == 0, (res.output, res.exception)
    run = tmp_path / "rel" / "run"
    assert json.loads((run / "run.json").read_text())["complete"] is True
    assert (run / "report.html").is_file() and not (elsewhere / "rel").exists()


def test_expectations_that_cannot_do_anything_are_warned_of(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "expect:\n"
        "  - {backend: nosuch, cases: 'merge_state/*', why: unknown backend}\n"
        "  - {backend: torch, cases: 'decode/nothing-*', why: matches nothing}\n"
        "  - {backend: torch, cases: 'merge_state/*', versions: {torch: '<1'}, why: a pin that does not apply}\n"
        "  - {backend: torch, cases: 'merge_state/*', versions: {torch: '>=1'}, why: a good one}\n"
    )
    res = invoke("sweep", "--case", CASE, "-b", "torch", "--expect", exp, "--device", "cpu", "--dry-run")
    assert res.exit_code == 0, res.output
    warned = [line for line in res.output.splitlines() if line.startswith("warning:")]
    assert len(warned) == 3, res.output
    assert f"{exp.name}:2:" in warned[0] and "'nosuch', which no loaded backend matches" in warned[0]
    assert f"{exp.name}:3:" in warned[1] and "matches no case" in warned[1]
    assert f"{exp.name}:4:" in warned[2] and "pins torch <1" in warned[2]
