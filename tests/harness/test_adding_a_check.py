"""docs/adding-a-check.md, executed as written: its Python blocks become the plugin `my_checks.py`, its
command runs in a temporary directory, and the rows must say what the guide says they say."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "adding-a-check.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def test_the_guide_adds_a_check_that_records_on_the_row_and_catches_its_mutant(tmp_path):
    (tmp_path / "my_checks.py").write_text("\n\n".join(_blocks("python")), encoding="utf-8")
    (command,) = _blocks("bash")
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["attnbench", "sweep"]
    done = subprocess.run([sys.executable, "-m", "attnbench", *argv[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # the mutant's row fails the run
    rows = {r["backend"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines())}
    assert rows["torch"]["status"] == "pass" and rows["torch"]["contiguous"] is True
    bad = rows["strided-torch"]
    assert bad["status"] == "fail" and bad["contiguous"] is False
    assert bad["reason"].startswith("not contiguous: lse, o"), bad["reason"]  # caught by the new check
    assert "contiguity" in rows["torch"]["check_parts"] and "contiguity" in bad["check_parts"]
