"""SGLang's GDN decode and verify through the replay check (docs/replay.md) on a CPU: the kernels run in
Triton's interpreter and `StandInGraph` drives the capture-then-replay sequence (batch B: other slots,
data and gates, a padding request, written into the closure's inputs in place). The GPU half is the
replay sweep (docs/replay.md, `attnbench sweep ... -b sglang`).
"""

from __future__ import annotations

import pytest

from attnbench.case import Case
from attnbench.check.checklist import CHECKS, ReplayCheck
from attnbench.check.replay import StandInGraph
from attnbench.run.runner import RunOptions, run_case
from sglang_env import sglang_backend_or_skip

pytestmark = pytest.mark.interpreter

STAND_IN = tuple(c for c in CHECKS if c.name != "replay") + (ReplayCheck(StandInGraph),)


@pytest.fixture(scope="module")
def sglang():
    return sglang_backend_or_skip()


@pytest.mark.parametrize("case_id", ["gdn_decode/b4-h2x4-d16x16-pad1-fp32", "gdn_verify/b3-t3-h2x4-d16x16-fp32"])
def test_gdn_rows_replay_on_other_slots(sglang, case_id):
    """Batch B writes other slots than A's: the states the replayed call wrote must reach the canonical
    pool (the closure's finalize reads the slots as they are after the call, not prepare's)."""
    (row,) = run_case(Case.from_id(case_id, "cpu"), [sglang], RunOptions(timing=False, checks=STAND_IN))
    assert (row.status, row.replay) == ("pass", "pass"), row.reason


DECODE_CASES = ["decode/b3-l40-mixed-h4x2-d16-p4-fp16", "decode/b3-l40-mixed-h4x2-d16-p4-swa7-fp16"]


@pytest.mark.parametrize("case_id", DECODE_CASES)
def test_decode_replays_on_other_lengths_through_its_before_replay_step(sglang, case_id):
    """The token table and split counts are static buffers `before_replay` refills from batch B's device
    lengths and page table, as SGLang's server does before each replay."""
    (row,) = run_case(Case.from_id(case_id, "cpu"), [sglang], RunOptions(timing=False, checks=STAND_IN))
    assert (row.status, row.replay) == ("pass", "pass"), row.reason


def test_decode_without_the_step_replays_batch_a_tables_and_fails(sglang, monkeypatch):
    """The control: the same closure with its `before_replay` dropped keeps batch A's key ranges."""
    from attnbench.kernels.sglang import attention

    real = attention.prepare_decode

    def without_step(case, x):
        run = real(case, x)
        del run.before_replay
        return run

    monkeypatch.setattr(attention, "prepare_decode", without_step)
    (row,) = run_case(Case.from_id(DECODE_CASES[0], "cpu"), [sglang], RunOptions(timing=False, checks=STAND_IN))
    assert (row.status, row.replay) == ("fail", "fail"), row.reason
    assert row.reason.startswith("replay: captured on one batch") and "replay:o" in row.failed
