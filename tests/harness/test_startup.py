"""`attnbench --help` and `--version` start without importing torch (they answer in well under a second)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _imported(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    res = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120)
    modules = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    return res, modules


def test_importing_the_cli_does_not_import_torch():
    res, modules = _imported("-c", "import attnbench.cli.app")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "attnbench.cli.app" in modules and "torch" not in modules


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["sweep", "--help"]])
def test_help_and_version_do_not_import_torch(args):
    res, modules = _imported("-m", "attnbench", *args)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "torch" not in modules
    if args == ["--version"]:
        from attnbench import __version__

        assert res.stdout.strip() == f"attnbench {__version__}"


def test_the_public_api_still_offers_case():
    from attnbench import Case

    assert Case.from_id("merge_state/t8-h2-d16-bf16").op_name == "merge_state"
