"""causal_conv1d update on a CUDA-graph-padded decode batch (issue #36): rows whose cache index is -1 read and
write no slot of the conv-state pool, and their output rows are unspecified, as verify mode's padding rows are.

The torch and Triton backends (Triton under TRITON_INTERPRET=1 on a CPU) run it through the harness; the
checks catch a kernel that stores the padded rows' windows (index -1 wraps to the pool's last slot: the
`conv-padded-slot-written` mutant), and leave the padded rows of y alone.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from attnbench.backend import Backend, get_backend
from attnbench.buffers import clone_tensors
from attnbench.case import Case
from attnbench.kernels.mutants import MUTANTS
from attnbench.ops.gdn import ConvParams
from helpers import KERNEL, run_one

PADDED_UPDATE = "causal_conv1d/b5-t1-c40-pad2-update-bf16"


def _backend(name: str) -> Backend:
    b = get_backend(name)
    why = b.available()
    if why:
        pytest.skip(why)
    return b


def test_pad_is_a_parameter_of_update_and_verify_not_prefill():
    case = Case.from_id(PADDED_UPDATE)
    assert case.params.mode == "update" and case.params.pad == 2 and "padding" in case.op.features(case.params)
    assert ConvParams(mode="verify", batch=3, seq_len=2, pad=1).pad == 1
    with pytest.raises(ValidationError, match="pad is a parameter of modes update and verify"):
        ConvParams(mode="prefill", batch=3, seq_len=4, pad=1)
    with pytest.raises(ValidationError, match="at least one real request"):
        ConvParams(mode="update", batch=2, pad=2)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padded_update_passes_the_checks(backend):
    r = run_one(PADDED_UPDATE, _backend(backend), **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert r.metrics["y"]["unspecified"] == 2 * 40  # the two padding rows of y, not compared


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padded_update_writes_the_real_slots_only(backend):
    case = Case.from_id(PADDED_UPDATE)
    x = case.make_inputs()
    before = clone_tensors(x)
    _backend(backend).prepare(case, x)()
    slots = x.cache_indices.tolist()
    assert slots.count(-1) == 2
    for slot in range(x.conv_states.shape[0]):
        if slot in slots:
            assert not torch.equal(x.conv_states[slot], before.conv_states[slot]), f"slot {slot} not written"
        else:  # spare slots and the last slot, where index -1 would wrap
            assert torch.equal(x.conv_states[slot], before.conv_states[slot]), f"slot {slot} changed"


def test_a_conv_update_that_writes_padded_rows_into_slot_minus_1_fails_the_check():
    mutant = next(m for m in MUTANTS if m.name == "conv-padded-slot-written")
    r = run_one(PADDED_UPDATE, mutant.backend())
    assert r.status == "fail" and "conv_states" in r.reason, f"{r.status}: {r.reason}"
    # the same mutant on the unpadded case: nothing to write wrong
    assert run_one("causal_conv1d/b5-t1-c40-update-bf16", mutant.backend()).status == "pass"


class _GarbagePaddingRows(Backend):
    """The torch conv update, with NaN in the output rows of padding requests."""

    name = "conv-garbage-padding-test"

    def prepare_causal_conv1d(self, case, x):
        inner = get_backend("torch").prepare(case, x)

        def run():
            out = inner()
            x.y[x.cache_indices < 0] = float("nan")
            return out

        return run


def test_padding_rows_of_y_are_not_compared():
    r = run_one(PADDED_UPDATE, _GarbagePaddingRows())
    assert r.status == "pass", r.reason


def test_padding_rows_count_no_flops_and_no_state_traffic():
    padded, full = Case.from_id(PADDED_UPDATE), Case.from_id("causal_conv1d/b5-t1-c40-update-bf16")
    xp, xf = padded.make_inputs(), full.make_inputs()
    W, D, state = 4, 40, 40 * 3 * 2  # a bf16 window of W-1 inputs per channel
    assert padded.op.flops(padded.params, xp) == 2 * W * D * 3
    # x, y, weights and indices alike; two fewer windows read and two fewer written
    assert full.op.bytes(full.params, xf) - padded.op.bytes(padded.params, xp) == 2 * 2 * state
