"""Workers sharing one device: a row that ran out of memory beside other workers runs again alone."""

from __future__ import annotations

import textwrap

import pytest

from attnbench.run.pool import Pool
from attnbench.run.runner import RunOptions
from attnbench.run.sweep import Selection, plan

PLUGIN = textwrap.dedent(
    '''
    import os, pathlib
    import torch
    import attnbench
    from attnbench.backend import get_backend

    @attnbench.register_backend("oom-once")
    class OomOnce(attnbench.Backend):
        """torch's kernels, but the first call of each case runs out of memory (as beside other workers)."""

        @property
        def ops(self):
            return get_backend("torch").ops

        def supports(self, case):
            return get_backend("torch").supports(case)

        def prepare(self, case, inputs):
            mark = pathlib.Path(os.environ["OOM_ONCE_DIR"]) / case.id.replace("/", "_")
            if not mark.exists():
                mark.touch()
                if os.environ.get("OOM_KIND") == "triton":  # how a Triton launch reports it
                    raise RuntimeError("Triton Error [CUDA]: out of memory")
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
            return get_backend("torch").prepare(case, inputs)
    '''
)


def _run(devices, tmp_path, monkeypatch):
    plugin = tmp_path / "oom_once.py"
    plugin.write_text(PLUGIN)
    marks = tmp_path / f"marks-{len(devices)}"
    marks.mkdir()
    monkeypatch.setenv("OOM_ONCE_DIR", str(marks))
    cases = plan(Selection(("smoke",), "cpu", ("torch",), ("merge_state",))).cases[:3]
    rows, problems = [], []
    pool = Pool(devices, RunOptions(timing=False), lambda c, r: rows.extend(r), plugins=[str(plugin)],
                log_dir=tmp_path / "logs", on_problem=problems.append)  # fmt: skip
    pool.run([(c, ["oom-once", "torch"]) for c in cases])
    return cases, rows, problems


@pytest.mark.parametrize("kind", ["torch", "triton"])
def test_out_of_memory_beside_other_workers_is_run_again_alone(kind, tmp_path, monkeypatch):
    """torch's OutOfMemoryError and Triton's `RuntimeError: Triton Error [CUDA]: out of memory` alike
    (an SGLang extend row on an H100 shared by four workers raised the latter)."""
    monkeypatch.setenv("OOM_KIND", kind)
    cases, rows, problems = _run(["cpu", "cpu"], tmp_path, monkeypatch)
    mine = {r.case_id: r for r in rows if r.backend == "oom-once"}
    assert len(rows) == 2 * len(cases) and set(mine) == {c.id for c in cases}  # one row each, none lost
    assert all(r.status == "pass" for r in rows), [(r.case_id, r.backend, r.reason) for r in rows]
    assert any("ran out of memory on a shared GPU" in p for p in problems), problems


def test_out_of_memory_on_a_device_of_its_own_is_the_row(tmp_path, monkeypatch):
    cases, rows, _ = _run(["cpu"], tmp_path, monkeypatch)
    mine = [r for r in rows if r.backend == "oom-once"]
    assert len(mine) == len(cases) and all(r.status == "error" and "out of memory: " in r.reason for r in mine)
