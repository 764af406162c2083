"""The pure-PyTorch GDN closures that write pool slots of a padded batch (gdn_decode, causal_conv1d
update, gdn_commit) do it without a host sync, so they can be captured in a CUDA graph: timing captures
every backend of a case or none (docs/measurement.md), and a torch closure that counted its real rows on
the host sent whole `ci` cases to per-call timing on an H100 (h100-session22 `ci2`). On a CPU the proxy is
PyTorch's fake tensors, which refuse exactly the data-dependent operations a capture cannot take."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from attnbench.backend import get_backend
from attnbench.buffers import map_fields
from attnbench.case import Case
from attnbench.kernels.torch.gdn import _write_slots

PADDED = [
    "causal_conv1d/b5-t1-c40-pad2-update-bf16",
    "gdn_decode/b6-h2x4-d16x16-pad2-bf16",
    "gdn_commit/b3-t3-h2-d16x16-c48-w2-pad1-acceptnone-fp16",
    "gdn_commit/b3-t8-h3-d16x16-c40-pad1-acceptall-bf16",
]


@pytest.mark.parametrize("case_id", PADDED)
def test_padded_pool_writes_take_no_data_dependent_step(case_id):
    case = Case.from_id(case_id)
    x = case.make_inputs()
    assert (
        "padding" in case.op.features(case.params)
        and (x.__dict__.get("cache_indices", x.__dict__.get("state_indices")) < 0).any()
    )
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = map_fields(x, mode.from_tensor)
        get_backend("torch").prepare(case, fake)()  # raises on .item(), nonzero, boolean-mask indexing


def test_a_real_row_owning_slot_0_keeps_its_value_beside_padding_rows():
    pool = torch.zeros(5, 3)
    values = torch.arange(1.0, 13.0).view(4, 3)
    _write_slots(pool, torch.tensor([-1, 0, -1, 3]), values)
    assert torch.equal(pool[0], values[1]) and torch.equal(pool[3], values[3])
    assert not pool[[1, 2, 4]].any()
    pool = torch.full((5, 3), 7.0)
    _write_slots(pool, torch.tensor([-1, 2, 4]), values[:3], keep=torch.tensor([True, True, False]))
    assert torch.equal(pool[2], values[1])  # the one real, kept row
    assert (pool[[0, 1, 3, 4]] == 7.0).all()  # slot 0 rewritten with its own value; row 2 not kept
