"""The capability matrix (`attnbench list backends`, from each backend's declared limits) says "runs"
exactly when a sweep's row does not skip: no backend finds out in `prepare` what its declaration
could have said.

On this machine every built-in backend prepares every smoke case it accepts (torch, Triton in its
interpreter; the others are unavailable and say so): a late `Unsupported` there would be a skip row
where the matrix says "runs". FlashInfer's adapters also run through
FlashInfer's real Python layer with fake kernels (tests/support/fake_flashinfer.py) where the package
is installed: there every smoke case its declaration accepts (judged on CUDA, where it runs) must
prepare without a late `Unsupported`.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from attnbench.backend import all_backends, load_builtin
from attnbench.case import Case
from attnbench.errors import Unsupported
from attnbench.plan.capability import matrix, matrix_from_rows
from attnbench.plan.suite import load

# beyond smoke: mixed prefixes where some request has none (the cascade's paged half cannot run it)
EXTRA = ["extend/b8-q7-pre3-mixed-h4x2-d64-p16-kvattend-bf16", "extend/b8-q7-pre3-mixed-h4x2-d64-p16-bf16"]
FLASHINFER = ("flashinfer", "flashinfer-fa3", "flashinfer-cudacore", "flashinfer-ragged", "flashinfer-ragged-fa3")


def _row_status(backend, case) -> str | None:
    """The skip reason a sweep's row would carry: `supports()`, else a late `Unsupported` from prepare."""
    if reason := backend.supports(case):
        return reason
    try:
        backend.prepare(case, case.make_inputs())
    except Unsupported as e:
        return f"late: {e}"
    return None


def test_the_matrix_says_runs_exactly_when_the_smoke_row_does_not_skip():
    load_builtin()
    cases = load("smoke").cases
    backends = list(all_backends().values())
    live = matrix(cases, backends)
    rows = [
        SimpleNamespace(op=c.op_name, features=c.features, backend=b.name, status="skip" if r else "ran", reason=r)
        for c in cases
        for b in backends
        for r in [_row_status(b, c)]
    ]
    late = [(r.backend, r.reason) for r in rows if r.reason and r.reason.startswith("late: ")]
    assert not late, late
    names, from_rows = matrix_from_rows(rows)
    assert names == [b.name for b in backends]
    assert {k: [c.text() for c in v] for k, v in from_rows.items()} == {
        k: [c.text() for c in v] for k, v in live.items()
    }
    assert any(r.status == "ran" and r.backend == "triton" for r in rows)  # the interpreter ran


@pytest.fixture
def fake(monkeypatch, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("fake-kernel plumbing runs on CPU machines; GPU machines run the real kernels")
    pytest.importorskip("flashinfer")
    import fake_flashinfer
    from attnbench.kernels.flashinfer import sinks

    monkeypatch.setattr(sinks, "_MODULE_HEAD_DIMS", {})  # the process-wide sink-module claim, per test
    rec = fake_flashinfer.fake_kernels(monkeypatch, tmp_path)
    yield rec
    fake_flashinfer.CURRENT[0] = None


@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_prepares_every_smoke_case_its_declaration_accepts(fake, name):
    load_builtin()
    b = all_backends()[name]
    ran = 0
    for case in [*load("smoke").cases, *map(Case.from_id, EXTRA)]:
        if case.op_name not in b.ops or b.limits(dataclasses.replace(case, device="cuda")):
            continue
        try:
            b.prepare(case, case.make_inputs())
        except Unsupported as e:
            pytest.fail(f"{name} declares it runs {case.id} but prepare skips it: {e}")
        ran += 1
    assert ran, f"{name} accepts no smoke case"
