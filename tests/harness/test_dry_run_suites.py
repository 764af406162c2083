"""`attnbench sweep NAME --dry-run` of every built-in suite, on the CPU: a dry run never crashes.

A dry run sizes every case (`Op.input_bytes`) without building it; a GPU suite is planned (not run)
on a CPU machine so that its sizes are checked here too.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.plan.suite import builtin_names


@pytest.mark.parametrize("name", builtin_names())
def test_dry_run_of_every_builtin_suite(name):
    res = CliRunner().invoke(app, ["sweep", name, "--dry-run", "--device", "cpu"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert res.exit_code == 0, res.output
    assert "size unknown" not in res.output and "could not be sized" not in res.output, res.output
    n = int(res.output.splitlines()[0].split()[0])
    assert n > 0 and sum("inputs, >=" in line for line in res.output.splitlines()) == n, res.output


def test_eagle_build_tree_sizes_a_full_mask_beyond_the_packed_limit():
    """The bit-packed mask holds 32 tokens; a full or qlen mask of 64 is a valid case and has a size."""
    from attnbench.case import Case

    for mode in ("full", "qlen"):
        c = Case.from_id(f"eagle_build_tree/b1-pre4096-k8-depth5-n64-mask{mode}-bf16", "cpu")
        assert c.op.input_bytes(c.params, c.torch_dtype, c.seed) > 0
