"""The FlashInfer backends: one registered name per kernel family, built from per-op mixins.

- `flashinfer`: decode on the tensor-core fa2 kernel; extend as one paged fa2 prefill (`attend`: the
  ragged+paged cascade); sinks through the AttentionSink wrapper (fa2); MLA through the MLA wrapper
  (fa2); merge_state on the cascade kernel.
- `flashinfer-fa3`: the same decode/extend/sinks/MLA paths on FlashInfer's fa3 (SM90) kernels.
- `flashinfer-cudacore`: decode on the CUDA-core kernel (`use_tensor_cores=False`).
- `flashinfer-ragged`: extend as SGLang runs it: ragged kernel on the new tokens, paged kernel on the
  prefix, merge_state (fa2). `flashinfer-ragged-fa3`: the same on fa3.

An op is added by a mixin whose prepare method is declared with `@implements(op, limits=...,
jit_keys=...)` (attnbench.backend): its limits are the case-level skip reasons (hardware
availability is checked before them, the case's device and fp8 caches by `backend_limits`), its JIT
keys the modules `prebuild` compiles before the cases. The GDN mixin (`gdn.py`, `FlashInferGDN`)
joins a class's bases the same way.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from attnbench.backend import Backend, implements, register_backend
from attnbench.dtypes import to_torch
from attnbench.kernels.flashinfer import _lib, limits
from attnbench.kernels.flashinfer.gdn import FlashInferGDN
from attnbench.kernels.flashinfer.jitkeys import JitKey
from attnbench.ops.attention import FP8

# why decode's closures may not be captured in a CUDA graph and replayed on another batch (the replay check,
# docs/replay.md): every decode path here (tensor-core, CUDA-core, MLA, AttentionSink) plans on the host
PLANNED_ON_HOST = (
    "plan() copies the batch's indptr and last-page lengths to the host and writes a work schedule for them into "
    "the workspace, once, in prepare; the wrappers are not built with use_cuda_graph=True and nothing re-plans "
    "before a replay (a server re-plans into its graph's buffers before each replay): a graph replays batch A's schedule"
)


def _kv_dtype(case) -> torch.dtype | None:
    """The KV cache's dtype where it is not the case dtype (fp8 caches), else None."""
    return FP8.get(getattr(case.params, "kv_dtype", "auto"))


def _prefill_keys(case, backend: str, *, paged: bool, cascade: bool = False) -> list[JitKey]:
    """Modules of a prefill-kernel path (tensor-core decode included): the kernel for q/o and KV
    dtypes, fa2's independent-stride variant for a paged call with Dk != Dv, the packbits module
    that plan() packs a custom mask with, and the cascade (merge) module when a prefix is merged in."""
    p = case.params
    dv = p.dv
    key = JitKey(
        "prefill", backend, to_torch(case.dtype), p.head_dim, dv, p.window >= 0, p.soft_cap > 0, _kv_dtype(case)
    )
    keys = [key]
    if paged and backend == "fa2" and p.head_dim != dv:
        keys.append(key._replace(kind="prefill-independent"))
    if getattr(p, "mask", "causal") == "custom":
        keys.append(JitKey("packbits"))
    if cascade:
        keys.append(JitKey("cascade"))
    return keys


def _sink_key(case, backend: str) -> JitKey:
    p = case.params
    return JitKey("sink", backend, to_torch(case.dtype), p.head_dim, p.dv, p.window >= 0)


def _device_and_kv(backend, case) -> str | None:
    """Every op: a CUDA case; fp8 KV caches where the adapter wires them (plain decode on fa2)."""
    if not case.on_cuda:
        return f"FlashInfer runs on CUDA devices; this case is on {case.device}"
    if getattr(case.params, "kv_dtype", "auto") != "auto":
        return limits.fp8_kv(case, case.op_name == "decode", backend.attention_backend)
    return None


class FlashInferBase(Backend):
    """Availability (package, GPU, SM90 for fa3), then the case device and fp8 caches, then the op's limits."""

    attention_backend: ClassVar[str] = "fa2"  # "fa2" or "fa3": the kernel family of the paged paths
    backend_limits = _device_and_kv

    def available(self) -> str | None:
        return _lib.unavailable(need_sm90=self.attention_backend == "fa3")

    @classmethod
    def precompile(cls, keys: list[JitKey]) -> str:
        """Every FlashInfer variant's modules, built in parallel before the cases (`prebuild`).
        `jit_keys(case)` names exactly the modules `prepare` loads (tests/kernels/flashinfer/
        test_flashinfer_prebuild.py checks it through the wrappers)."""
        from attnbench.kernels.flashinfer.prebuild import build, specs

        modules = specs(keys)
        build(modules)
        return f"flashinfer: {len(modules)} JIT modules built"


# ---- decode ---------------------------------------------------------------------------------------
def paged_decode_limits(backend, case) -> str | None:
    p = case.params
    if reason := limits.dtype(case.dtype):
        return reason
    if p.mla:
        return limits.mla(p, extend=False)
    reason = limits.one_head_dim(p.head_dim, p.dv)
    reason = reason or limits.head_dims(backend.attention_backend, p.head_dim, p.dv)
    if reason or not p.sinks:
        return reason
    return limits.sinks(p, extend=False)


def paged_decode_jit(backend, case) -> list[JitKey]:
    p = case.params
    if p.mla:
        return [JitKey("mla", backend.attention_backend, to_torch(case.dtype))]
    if p.sinks:
        return [_sink_key(case, backend.attention_backend)]
    return _prefill_keys(case, backend.attention_backend, paged=True)


class PagedDecode:
    """Decode: tensor-core kernel, AttentionSink wrapper for sinks, MLA wrapper for MLA."""

    @implements("decode", limits=paged_decode_limits, jit_keys=paged_decode_jit, graph_safe=PLANNED_ON_HOST)
    def prepare_decode(self, case, x):
        if case.params.mla:
            from attnbench.kernels.flashinfer.mla import prepare_mla

            return prepare_mla(case, x, backend=self.attention_backend, decode=True)
        if case.params.sinks:
            from attnbench.kernels.flashinfer.sinks import prepare_sinks

            return prepare_sinks(case, x, backend=self.attention_backend)
        from attnbench.kernels.flashinfer.decode import prepare_decode

        return prepare_decode(case, x, tensor_cores=True, backend=self.attention_backend)


def cuda_core_decode_limits(backend, case) -> str | None:
    p = case.params
    if reason := limits.dtype(case.dtype):
        return reason
    if p.mla:
        return "MLA decode runs through BatchMLAPagedAttentionWrapper (flashinfer, flashinfer-fa3)"
    if p.sinks:
        return (
            "FlashInfer's CUDA-core decode kernel has no sink term (run(sinks=...) is dropped silently "
            "on this path); sinks run on flashinfer / flashinfer-fa3 through the AttentionSink wrapper"
        )
    group = p.heads_q // p.heads_kv
    return limits.one_head_dim(p.head_dim, p.dv) or limits.cuda_core_decode(p.head_dim, group)


def cuda_core_decode_jit(backend, case) -> list[JitKey]:
    p = case.params
    dtype = to_torch(case.dtype)
    return [JitKey("decode", "", dtype, p.head_dim, p.dv, p.window >= 0, p.soft_cap > 0, _kv_dtype(case))]


class CudaCoreDecode:
    """Decode on FlashInfer's CUDA-core kernel (`use_tensor_cores=False`)."""

    @implements("decode", limits=cuda_core_decode_limits, jit_keys=cuda_core_decode_jit, graph_safe=PLANNED_ON_HOST)
    def prepare_decode(self, case, x):
        from attnbench.kernels.flashinfer.decode import prepare_decode

        return prepare_decode(case, x, tensor_cores=False, backend="fa2")


# ---- extend ---------------------------------------------------------------------------------------
def paged_extend_limits(backend, case) -> str | None:
    p, fam = case.params, backend.attention_backend
    if reason := limits.dtype(case.dtype):
        return reason
    if p.mla:
        return limits.mla(p, extend=True)
    if reason := limits.head_dims(fam, p.head_dim, p.dv):
        return reason
    if p.mask == "custom" and fam == "fa3":
        return "FlashInfer's fa3 kernels take no custom mask (MaskMode.CUSTOM is rejected on SM90)"
    if p.sinks:
        reason = limits.sinks(p, extend=True)
    elif p.new_kv == "attend":
        return limits.cascade(p, fam) or limits.cascade_prefixes(case)
    else:
        reason = None
    if reason is None and fam == "fa3":
        reason = limits.fa3_paged_strides(p.head_dim, p.dv)
    return reason


def paged_extend_jit(backend, case) -> list[JitKey]:
    p, fam = case.params, backend.attention_backend
    if p.mla:
        return [JitKey("mla", fam, to_torch(case.dtype))]
    if p.sinks:
        return [_sink_key(case, fam)]
    if p.new_kv == "attend":
        prefix = p.prefix_len > 0
        return _prefill_keys(case, fam, paged=prefix, cascade=prefix)
    return _prefill_keys(case, fam, paged=True)


class PagedExtend:
    """Extend: one paged prefill call; attend mode via the ragged+paged cascade; sinks; MLA.

    Tree verification is a custom-mask extend with save (its inputs are extend's): same paths, same limits."""

    @implements("extend", "tree_verify", limits=paged_extend_limits, jit_keys=paged_extend_jit)
    def prepare_extend(self, case, x):
        p = case.params
        if p.mla:
            from attnbench.kernels.flashinfer.mla import prepare_mla

            return prepare_mla(case, x, backend=self.attention_backend, decode=False)
        if p.sinks:
            from attnbench.kernels.flashinfer.sinks import prepare_sinks

            return prepare_sinks(case, x, backend=self.attention_backend)
        from attnbench.kernels.flashinfer import extend

        if p.new_kv == "attend":
            return extend.prepare_cascade(case, x, backend=self.attention_backend)
        return extend.prepare_paged(case, x, backend=self.attention_backend)


def ragged_extend_limits(backend, case) -> str | None:
    p, fam = case.params, backend.attention_backend
    if reason := limits.dtype(case.dtype):
        return reason
    if p.mla:
        return "FlashInfer MLA runs through BatchMLAPagedAttentionWrapper (flashinfer, flashinfer-fa3)"
    if p.new_kv == "shared":
        return "the ragged kernel reads the new tokens' K/V, which new_kv=shared keeps only in the cache"
    return limits.head_dims(fam, p.head_dim, p.dv) or limits.cascade(p, fam) or limits.cascade_prefixes(case)


def ragged_extend_jit(backend, case) -> list[JitKey]:
    prefix = case.params.prefix_len > 0
    return _prefill_keys(case, backend.attention_backend, paged=prefix, cascade=prefix)


class RaggedExtend:
    """Extend the SGLang way: ragged kernel on the new tokens, paged on the prefix, merge_state."""

    @implements("extend", limits=ragged_extend_limits, jit_keys=ragged_extend_jit)
    def prepare_extend(self, case, x):
        from attnbench.kernels.flashinfer.extend import prepare_cascade

        return prepare_cascade(case, x, backend=self.attention_backend)


# ---- merge_state ----------------------------------------------------------------------------------
class MergeState:
    @implements(
        "merge_state",
        limits=lambda backend, case: limits.merge_state(case.params, case.dtype),
        jit_keys=lambda backend, case: [JitKey("cascade")],
    )
    def prepare_merge_state(self, case, x):
        from attnbench.kernels.flashinfer.merge import prepare_merge_state

        return prepare_merge_state(case, x)


@register_backend("flashinfer")
class FlashInfer(PagedDecode, PagedExtend, MergeState, FlashInferGDN, FlashInferBase):
    description = (
        "FlashInfer 0.7.2 fa2: tensor-core paged decode, paged prefill (custom masks), sink and MLA "
        "wrappers, merge_state"
    )
    attention_backend = "fa2"


@register_backend("flashinfer-fa3")
class FlashInferFA3(PagedDecode, PagedExtend, FlashInferBase):
    description = "FlashInfer 0.7.2 fa3 (SM90): tensor-core paged decode, paged prefill, sink + MLA wrappers"
    attention_backend = "fa3"


@register_backend("flashinfer-cudacore")
class FlashInferCudaCore(CudaCoreDecode, FlashInferBase):
    description = "FlashInfer 0.7.2 CUDA-core paged decode kernel (use_tensor_cores=False)"
    attention_backend = "fa2"


@register_backend("flashinfer-ragged")
class FlashInferRagged(RaggedExtend, FlashInferBase):
    description = "FlashInfer 0.7.2 fa2 extend as SGLang runs it: ragged new tokens, paged prefix, merge"
    attention_backend = "fa2"


@register_backend("flashinfer-ragged-fa3")
class FlashInferRaggedFA3(RaggedExtend, FlashInferBase):
    description = "FlashInfer 0.7.2 fa3 extend as SGLang runs it: ragged new tokens, paged prefix, merge"
    attention_backend = "fa3"
