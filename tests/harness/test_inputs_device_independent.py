"""A case id gives the same input bits on any device (inputs are drawn on the CPU, then moved)."""

from __future__ import annotations

import pytest
import torch

from attnbench.buffers import bitwise_equal, tensor_fields
from attnbench.case import Case
from attnbench.ops import distributions, rng
from attnbench.ops.distributions import DISTRIBUTIONS

CASES = [
    "decode/b3-l37-mixed-h8x2-d128-p16-bf16",
    "decode/b2-l40-h16x1-d576x512-p16-mla-fp8_e4m3-bf16",
    "decode/b3-l60-mixed-h8x2-d64-p16-long_tail-bf16",
    "decode/b3-l60-mixed-h8x2-d64-p16-outliers-bf16",
    "extend/b2-q6-pre10-h4x2-d32-p16-custom-emptyrows-bf16",
    "merge_state/t17-h2-d32-peaked-bf16",
    "tree_verify/b3-pre21-mixed-h8x2-d64-p16-treebinary-depth2-bf16",
    "gdn_gating/t33-h4-bf16",
    "causal_conv1d/b3-t9-mixed-c48-initmixed-bf16",
    "gdn_decode/b5-h2x4-d16x16-pad2-packed-bf16",
    "gdn_extend/b3-t64-mixed-h2x4-d16x16-initmixed-bf16",
    "gdn_verify/b3-t4-h2x4-d16x16-pad1-tree-bf16",
]


def _same(a, b) -> None:
    fa, fb = tensor_fields(a), tensor_fields(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        x, y = fa[name].cpu(), fb[name].cpu()
        assert x.shape == y.shape and x.dtype == y.dtype, name
        assert bool(bitwise_equal(x, y).all()), f"{name} differs"


class _CpuOnlyGenerator:
    """Stands in for torch.Generator: a generator on any other device is a device-dependent draw."""

    def __new__(cls, device=None):
        assert device is None or torch.device(device).type == "cpu", f"a {device} generator draws input data"
        return _REAL_GENERATOR()


_REAL_GENERATOR = torch.Generator


@pytest.mark.parametrize("case_id", CASES)
def test_inputs_use_only_cpu_generators(case_id, monkeypatch):
    """The device path: building for any device draws with CPU generators only, so it cannot differ."""
    case = Case.from_id(case_id, "cpu")
    monkeypatch.setattr(torch, "Generator", _CpuOnlyGenerator)
    case.make_inputs()


@pytest.mark.parametrize("case_id", CASES)
def test_same_bits_on_repeat(case_id):
    case = Case.from_id(case_id, "cpu")
    _same(case.make_inputs(), case.make_inputs())


def test_chunked_draws_do_not_depend_on_threads(monkeypatch):
    """Large draws are filled chunk by chunk on a thread pool: the bits depend on neither."""
    monkeypatch.setattr(rng, "CHUNK", 1000)
    a = rng.randn((7, 1001), torch.Generator().manual_seed(3))
    monkeypatch.setattr(rng.os, "cpu_count", lambda: 1)
    b = rng.randn((7, 1001), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert a.std().item() == pytest.approx(1.0, abs=0.05)
    assert not torch.equal(a.view(-1)[:1000], a.view(-1)[1000:2000])  # chunks are independent streams


@pytest.mark.parametrize("kind", DISTRIBUTIONS)
@pytest.mark.parametrize("role", ["q", "k", "v"])
def test_draw_many_is_the_draws_one_by_one(kind, role, monkeypatch):
    """A paged cache is drawn request by request in one `draw_many` (filled in parallel): the same bits
    as the draws one at a time, whatever the distribution, also when the size cap splits the draws into
    groups and when the channel counts differ (outlier channels and the peaked direction per count)."""
    monkeypatch.setattr(rng, "CHUNK", 64)
    monkeypatch.setattr(distributions, "GROUP_ELEMENTS", 300)
    for shapes in ([(5, 2, 16), (0, 2, 16), (9, 2, 16), (3, 2, 16)], [(4, 8), (3, 16), (2, 8)]):
        one = distributions.Sampler(kind, torch.Generator().manual_seed(5), "cpu", torch.bfloat16)
        many = distributions.Sampler(kind, torch.Generator().manual_seed(5), "cpu", torch.bfloat16)
        expected = [one.draw(role, s) for s in shapes] + [one.draw(role, (2, 16))]
        got = many.draw_many(role, shapes) + [many.draw(role, (2, 16))]  # and the stream goes on alike
        assert all(bool(bitwise_equal(a, b).all()) for a, b in zip(expected, got))


@pytest.mark.gpu
def test_to_device_keeps_views_and_canaries():
    x = Case.from_id("gdn_decode/b5-h2x4-d16x16-pad2-packed-bf16", "cuda").make_inputs()
    x.mixed_qkv[0, 0] = 7.0
    assert x.q[0, 0, 0].item() == 7.0  # q is still a view of mixed_qkv
    assert x.o.storage_offset() > 0  # canary padding kept


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", CASES)
def test_cuda_inputs_equal_cpu_inputs(case_id):
    _same(Case.from_id(case_id, "cpu").make_inputs(), Case.from_id(case_id, "cuda").make_inputs())
