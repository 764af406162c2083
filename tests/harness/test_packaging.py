"""Packaging: every source package is listed, and nothing installs a top-level `harness` or `kernels`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = {"harness": "attnbench", "kernels": "attnbench.kernels", "references": "attnbench.references",
          "suites": "attnbench.suites"}  # fmt: skip


def _declared() -> set[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(cfg["packages"])


def test_every_package_folder_is_declared():
    found = set()
    for top, name in PREFIX.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            if "__pycache__" not in rel:
                found.add(".".join((name, *rel)))
    found.add("attnbench.suites.models")  # data-only package (presets.yaml, model suites)
    assert found == _declared(), f"missing: {found - _declared()}, stale: {_declared() - found}"


@pytest.mark.slow
def test_wheel_maps_everything_under_attnbench(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)], check=True
    )
    (wheel,) = tmp_path.glob("attnbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"attnbench", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert "attnbench/suites/smoke.yaml" in names and "attnbench/suites/models/presets.yaml" in names
    assert "attnbench/suites/traces/serving.jsonl" in names  # the built-in trace the serving suite replays
    assert "attnbench/report/template.html.j2" in names
    assert "attnbench/kernels/torch/__init__.py" in names and "attnbench/references/attention.py" in names
