"""`attnbench profile`: what a timed closure runs, with the torch ops that attnbench's own code calls
told apart from those a library calls (the proof that an adapter's timed window holds the kernel alone)."""

from __future__ import annotations

from typer.testing import CliRunner

from attnbench.backend import Backend
from attnbench.case import Case
from attnbench.cli.app import app
from attnbench.run.profile import profile_case, render

CASE = "gdn_decode/b2-h2x4-d16x16-fp32"


def _library_decode(x):
    """Stands in for a library's kernel: torch ops called from code outside attnbench (this test file)."""
    return {"o": x.o.copy_(x.v.to(x.o.dtype)), "state_pool": x.state_pool}


class _KernelOnly(Backend):
    name = "kernel-only"

    def prepare_gdn_decode(self, case, x):
        return lambda: _library_decode(x)


class _GatherInWindow(Backend):
    """An adapter that gathers the pool inside its timed closure (attnbench code)."""

    name = "gather-in-window"

    def prepare_gdn_decode(self, case, x):
        def run():
            from attnbench.kernels.native_states import state_v_major

            state_v_major(x.state_pool)  # a transposed copy made in the timed window
            return _library_decode(x)

        return run


class _Refuses(Backend):
    name = "refuses"


def test_profile_separates_adapter_ops_from_library_ops():
    case = Case.from_id(CASE, "cpu")
    traces = profile_case(case, [_KernelOnly(), _GatherInWindow(), _Refuses()], calls=2)
    clean, dirty = traces["kernel-only"], traces["gather-in-window"]
    assert clean.host_ops == {}
    assert clean.library_ops.get("aten::copy_") == 1.0  # one per call, counted per call
    assert sum(dirty.host_ops.values()) >= 1  # the gather is attnbench's, inside the window
    assert dirty.library_ops.get("aten::copy_") == 1.0
    assert traces["refuses"].startswith("skip:")
    text = render(case.id, traces)
    assert "kernel-only: 0 kernel launch(es) per call, no torch op called from attnbench's code" in text
    assert "gather-in-window: 0 kernel launch(es) per call, " in text and "called from attnbench's code" in text


def test_profile_cli_torch_backend_and_bad_id(tmp_path):
    runner = CliRunner()
    out = tmp_path / "p.md"
    res = runner.invoke(app, ["profile", CASE, "-b", "torch", "--device", "cpu", "--calls", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "### torch:" in out.read_text() and "aten::" in out.read_text()
    bad = runner.invoke(app, ["profile", "gdn_decode/b2-nonsense-fp32", "--device", "cpu"])
    assert bad.exit_code == 2
