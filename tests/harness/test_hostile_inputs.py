"""A battery of hostile inputs (issue #30): broken plugins, loosened suites, torn results files,
concurrent runs. Each must end in one clear line and the right exit code, never in a green verdict
where nothing was verified. One parametrised test per family: its input, exit code and message."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attnbench.cli import app

runner = CliRunner()
CASE = "merge_state/t9-h2-d16-fp32"  # a small smoke case the torch backend passes on a CPU


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


# ---- plugins ---------------------------------------------------------------------------------------

PLUGINS = {
    "sys.exit(main()) at import": "import sys\n\ndef main():\n    return 0\n\nsys.exit(main())\n",
    "sys.exit(3) at import": "import sys\nsys.exit(3)\n",
    "a bare BaseException at import": "raise BaseException('plugin gave up')\n",
    "a plugin taking the name torch": (
        "import attnbench\nfrom attnbench.kernels.torch import TorchBackend as Base\n\n"
        "@attnbench.register_backend('torch')\nclass TorchBackend(Base):\n    pass\n"
    ),
    "a plugin taking the name triton with another class": (
        "import attnbench\nfrom attnbench.kernels.torch import TorchBackend\n\n"
        "@attnbench.register_backend('triton')\nclass Mine(TorchBackend):\n    pass\n"
    ),
}
PLUGIN_MESSAGES = {
    "sys.exit(main()) at import": "SystemExit(0) while importing it",
    "sys.exit(3) at import": "SystemExit(3) while importing it",
    "a bare BaseException at import": "BaseException: plugin gave up",
    "a plugin taking the name torch": "backend name 'torch' is taken by attnbench.kernels.torch.TorchBackend",
    "a plugin taking the name triton with another class": "backend name 'triton' is taken by attnbench.kernels.triton",
}


@pytest.mark.parametrize("command", ["sweep", "list backends", "profile"])
@pytest.mark.parametrize("what", list(PLUGINS))
def test_a_plugin_that_does_not_load_is_exit_2_naming_its_file(tmp_path, what, command):
    plugin = tmp_path / "broken_plugin.py"
    plugin.write_text(PLUGINS[what])
    args = {
        "sweep": ["sweep", "--case", CASE, "-b", "torch", "--device", "cpu", "--no-isolate", "--out", tmp_path / "r"],
        "list backends": ["list", "backends", "--device", "cpu"],
        "profile": ["profile", CASE, "-b", "torch", "--device", "cpu"],
    }[command]
    res = invoke(*args, "--plugin", plugin)
    assert res.exit_code == 2, res.output
    assert f"plugin {plugin}" in res.output and PLUGIN_MESSAGES[what] in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "r").exists()
    if "taking the name" in what:  # both modules are named
        assert "attnbench_plugin_broken_plugin" in res.output


def test_a_module_imported_again_registers_its_backend_again():
    """Re-importing (reloading) the module that registered a name is not a clash."""
    import importlib
    import sys

    from attnbench import backend

    mod = importlib.import_module("attnbench.kernels.torch")
    importlib.reload(mod)
    assert backend.all_backends()["torch"].__class__.__module__ == "attnbench.kernels.torch"
    assert sys.modules["attnbench.kernels.torch"] is mod


# ---- suites ----------------------------------------------------------------------------------------

SUITE = (
    'cases:\n  - op: merge_state\n    sweep: {{tokens: [9]}}\n    tolerance: {{{tol}, why: "a reviewer reads this"}}\n'
)


@pytest.mark.parametrize(
    "tol, message",
    [
        ("factor: .inf", "factor: must be a finite number, got inf"),
        ("floor: .inf", "floor: must be a finite number, got inf"),
        ("factor: .nan", "factor: must be a finite number, got nan"),
        ("floor: .nan", "floor: must be a finite number, got nan"),
        ("floor: '-inf'", "floor: must be a finite number, got -inf"),
        ("factor: 1e9", "factor: 1e+09 loosens the tolerance beyond the most a suite may (16"),
        ("factor: 16.5", "factor: 16.5 loosens the tolerance beyond the most a suite may (16"),
        ("floor: 1000", "floor: 1000 loosens the tolerance beyond the most a suite may (16"),
    ],
)
def test_a_tolerance_that_is_not_finite_or_too_loose_is_refused_at_its_line(tmp_path, tol, message):
    suite = tmp_path / "loose.yaml"
    suite.write_text(SUITE.format(tol=tol))
    res = invoke("sweep", suite, "--device", "cpu", "--dry-run")
    assert res.exit_code == 2, res.output
    assert f"{suite}:4: cases[0].tolerance.{message}" in res.output, res.output
    assert "Traceback" not in res.output


def test_the_largest_allowed_tolerance_loads(tmp_path):
    suite = tmp_path / "loose.yaml"
    suite.write_text(SUITE.format(tol="factor: 16, floor: 16"))
    assert invoke("sweep", suite, "--device", "cpu", "--dry-run").exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ["smoke", "smoke", "--op", "merge_state"],
        ["smoke", "--op", "merge_state", "--case", "merge_state/t33-h4-d64-fp32"],
        ["--case", CASE, "--case", CASE],
    ],
    ids=["the same suite twice", "a suite and one of its cases", "the same --case twice"],
)
def test_repeated_suites_and_cases_are_planned_once(args):
    from attnbench.sweep import plan

    suites = [a for a in args if a == "smoke"]
    cases = [a for i, a in enumerate(args) if i and args[i - 1] == "--case"]
    p = plan(suites, "cpu", ["torch"], ["merge_state"], case_ids=cases)
    ids = [c.id for c in p.cases]
    assert len(ids) == len(set(ids)) and set(cases) <= set(ids)
    if suites:  # the suite's order, the first occurrence kept
        from attnbench.suite import load

        assert ids == [c.id for c in load("smoke", "cpu").cases if c.op_name == "merge_state"]
    res = invoke("sweep", *args, "-b", "torch", "--device", "cpu", "--dry-run")
    assert res.exit_code == 0 and res.output.startswith(f"{len(ids)} cases x 1 backends"), res.output
