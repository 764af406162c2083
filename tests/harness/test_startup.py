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


def test_the_public_names_survive_the_stage_packages():
    """What kernels/, plugins and the guides import by name (docs/architecture.md: the core stays at the top,
    the package re-exports the rest), each one object whichever way it is reached."""
    import attnbench
    from attnbench.backend import Backend, implements, register_backend
    from attnbench.buffers import alloc_output, clone_tensors
    from attnbench.case import Case
    from attnbench.check.checklist import register_check
    from attnbench.dtypes import to_torch
    from attnbench.errors import AttnbenchError, Unsupported
    from attnbench.ops import OPS

    assert attnbench.Case is Case and attnbench.Backend is Backend and attnbench.register_backend is register_backend
    assert attnbench.register_check is register_check
    assert issubclass(Unsupported, Exception) and issubclass(AttnbenchError, Exception) and callable(implements) and OPS
    assert callable(alloc_output) and callable(clone_tensors) and callable(to_torch)
    assert set(attnbench.__all__) == {"Backend", "register_backend", "Case", "register_check", "__version__"}
    with pytest.raises(AttributeError):
        attnbench.checklist_typo  # noqa: B018
