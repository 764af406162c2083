"""Hostile inputs that must cost bounded resources and end in one line (issue #30, "Bounded resources").

Each entry is what a careless user or a broken plugin produces; each says its exit code and the words
of its one-line message. Plugins are written to tmp_path; runs are small (one merge_state case).
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

from typer.testing import CliRunner

from attnbench.cli import app

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
