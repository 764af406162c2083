"""causal_conv1d verify mode and gdn_commit in the torch and Triton backends (Triton under TRITON_INTERPRET=1
on a CPU): hand-worked numbers through each backend, and the checks catching the typical bugs (a commit
of the wrong step, a conv verify that follows the packed order instead of the tree). Smoke cases of
both ops run through the harness in test_gdn_backends.py; the end-to-end flow is test_gdn_spec_e2e.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.backend import Backend, get_backend
from attnbench.buffers import clone_tensors
from attnbench.case import Case
from attnbench.check.prepared import call_untimed
from helpers import run_one

BACKENDS = ["torch", "triton"]


def _backend(name: str) -> Backend:
    b = get_backend(name)
    if why := b.available():
        pytest.skip(why)
    return b


def silu(x: float) -> float:
    return x / (1 + math.exp(-x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_verify_by_hand(backend):
    # width 3, one channel (the reference test's numbers): request 0 from slot 1 [7, 8], a tree whose
    # token 1 is a sibling of token 0 and token 2 a child of token 0; request 1 is padding
    case = Case.from_id("causal_conv1d/b2-t3-c1-w3-pad1-tree-verify-fp32")
    x = case.make_inputs()
    x.x.copy_(torch.tensor([[1.0], [10.0], [100.0], [6.0], [6.0], [6.0]]))
    x.weight.copy_(torch.tensor([[1.0, 2.0, 3.0]]))
    x.bias.fill_(0.5)
    x.conv_states.copy_(torch.arange(x.conv_states.numel(), dtype=torch.float32).view_as(x.conv_states) + 100)
    x.conv_states[1] = torch.tensor([[7.0, 8.0]])
    x.cache_indices.copy_(torch.tensor([1, -1], dtype=torch.int32))
    x.parents.copy_(torch.tensor([[-1, -1, 0], [-1, 0, 1]], dtype=torch.int32))
    before = clone_tensors(x)
    out = call_untimed(_backend(backend).prepare(case, x))
    want = [silu(0.5 + 7 + 16 + 3), silu(0.5 + 7 + 16 + 30), silu(0.5 + 8 + 2 + 300)]
    assert out["y"][:3, 0].tolist() == pytest.approx(want, rel=1e-6)
    assert out["intermediate_conv_windows"][0, :, 0].tolist() == [[8.0, 1.0], [8.0, 10.0], [1.0, 100.0]]
    assert torch.equal(x.conv_states, before.conv_states), "verify wrote the pool"


@pytest.mark.parametrize("backend", BACKENDS)
def test_commit_by_hand(backend):
    case = Case.from_id("gdn_commit/b4-t2-h1-d1x1-c1-w2-fp32")
    x = case.make_inputs()
    x.inter_states.copy_(torch.tensor([[10.0, 11.0], [20.0, 21.0], [30.0, 31.0], [40.0, 41.0]]).view(4, 2, 1, 1, 1))
    x.inter_conv_windows.copy_(-x.inter_states.view(4, 2, 1, 1))
    x.state_pool.copy_(torch.arange(6.0).view(6, 1, 1, 1))
    x.conv_states.copy_(torch.arange(6.0).view(6, 1, 1) + 0.5)
    x.last_accepted.copy_(torch.tensor([1, -1, 0, 0], dtype=torch.int32))  # 2 tokens, none, 1, padding
    x.state_indices.copy_(torch.tensor([2, 0, 4, -1], dtype=torch.int32))
    call_untimed(_backend(backend).prepare(case, x))  # its finalize writes a K-last pool back
    assert x.state_pool.flatten().tolist() == [0.0, 1.0, 11.0, 3.0, 30.0, 5.0]
    assert x.conv_states.flatten().tolist() == [0.5, 1.5, -11.0, 3.5, -30.0, 5.5]


# ---- the checks catch the typical bugs -----------------------------------------------------------------
class _CommitsEverything(Backend):
    """gdn_commit that commits the last draft step whatever was accepted."""

    name = "commits-everything-test"

    def prepare_gdn_commit(self, case, x):
        inner = get_backend("torch").prepare(case, x)

        def run():
            x.last_accepted.fill_(x.inter_states.shape[1] - 1)
            return inner()

        return run


class _ConvVerifyPackedOrder(Backend):
    """conv verify that continues each token from the previous packed token (a chain), ignoring parents."""

    name = "conv-verify-packed-order-test"

    def prepare_causal_conv1d(self, case, x):
        import dataclasses

        from attnbench.kernels.torch import gdn as tgdn

        y = dataclasses.replace(x, parents=None)
        return lambda: tgdn.causal_conv1d(y)


def test_a_commit_of_rejected_tokens_fails_the_check():
    r = run_one("gdn_commit/b5-t3-h2-d16x16-c40-bf16", _CommitsEverything())
    assert r.status == "fail" and "state_pool" in r.reason and "conv_states" in r.reason, r.reason


def test_a_conv_verify_that_ignores_the_tree_fails_the_check():
    r = run_one("causal_conv1d/b3-t4-c40-tree-verify-bf16", _ConvVerifyPackedOrder())
    assert r.status == "fail" and "intermediate_conv_windows" in r.reason, r.reason
    assert run_one("causal_conv1d/b3-t4-c40-verify-bf16", _ConvVerifyPackedOrder()).status == "pass"
