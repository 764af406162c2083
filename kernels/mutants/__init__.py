"""Deliberately broken backends, one per failure mode real attention kernels have had.

They wrap the bundled PyTorch implementation and inject one bug each. They are not registered with
the backend registry (a sweep never runs them); `attnbench selftest` and the tests run each against
the cases where its bug must show and require the checks to flag it, while the torch backend passes
the same cases.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from attnbench.backend import Backend
from attnbench.kernels.mutants.chain import CHAIN_MUTANTS, chain_with
from attnbench.kernels.mutants.interactions import INTERACTION_MUTANTS
from attnbench.kernels.mutants.replay import BakedLengthDecode
from attnbench.kernels.mutants.stale import STALE_MUTANTS, snapshot_backend
from attnbench.kernels.mutants.upstream import UPSTREAM_MUTANTS
from attnbench.kernels.torch.attention import paged_attention
from attnbench.kernels.torch.merge import merge_state


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what the bug is, as a reviewer would describe it
    cases: tuple[str, ...]  # case ids where it must be caught
    backend: Callable[[], Backend]
    source: str = ""  # the upstream issue / pull request whose bug it reproduces, where there is one
    known_escape: str = ""  # why the default suites miss it (a detection gap to fix; caught anyway = fail)
    cuda_only: str = ""  # why only a GPU self-test can catch it (on a CPU it is not run: a known escape there)


def _attention_mutant(name: str, run: Callable) -> type[Backend]:
    """A backend whose decode/extend closure is `run(x)` (x: AttentionInputs)."""

    def prepare(self, case, x):
        return lambda: run(x)

    return type(f"Mutant_{name}", (Backend,), {"name": name, "prepare_decode": prepare, "prepare_extend": prepare})


def _shifted(x, **changes):
    """The same inputs with some fields replaced; outputs still land in x.o / x.lse."""
    return dataclasses.replace(x, **changes)


def _off_by_one_window(x):
    return paged_attention(_shifted(x, window=x.window + 1 if x.window >= 0 else -1))


def _gqa_mismap(x):
    # q head h reads kv head h % Hkv instead of h // (Hq / Hkv): permute the query heads accordingly
    Hq, Hkv = x.q.shape[1], x.k_cache.shape[2]
    G = Hq // Hkv
    h = torch.arange(Hq, device=x.q.device)
    wrong = (h % Hkv) * G + h // Hkv  # the head that reads the kv head this head should not
    q = x.q[:, wrong]
    out = paged_attention(_shifted(x, q=q))
    x.o.copy_(x.o[:, torch.argsort(wrong)])
    x.lse.copy_(x.lse[:, torch.argsort(wrong)])
    return out


def _dropped_sink(x):
    return paged_attention(_shifted(x, sinks=None))


def _ignored_soft_cap(x):
    return paged_attention(_shifted(x, soft_cap=0.0))


def _base2_lse(x):
    out = paged_attention(x)
    x.lse.div_(math.log(2))
    return out


def _wrong_mla_scale(x):
    return paged_attention(_shifted(x, sm_scale=x.q.shape[-1] ** -0.5))  # 576**-0.5 instead of the case's


def _read_past_seq_len(x):
    lens = tuple(n + 1 for n in x.seq_lens_host)
    return paged_attention(_shifted(x, seq_lens_host=lens, seq_lens=x.seq_lens + 1, q_lens_host=x.q_lens_host))


def _write_past_output(x):
    out = paged_attention(x)
    flat = torch.empty(0, dtype=x.o.dtype, device=x.o.device).set_(x.o.untyped_storage())
    flat[x.o.storage_offset() + x.o.numel()] = 0.0  # one element past the end
    return out


class _Stale(Backend):
    """Computes once per buffer address and then returns what it cached."""

    name = "stale-cache"
    _memo: dict = {}

    def prepare_decode(self, case, x):
        def run():
            key = (x.q.data_ptr(), x.o.data_ptr())
            if key not in self._memo:
                paged_attention(x)
                self._memo[key] = (x.o.clone(), x.lse.clone())
            o, lse = self._memo[key]
            x.o.copy_(o)
            x.lse.copy_(lse)
            return {"o": x.o, "lse": x.lse}

        return run


def _nan_on_empty_rows(x):
    out = paged_attention(x)
    empty = torch.isinf(x.lse) & (x.lse < 0)
    x.o[empty] = float("nan")  # 0/0 in the normalisation: what an unguarded kernel writes
    return out


def _skip_save(x):
    return paged_attention(_shifted(x, save_kv=False))  # attends k_new but never writes the cache


def _input_scribble(x):
    out = paged_attention(x)
    x.q.mul_(1.0)  # harmless math, but touches a NaN-free input...
    x.q[0, 0, 0] += 1  # ...and then really modifies it
    return out


class _DecayAfterDelta(Backend):
    """GDN decode that computes the delta with the undecayed state and decays afterwards."""

    name = "gdn-decay-after-delta"

    def prepare_gdn_decode(self, case, x):
        from attnbench.kernels.torch import gdn

        def wrong_step(S, qh, kh, v, g, beta):
            u = beta[..., None] * (v - (S * kh[..., :, None]).sum(-2))
            S = (S + kh[..., :, None] * u[..., None, :]) * torch.exp(g)[..., None, None]
            return S, (S * qh[..., :, None]).sum(-2)

        def run():
            right, gdn._step = gdn._step, wrong_step
            try:
                return gdn.gdn_decode(x)
            finally:
                gdn._step = right

        return run


class _SiblingLeak(Backend):
    """Tree verification whose mask lets every tree token see all earlier tree tokens (siblings too)."""

    name = "tree-mask-leak"

    def prepare_tree_verify(self, case, x):
        leaky = x.custom_mask.clone()
        offsets = x.mask_indptr.tolist()
        for b, (L, n) in enumerate(zip(x.seq_lens_host, x.q_lens_host)):
            block = leaky[offsets[b] : offsets[b + 1]].view(n, L)
            block[:, L - n :] |= torch.ones(n, n, dtype=torch.bool, device=block.device).tril()
        return lambda: paged_attention(dataclasses.replace(x, custom_mask=leaky))


class _MergeBase2(Backend):
    name = "merge-base2"

    def prepare_merge_state(self, case, x):
        def run():
            merge_state(x)
            x.lse.div_(math.log(2))
            return {"o": x.o, "lse": x.lse}

        return run


MUTANTS: tuple[Mutant, ...] = (
    Mutant("off-by-one-window", "sees W + 2 keys instead of W + 1", (
        "decode/b3-l70-mixed-h8x2-d64-p16-swa7-bf16", "extend/b2-q8-pre30-h8x2-d64-p1-swa5-bf16"),
        lambda: _attention_mutant("off-by-one-window", _off_by_one_window)()),
    Mutant("gqa-head-mismap", "q head h reads kv head h % Hkv instead of h // (Hq/Hkv)", (
        "decode/b3-l37-mixed-h8x2-d128-p16-bf16",), lambda: _attention_mutant("gqa-head-mismap", _gqa_mismap)()),
    Mutant("dropped-sink", "ignores the sink logits", (
        "decode/b3-l70-skewed-h8x2-d64-p16-sink-bf16",), lambda: _attention_mutant("dropped-sink", _dropped_sink)()),
    Mutant("ignored-soft-cap", "skips cap * tanh(s / cap)", (
        "decode/b3-l70-skewed-h8x2-d64-p16-cap5-bf16",), lambda: _attention_mutant("ignored-soft-cap", _ignored_soft_cap)()),
    Mutant("base2-lse", "returns log2-sum-exp2 (FlashInfer's convention) as the LSE", (
        "decode/b3-l37-mixed-h8x2-d128-p16-bf16",), lambda: _attention_mutant("base2-lse", _base2_lse)()),
    Mutant("wrong-mla-scale", "scales MLA scores by 576**-0.5 instead of the model's scale", (
        "decode/b2-l40-h16x1-d576x512-p16-mla-scale0.1352337788608801-bf16",),
        lambda: _attention_mutant("wrong-mla-scale", _wrong_mla_scale)()),
    Mutant("read-past-seq-len", "attends one key past each sequence (a poisoned slot)", (
        "decode/b3-l37-mixed-h8x2-d128-p16-bf16",), lambda: _attention_mutant("read-past-seq-len", _read_past_seq_len)()),
    Mutant("write-past-output", "writes one element past the end of the output", (
        "decode/b3-l37-mixed-h8x2-d128-p16-bf16",), lambda: _attention_mutant("write-past-output", _write_past_output)()),
    Mutant("stale-cached-output", "returns a cached result when called on the same buffers", (
        "decode/b3-l37-mixed-h8x2-d128-p16-bf16",), lambda: _Stale()),
    Mutant("nan-on-empty-rows", "divides 0 by 0 for rows with no visible key", (
        "extend/b2-q6-pre10-h4x2-d32-p16-custom-emptyrows-bf16",), lambda: _attention_mutant("nan-on-empty-rows", _nan_on_empty_rows)()),
    Mutant("kv-not-saved", "attends the new K/V but never writes them into their cache slots", (
        "extend/b2-q7-pre19-h4x2-d64-p16-bf16",), lambda: _attention_mutant("kv-not-saved", _skip_save)()),
    Mutant("input-modified", "modifies its query input", (
        "decode/b3-l37-mixed-h8x2-d128-p16-bf16",), lambda: _attention_mutant("input-modified", _input_scribble)()),
    Mutant("merge-base2-lse", "merge_state returns a base-2 LSE", ("merge_state/t33-h4-d64-empty-bf16",),
        lambda: _MergeBase2()),
    Mutant("gdn-decay-after-delta", "GDN: delta from the undecayed state, decay applied after it", (
        "gdn_decode/b5-h2x4-d16x16-bf16",), lambda: _DecayAfterDelta()),
    Mutant("tree-mask-leaks-siblings", "tree verification lets tokens see their siblings", (
        "tree_verify/b3-pre21-mixed-h8x2-d64-p16-treebinary-depth2-bf16",), lambda: _SiblingLeak()),
    # bugs where features meet and at numeric edges: no case written for them (selftest finds the first)
    *(Mutant(name, bug, (), factory) for name, bug, factory in INTERACTION_MUTANTS),
    # closures that cache one class of inputs at prepare (kernels/mutants/stale.py): no case written either
    *(Mutant(name, bug, (), lambda n=name, f=fields: snapshot_backend(n, f)) for name, bug, fields in STALE_MUTANTS),
    # bugs of one state pool shared by several ops (kernels/mutants/chain.py): gdn_chain cases find them
    *(Mutant(name, bug, (), lambda n=name, c=cls: chain_with(n, c())) for name, bug, cls in CHAIN_MUTANTS),
    # right eagerly, wrong on CUDA-graph replay (kernels/mutants/replay.py): the replay check runs on a GPU
    Mutant("replay-baked-max-len", "sizes its key loop from the longest length of the batch it was prepared on, "
           "so a graph replayed on a batch with a longer request misses its last keys", (), BakedLengthDecode,
           cuda_only="the replay check captures CUDA graphs: a CPU run skips it"),
    # real bugs from upstream trackers (kernels/mutants/upstream.py): no case written for them either
    *(Mutant(u.name, u.bug, (), u.backend, u.source, u.known_escape, u.cuda_only) for u in UPSTREAM_MUTANTS),
)  # fmt: skip
