"""docs/adding-an-op.md section 6, executed as written: in a copy of the source tree, every file the guide
shows is created, every diff applied where it names, smoke regenerated, and the new op swept on the
CPU. It must pass, with its own error columns, after touching only the files the guide names."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "adding-an-op.md"
# where each source folder lives in the import package (pyproject.toml's package-dir)
LAYOUT = {"harness": "attnbench", "kernels": "attnbench/kernels", "references": "attnbench/references",
          "suites": "attnbench/suites"}  # fmt: skip


def _copy_tree(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "harness", dst / "attnbench", ignore=ignore)
    for folder in ("kernels", "references", "suites"):
        shutil.copytree(ROOT / folder, dst / LAYOUT[folder], ignore=ignore)


def _target(tree: Path, repo_path: str) -> Path:
    top, _, rest = repo_path.partition("/")
    return tree / LAYOUT[top] / rest


def _apply_diff(path: Path, diff: str) -> None:
    """Each run of `-` lines followed by `+` lines: the removed text, found once, becomes the added text."""
    text = path.read_text(encoding="utf-8")
    for old, new in re.findall(r"((?:^-.*\n)+)((?:^\+.*\n)+)", diff, flags=re.M):
        old = "".join(line[1:] + "\n" for line in old.splitlines())
        new = "".join(line[1:] + "\n" for line in new.splitlines())
        assert text.count(old) == 1, f"{path}: the guide's diff no longer matches: {old!r}"
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")


def test_the_guide_adds_an_op_in_five_files_and_it_runs(tmp_path):
    guide = GUIDE.read_text(encoding="utf-8").split("## 6. End to end", 1)[1]
    tree = tmp_path / "tree"
    _copy_tree(tree)
    touched = []
    for lang, title, body in re.findall(r'```(python|diff) title="([^"]+)"\n(.*?)```', guide, flags=re.S):
        path = _target(tree, title)
        if lang == "python":
            assert not path.exists(), f"{title} already exists"
            path.write_text(body, encoding="utf-8")
        else:
            _apply_diff(path, body)
        touched.append(title)
    assert sorted(touched) == sorted(["references/toy.py", "harness/ops/toy.py", "harness/ops/__init__.py",
                                      "kernels/torch/toy.py", "kernels/torch/__init__.py"])  # fmt: skip

    env = os.environ | {"PYTHONPATH": str(tree)}  # the copy shadows the installed attnbench
    (commands,) = re.findall(r"```bash\n(.*?)```", guide, flags=re.S)
    for line in commands.strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] in ("python", "attnbench"), line
        argv = [sys.executable, *(["-m", "attnbench"] if argv[0] == "attnbench" else []), *argv[1:]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    smoke = (tree / "attnbench" / "suites" / "smoke.yaml").read_text(encoding="utf-8")
    assert "toy_scale" in smoke and "toy_scale" not in (ROOT / "suites" / "smoke.yaml").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    # the op exists only in the copy: its rows show the copy ran
    assert rows and {r["op"] for r in rows} == {"toy_scale"} and {r["status"] for r in rows} == {"pass"}, rows
    table = list(csv.DictReader(open(tmp_path / "run" / "results.csv", encoding="utf-8")))
    assert all(t["y_max_abs"] != "" and t["y_bound"] != "" for t in table)
