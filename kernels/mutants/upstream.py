"""Broken backends modelled on real bugs from upstream bug trackers, one mutant per bug, each citing it.

Every entry names the upstream issue or pull request whose bug it reproduces (described here in our own
words) and what the bug did there. The mutant reproduces the bug's class on attnbench's op contract:
the same wrong rule, not the upstream code. None has a case written for it; `attnbench selftest` runs
them over the default suites and reports the first case that caught each.

The attention ones switch a `Bugs` flag of the plain float32 implementation in `interactions.py`; the
GDN and spec ones wrap the torch backend's functions.
"""

from __future__ import annotations

import dataclasses

import torch

from attnbench.backend import Backend
from attnbench.kernels.mutants.interactions import (
    Bugs,
    attention_mutant,
    patched_gdn,
    right_gates,
    state_offset_mutant,
)
from attnbench.kernels.torch import spec as tspec


@dataclasses.dataclass(frozen=True)
class Upstream:
    name: str
    bug: str  # the bug as a reviewer would describe it (in attnbench's terms)
    source: str  # the upstream issue / pull request it is modelled on
    backend: object  # () -> Backend
    known_escape: str = ""  # why the default suites miss it, when they do (shown by `attnbench selftest`)
    cuda_only: str = ""  # why only a GPU self-test can catch it (on a CPU it is not run: a known escape there)


# ---- GDN ------------------------------------------------------------------------------------------
def _beta_rounded(A_log, a, dt_bias, b):
    """The right gates, but sigmoid(b) rounded to b's dtype (bf16/fp16) before it is stored as fp32."""
    g, beta = right_gates(A_log, a, dt_bias, b)
    return g, beta.to(b.dtype).float()


def _beta_sigmoid_twice(A_log, a, dt_bias, b):
    """The right gates, but beta = sigmoid(sigmoid(b)): a second sigmoid on an already gated beta."""
    g, beta = right_gates(A_log, a, dt_bias, b)
    return g, torch.sigmoid(beta)


def _no_l2norm(q, k, HV, scale):
    """`_norm_qk` without the L2 normalisation: q and k are only scaled and expanded to the value heads."""
    group = HV // q.shape[-2]
    return (q.float() * scale).repeat_interleave(group, dim=-2), k.float().repeat_interleave(group, dim=-2)


# ---- spec -----------------------------------------------------------------------------------------
class _RetriveIndexStride(Backend):
    """eagle_build_tree whose `retrive_index` rows use the stride `depth + 1` (the accepted-path width)
    instead of `draft_tokens` (the tree width): request b's nodes point into request b-1's tokens."""

    name = "retrive-index-wrong-stride"

    def prepare_eagle_build_tree(self, case, x):
        def run():
            out = tspec.build_eagle_tree(x)
            B, n = x.retrive_index.shape
            rows = torch.arange(B, device=x.retrive_index.device)[:, None] * (x.depth + 1)
            x.retrive_index.copy_(rows + torch.arange(n, device=rows.device))
            return out

        return run


_PAST_2_31 = (
    "its offsets wrap only in a pool past 2^31 elements (4 GiB of bf16 a KV cache, 8 GiB of fp32 GDN states): "
    "the GPU self-test runs suites/large.yaml for it, no CPU holds such a pool"
)


def _a(name: str, **bugs) -> Backend:
    return attention_mutant(name, Bugs(**bugs))


UPSTREAM_MUTANTS: tuple[Upstream, ...] = (
    Upstream(
        "sink-dropped-on-extend",
        "sinks applied on the decode path only: requests with several queries ignore them",
        "vllm-project/vllm PR #52148: on SM12x the generic FlashInfer FA2 prefill path took a sinks argument "
        "but never applied it, so GPT-OSS decode (XQA) was right and prefill wrong",
        lambda: _a("sink-dropped-on-extend", sink_dropped_on_extend=True),
    ),
    Upstream(
        "fp8-prefix-unscaled",
        "extend over an fp8 cache: the cached prefix is read without k_scale/v_scale, the new tokens are right",
        "sgl-project/sglang PR #18904: the FlashInfer backend's ragged+paged extend (prefix-cache hit) passed no "
        "fp8 scales to the paged prefix call; see also flashinfer-ai/flashinfer issue #4979 (ragged prefill "
        "ignored k_scale/v_scale)",
        lambda: _a("fp8-prefix-unscaled", prefix_fp8_unscaled=True),
    ),
    Upstream(
        "window-tile-granular",
        "extend: the window start only skips whole 16-key tiles; keys of the partial tile before it stay visible",
        "sgl-project/sglang PR #31501: the SWA paged prefill wrapper was planned without window_left, so the "
        "per-element window mask was compiled out and only the per-tile KV-start skip applied",
        lambda: _a("window-tile-granular", window_tile_granular=True),
    ),
    Upstream(
        "empty-row-lse-plus-inf",
        "rows with no visible key report LSE +inf instead of -inf (a merge then takes their zero output)",
        "Dao-AILab/flash-attention PR #978: the forward returned +inf LSE for queries with no keys (e.g. kv "
        "length 0), which breaks LSE-based merging; vllm-project/vllm PR #28181 had to special-case such "
        "states in merge_attn_states",
        lambda: _a("empty-row-lse-plus-inf", empty_lse_plus_inf=True),
    ),
    Upstream(
        "query-rows-uniform-offset",
        "multi-query attention reads and writes request b's rows at b x (request 0's query count), not at its packed offset",
        "flashinfer-ai/flashinfer PR #4382: trtllm-gen multi-token decode indexed Q/O by request index times "
        "q_len instead of the packed request offset, so with batch > 1 the requests after the first were corrupt",
        lambda: _a("query-rows-uniform-offset", uniform_q_offset=True),
    ),
    Upstream(
        "kv-offset-int32",
        "paged decode/extend computes a cache slot's element offset (slot x heads x dim) in int32: past 2^31 "
        "elements it wraps and reads (and saves to) another place in the pool",
        "sgl-project/sglang issue #20389; vllm-project/vllm #47671 and #50427 (as attnbench issue #36 cites them: "
        "kernels computing page * stride in int32, wrong once a production pool passes 2^31 elements; the "
        "threads themselves not re-read for this mutant)",
        lambda: _a("kv-offset-int32", offset_bits=32),
        cuda_only=_PAST_2_31,
    ),
    Upstream(
        "gdn-state-offset-int32",
        "GDN decode/extend/verify compute a state slot's element offset (slot x HV x K x V) in int32: past 2^31 "
        "elements of the state pool a request reads (and saves) another slot's state",
        "fla-org/flash-linear-attention issue #1080 (as attnbench issue #36 cites it: a state pool indexed with "
        "int32 offsets, wrong once a production pool passes 2^31 elements; the thread itself not re-read for "
        "this mutant)",
        lambda: state_offset_mutant("gdn-state-offset-int32", 32),
        cuda_only=_PAST_2_31,
    ),
    Upstream(
        "gdn-beta-rounded-to-input-dtype",
        "beta = sigmoid(b) computed in fp32, rounded to b's dtype (bf16/fp16), stored back as fp32",
        "vllm-project/vllm PR #53877 (packed GDN decode) and sgl-project/sglang PR #40362 (fused_gdn_gating on "
        "the extend path) both rounded the fp32 sigmoid to the input dtype before use",
        lambda: patched_gdn(
            "gdn-beta-rounded-to-input-dtype", "_gates", _beta_rounded, ("gdn_gating", "gdn_decode", "gdn_verify")
        ),
    ),
    Upstream(
        "gdn-decode-beta-sigmoid-twice",
        "GDN decode applies sigmoid to an already gated beta",
        "sgl-project/sglang PR #17508: after a conflict resolution (PR #17108) the KDA decode path applied an "
        "extra sigmoid to beta",
        lambda: patched_gdn("gdn-decode-beta-sigmoid-twice", "_gates", _beta_sigmoid_twice, ("gdn_decode",)),
    ),
    Upstream(
        "gdn-extend-no-qk-l2norm",
        "gdn_extend skips the q/k L2 normalisation (decode and verify keep it)",
        "flashinfer-ai/flashinfer PR #5255: chunk_gated_delta_rule ignored use_qk_l2norm_in_kernel=True on its "
        "native prefill paths, so unnormalised q/k went into the delta rule",
        lambda: patched_gdn("gdn-extend-no-qk-l2norm", "_norm_qk", _no_l2norm, ("gdn_extend",)),
    ),
    Upstream(
        "retrive-index-wrong-stride",
        "eagle_build_tree: retrive_index rows use stride depth + 1 instead of draft_tokens",
        "sgl-project/sglang PR #15360: fill_new_verified_id used the draft-token count as row stride where "
        "the accept_index width (num_steps + 1) was meant; this mutant confuses the same two widths the other "
        "way round",
        lambda: _RetriveIndexStride(),
    ),
)
