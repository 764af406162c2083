"""SGLang's GDN decode and verify through the replay check (docs/replay.md) on a CPU: the kernels run in
Triton's interpreter and `StandInGraph` drives the capture-then-replay sequence (batch B: other slots,
data and gates, a padding request, written into the closure's inputs in place). The GPU half is the
replay sweep (docs/replay.md, `attnbench sweep ... -b sglang`).
"""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.check.checklist import CHECKS, ReplayCheck
from attnbench.check.replay import StandInGraph
from attnbench.run.runner import RunOptions, run_case
from sglang_env import sglang_kernels_or_skip

pytestmark = pytest.mark.interpreter

STAND_IN = tuple(c for c in CHECKS if c.name != "replay") + (ReplayCheck(StandInGraph),)


@pytest.fixture(scope="module")
def sglang():
    sglang_kernels_or_skip()
    b = get_backend("sglang")
    if why := b.available():
        pytest.skip(why)
    return b


@pytest.mark.parametrize("case_id", ["gdn_decode/b4-h2x4-d16x16-pad1-fp32", "gdn_verify/b3-t3-h2x4-d16x16-fp32"])
def test_gdn_rows_replay_on_other_slots(sglang, case_id):
    """Batch B writes other slots than A's: the states the replayed call wrote must reach the canonical
    pool (the closure's finalize reads the slots as they are after the call, not prepare's)."""
    (row,) = run_case(Case.from_id(case_id, "cpu"), [sglang], RunOptions(timing=False, checks=STAND_IN))
    assert (row.status, row.replay) == ("pass", "pass"), row.reason


def test_decode_declares_why_not(sglang):
    (row,) = run_case(Case.from_id("decode/b3-l40-mixed-h4x2-d16-p4-fp16", "cpu"), [sglang], RunOptions(timing=False))
    assert row.status == "pass", row.reason
    assert row.replay.startswith("skip: not graph-safe: the token-level kv_indptr/kv_indices")
