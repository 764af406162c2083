"""A mixed batch of tree-verify requests beside causal (prefill) requests: extend with per-request `trees`
(issue #36: vLLM's reorder_batch_threshold batches, docs/spec.md "Mixed batches").

The custom mask is checked against masks written here from the tree rule (a node sees the whole prefix, the
root, its ancestors and itself; a null request is causal); torch, triton (interpreter) and SGLang's extend and
unified extend (interpreter) pass the case through the harness; backends that mis-place the trees fail it: one that treats
the tree requests as causal, one that lays the batch's tree over the prefill requests' first tokens too
(one tree per batch, vLLM qq_bias style), one that picks requests' masks by q_len. The trace line of
suites/traces/spec.jsonl reads into such a case; bad `trees` are one-line errors naming file:line.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.errors import SuiteError
from attnbench.kernels.mutants import _attention_mutant
from attnbench.kernels.torch.attention import paged_attention
from attnbench.ops.attention.params import ExtendParams
from attnbench.plan import trace
from helpers import KERNEL, run_one

# Request 3 is causal with the q_len of the 4-token trees beside it (a kernel must not tell them apart by
# length); request 1 is causal between tree requests (not only at the end, as vLLM orders them).
Q_LENS = (4, 9, 3, 4, 4, 6)
PREFIX = (7, 0, 21, 13, 2, 5)
TREES = ("[(0,), (1,), (0, 0)]", None, "0_1", None, "0_1_2", None)
PARENTS = ([-1, 0, 0, 1], None, [-1, 0, 0], None, [-1, 0, 0, 0], None)  # by hand from the choices


def mixed_case(dtype: str = "fp16", device: str = "cpu", **changes) -> Case:
    params = dict(q_lens=Q_LENS, prefix_lens=PREFIX, mask="custom", trees=TREES, heads_q=4, heads_kv=2)
    params |= dict(head_dim=16, page_size=4) | changes
    return Case("extend", ExtendParams(**params), dtype, device=device)


def expected_block(parents: list[int] | None, prefix: int, n: int) -> torch.Tensor:
    """The visibility of one request's new tokens `[n, prefix + n]`, from the rule."""
    block = torch.zeros(n, prefix + n, dtype=torch.bool)
    for i in range(n):
        block[i, :prefix] = True
        if parents is None:
            block[i, prefix : prefix + i + 1] = True
            continue
        node = i
        while node != -1:
            block[i, prefix + node] = True
            node = parents[node]
    return block


def request_blocks(x) -> list[torch.Tensor]:
    at = x.mask_indptr.tolist()
    return [x.custom_mask[at[b] : at[b + 1]].view(n, L) for b, (L, n) in enumerate(zip(x.seq_lens_host, x.q_lens_host))]


def test_trees_are_canonical_and_the_id_says_trees():
    case = mixed_case()
    assert case.params.trees == ("0_1_0.0", None, "0_1", None, "0_1_2", None)
    assert "-trees-" in case.id and "-custom-" not in case.id
    assert {"tree", "tree+causal", "custom"} <= set(case.op.features(case.params))
    other = mixed_case(trees=("0_1_2", None, "0_1", None, "0_1_0.0", None))  # trees swapped: another case
    assert other.id != case.id


def test_custom_mask_is_each_requests_tree_or_causal():
    x = mixed_case().make_inputs()
    blocks = request_blocks(x)
    assert len(blocks) == len(Q_LENS)
    for b, (parents, prefix, n) in enumerate(zip(PARENTS, PREFIX, Q_LENS)):
        assert torch.equal(blocks[b].cpu(), expected_block(parents, prefix, n)), f"request {b}"


# ---- backends that get the batch wrong --------------------------------------------------------------
def _with_blocks(x, blocks: list[torch.Tensor]):
    return dataclasses.replace(x, custom_mask=torch.cat([blk.flatten() for blk in blocks]))


def _trees_as_causal(x):
    """Every request causal: the tree masks ignored."""
    return paged_attention(dataclasses.replace(x, custom_mask=None, mask_indptr=None, causal=True))


def _first_tree_on_every_request(x):
    """The batch's first tree laid over every request's first new tokens (one tree for the batch, as a
    single qq_bias would be applied to the prefill requests too)."""
    blocks = [blk.clone() for blk in request_blocks(x)]
    tree = blocks[0][:, x.seq_lens_host[0] - x.q_lens_host[0] :]
    k = tree.shape[0]
    for blk, L, n in zip(blocks, x.seq_lens_host, x.q_lens_host):
        m = min(k, n)
        blk[:m, L - n : L - n + m] = tree[:m, :m]
    return paged_attention(_with_blocks(x, blocks))


def _tree_by_q_len(x):
    """Requests of the tree requests' q_len all get the first tree (the mask chosen by length)."""
    blocks = [blk.clone() for blk in request_blocks(x)]
    tree, n0 = blocks[0], x.q_lens_host[0]
    for b, (L, n) in enumerate(zip(x.seq_lens_host, x.q_lens_host)):
        if n == n0:
            blocks[b][:, L - n :] = tree[:, -n0:]
    return paged_attention(_with_blocks(x, blocks))


MUTANTS = {
    "trees-as-causal": _trees_as_causal,
    "first-tree-on-every-request": _first_tree_on_every_request,
    "tree-by-q-len": _tree_by_q_len,
}


@pytest.mark.parametrize("name", MUTANTS)
def test_a_misplaced_tree_fails(name):
    r = run_one(mixed_case(), _attention_mutant(name, MUTANTS[name])())
    assert r.status == "fail", f"{name}: {r.status} {r.reason}"
    assert "o" in r.reason


def test_torch_passes():
    r = run_one(mixed_case(), get_backend("torch"))
    assert r.status == "pass", r.reason


interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="CPU cases run Triton in its interpreter (GPU: the spec suite)"
)


@pytest.mark.interpreter
@interpreted
def test_triton_passes():
    r = run_one(mixed_case(), get_backend("triton"), **KERNEL)
    assert r.status == "pass", r.reason


@pytest.mark.interpreter
@interpreted
@pytest.mark.parametrize(
    "name, variant",
    [
        ("sglang", "extend_attention_fwd (custom mask)"),
        ("sglang-unified", "build_unified_kv_indices + extend_attention_fwd_unified (custom mask)"),
    ],
)
def test_sglang_extend_passes(name, variant):
    from sglang_env import sglang_backend_or_skip

    sglang = sglang_backend_or_skip(name)
    r = run_one(mixed_case(), sglang, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert r.prepare_info["variant"] == variant


def test_backends_that_cannot_say_it_skip_with_the_reason():
    """vLLM's unified attention takes one qq_bias for a call; FlashInfer's fa3 and ragged+paged cascade
    take no custom mask over a prefix. The deployed adapters that take per-request masks accept it."""
    case = mixed_case("bf16", "cuda", head_dim=128)
    reasons = {n: get_backend(n).limits(case) for n in ("vllm", "flashinfer-fa3", "flashinfer-ragged")}
    assert "one tree (qq_bias)" in reasons["vllm"] and "prefill" in reasons["vllm"], reasons["vllm"]
    assert "custom mask" in reasons["flashinfer-fa3"] and "custom mask" in reasons["flashinfer-ragged"]
    for name in ("torch", "triton", "flashinfer", "sglang", "sglang-unified"):
        assert get_backend(name).limits(case) is None, name


# ---- the built-in trace and bad input ---------------------------------------------------------------
def test_spec_trace_holds_the_mixed_tree_batch():
    batches = trace.read(trace.resolve("spec"))
    mixed = [b.case for b in batches if getattr(b.case.params, "trees", None) is not None]
    assert len(mixed) == 1
    p = mixed[0].params
    trees = [i for i, t in enumerate(p.trees) if t is not None]
    assert trees and all(p.q_lens[i] < 8 for i in trees)  # short verify requests (reorder_batch_threshold)
    assert all(p.q_lens[i] > 8 for i, t in enumerate(p.trees) if t is None)  # prefills, causal
    assert trees == list(range(len(trees)))  # vLLM's order: the verify requests first
    assert any(t != "_".join(str(c) for c in range(len(t.split("_")))) for t in p.trees if t)  # not a chain
    assert trace.find_case(mixed[0].id) is not None  # the id resolves without --trace


@pytest.mark.parametrize(
    "change, says",
    [
        ({"trees": ["0_1_0.0", None]}, "trees has 2 entries for 3 requests"),
        ({"trees": ["0_1", None, None]}, "trees[0] '0_1' has 3 tokens (root included) but q_lens[0] is 4"),
        ({"trees": [None, None, None]}, "trees holds no tree"),
        ({"mask": "causal"}, "trees needs mask: custom"),
        ({"trees": ["chain", None, None]}, "trees[0] 'chain': a tree is given as vLLM choices"),
        ({"trees": ["0.1_0", None, None]}, "trees[0]: tree choice 0 (0, 1): its parent (0,) is not listed"),
        ({"window": 8}, "trees do not take a window"),
    ],
)
def test_bad_trees_name_the_line(tmp_path, change, says):
    line = {"op": "extend", "q_lens": [4, 2, 9], "prefix_lens": [30, 5, 0], "mask": "custom"}
    line |= {"trees": ["0_1_0.0", None, None], "heads_q": 4, "heads_kv": 2, "head_dim": 16} | change
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"op": "decode", "kv_lens": [3]}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(SuiteError) as e:
        trace.read(path)
    assert "t.jsonl:2: " in str(e.value) and says in str(e.value), str(e.value)
