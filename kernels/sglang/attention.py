"""SGLang's Triton attention kernels (sglang 0.5.10.post1, `sglang.srt.layers.attention.triton_ops`)
behind the canonical decode, extend and merge_state contracts.

- decode: `decode_attention_fwd` (split-KV, two stages) over a token-level table of the paged
  cache (conventions.token_slots on the `[P * page_size, Hkv, D]` view; no copy), the window as a
  windowed table, as SGLang's backend builds it. Splits: SGLang's rule (conventions.num_kv_splits)
  with its server default `max_kv_splits = 8` and the device's SM count, recorded in prepare_info.
  Scratch (`attn_logits`, `attn_lse`) is allocated in prepare.
- extend: `extend_attention_fwd` (prefix from the cache by token table, windowed as SGLang's backend
  builds it for a sliding-window layer (`window_kv_offsets` = its start), new tokens from
  `k_new`/`v_new`, custom mask per request `[q_len, prefix + q_len]` with the prefix masked too,
  `sliding_window_size = W`, `logit_cap`, sinks). `new_kv: save` stores the new K/V first (timed, as
  SGLang's `forward_extend` calls `set_kv_buffer` before the kernel); `shared` (no new K/V tensors)
  cannot be said: the kernel reads new tokens from `k_extend`.
- merge_state: `merge_state_triton` (natural-log LSE, as canonical).
- extend, deterministic (`sglang-unified`): `build_unified_kv_indices` then
  `extend_attention_fwd_unified`, as SGLang's `TritonAttnBackend._forward_extend_unified` calls them
  on every layer when `enable_deterministic_inference` is on: one token table per request, its
  (windowed) prefix followed by the new tokens' cache slots (`out_cache_loc`), read by a one-stage
  kernel; the prefix length and, for a window, its start (`window_start_pos`) beside it. The new
  tokens are read from the cache, so `new_kv: save` stores them first (timed, as `forward_extend`
  does) and `shared` has them there already; `attend` (not in the cache) cannot be said.
- extend without a prefix (`sglang-prefill`): `prefill_attention.context_attention_fwd` over the new
  tokens' contiguous `k_new`/`v_new` (causal or bidirectional; its scale is fixed at `Dk ** -0.5`).

fp8 KV caches (decode, extend, tree_verify, `sglang-unified`): the layer's k and v scales as the two
floats SGLang's backend passes (`layer.k_scale_float`, `layer.v_scale_float`; `layer_scales`), so
per-head scales are a skip. As SGLang's `forward_extend`, `save` stores the new K/V quantized first and
`extend_attention_fwd` then attends them from `k_new`/`v_new` in the query dtype (the unified kernel
reads them back from the cache). Both extend kernels round the query and P to the cache's fp8 dtype
(docs/findings.md, "SGLang Triton extend rounds q and P to fp8").

None of these attention kernels returns the final LSE: the closures declare `absent = {"lse": ...}`.
"""

from __future__ import annotations

import torch

from attnbench.errors import Unsupported
from attnbench.kernels.sglang import _lib
from attnbench.kernels.sglang import conventions as conv
from attnbench.kernels.torch.attention import save_new_kv

MAX_KV_SPLITS = 8  # ServerArgs.triton_attention_num_kv_splits (CUDA default)
NO_LSE = "SGLang's {} kernel returns no final LSE"


def attention_unsupported(case) -> str | None:
    """Why SGLang's Triton attention cannot run `case` (None: it can)."""
    p = case.params
    if why := _per_head_scales(p):
        return why
    if case.op_name == "extend":
        if p.new_kv == "shared":
            return "SGLang's extend_attention_fwd reads the new tokens from k_extend/v_extend (new_kv shared has none)"
        if p.window == 0:
            return "SGLang's extend reads sliding_window_size 0 as no window: window 0 cannot be expressed"
    return None


def _per_head_scales(p) -> str | None:
    if p.kv_dtype != "auto" and p.kv_scale == "head":
        return (
            "SGLang's Triton attention takes one k and one v scale per layer (floats): per-head scales cannot be "
            "expressed"
        )
    return None


def unified_unsupported(case) -> str | None:
    """Why SGLang's deterministic extend (`extend_attention_fwd_unified`) cannot run `case` (None: it can)."""
    p = case.params
    if why := _per_head_scales(p):
        return why
    if p.new_kv == "attend":
        return (
            "SGLang's extend_attention_fwd_unified reads the new tokens from the cache (out_cache_loc): "
            "new_kv attend leaves them out of it"
        )
    if p.window == 0:
        return "SGLang's extend reads sliding_window_size 0 as no window: window 0 cannot be expressed"
    return None


def prefill_unsupported(case) -> str | None:
    """Why SGLang's `context_attention_fwd` (prefill_attention.py) cannot run `case` (None: it can):
    new tokens only, contiguous K/V, the default scale and none of the extras."""
    p = case.params
    _, prefixes = _prefix_lens(case)
    if any(prefixes):
        return "SGLang's context_attention_fwd attends the new tokens only: every request's prefix must be 0"
    if p.new_kv == "shared":
        return "SGLang's context_attention_fwd reads contiguous k/v of the new tokens (new_kv shared has none)"
    reasons = [
        (p.kv_dtype != "auto", "fp8 KV caches: it reads k/v in the query dtype"),
        (p.mask == "custom", "no custom masks"),
        (p.window >= 0, "no sliding window"),
        (p.soft_cap > 0, "no soft cap"),
        (p.sinks, "no sinks"),
        (p.dv != p.head_dim, "one head dim for q, k and v (head_dim_v != head_dim)"),
        (p.scale != p.head_dim**-0.5, "its scale is fixed at head_dim ** -0.5"),
    ]
    for bad, what in reasons:
        if bad:
            return f"SGLang's context_attention_fwd: {what}"
    return None


def _prefix_lens(case) -> tuple[list[int], list[int]]:
    kv_lens, q_lens = case.op.request_lengths(case.params, case.seed)
    return q_lens, [L - n for L, n in zip(kv_lens, q_lens)]


def _core_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0


def layer_scales(x) -> tuple[float, float]:
    """The layer's k and v scales as the floats SGLang's kernels take (its backend passes
    `layer.k_scale_float` / `layer.v_scale_float`, 1.0 without an fp8 cache): real value = stored * scale.
    Read once, in prepare (a host read; the scales are model weights, `Op.held`)."""
    if x.k_scale is None:
        return 1.0, 1.0
    return float(x.k_scale.reshape(-1)[0]), float(x.v_scale.reshape(-1)[0])


def prepare_decode(case, x):
    """SGLang's Triton decode on static buffers, as its CUDA-graph runner holds them: the token-level
    `kv_indptr`/`kv_indices` (capacity: every key the page table can address) and `num_kv_splits` are
    filled by `refresh` from the batch's device tensors (lengths, page table), once here and again as
    the closure's `before_replay`, the step SGLang's server runs before each replay
    (`init_forward_metadata_replay_cuda_graph`)."""
    mod = _lib.module("decode_attention")
    B, Hq, Dv = x.q.shape[0], x.q.shape[1], x.v_cache.shape[-1]
    Hkv = x.k_cache.shape[2]
    dev = x.q.device
    cores = _core_count(dev)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    kv_indices = torch.zeros(max(x.kv_page_indices.numel() * x.page_size, 1), dtype=torch.int64, device=dev)
    num_kv_splits = torch.empty(B, dtype=torch.int32, device=dev)

    def refresh() -> list[int]:
        """The tables of the batch the inputs hold now (host reads: never inside a graph or timed window)."""
        ranges = [conv.decode_key_range(int(L), x.window) for L in x.seq_lens.tolist()]
        indptr, indices = conv.token_slots(
            x.kv_indptr, x.kv_page_indices, x.page_size, [s for s, _ in ranges], [e for _, e in ranges]
        )
        kv_indptr.copy_(indptr)
        kv_indices[: indices.numel()].copy_(indices)
        splits = conv.num_kv_splits([e - s for s, e in ranges], Hq, Hkv, MAX_KV_SPLITS, cores)
        num_kv_splits.copy_(torch.tensor(splits, dtype=torch.int32))
        return splits

    splits = refresh()
    logits = torch.empty(B, Hq, MAX_KV_SPLITS, Dv, dtype=torch.float32, device=dev)
    lse = torch.empty(B, Hq, MAX_KV_SPLITS, dtype=torch.float32, device=dev)
    k_buf, v_buf = conv.token_view(x.k_cache), conv.token_view(x.v_cache)
    k_scale, v_scale = layer_scales(x)

    def run():
        mod.decode_attention_fwd(
            x.q, k_buf, v_buf, x.o, kv_indptr, kv_indices, logits, lse, num_kv_splits, MAX_KV_SPLITS,
            x.sm_scale, k_scale, v_scale, logit_cap=x.soft_cap, sinks=x.sinks,
        )  # fmt: skip
        return {"o": x.o}

    run.before_replay = refresh
    run.absent = {"lse": NO_LSE.format("decode_attention_fwd")}
    run.info = {
        "variant": "decode_attention_fwd " + ("normal (MHA)" if Hq == Hkv else "grouped"),
        "max_kv_splits": MAX_KV_SPLITS,
        "num_kv_splits": sorted(set(splits)),
        "core_count": cores,
    }
    return run


def _window_and_starts(x) -> tuple[int, list[tuple[int, int]], list[int]]:
    """SGLang's sliding_window_size of the case, each request's visible prefix range [start, end) and
    the starts (Unsupported for a window SGLang cannot express)."""
    try:
        window = conv.sliding_window_size(x.window)
    except ValueError as e:
        raise Unsupported(str(e)) from e
    ranges = [conv.extend_prefix_range(L - n, x.window) for L, n in zip(x.seq_lens_host, x.q_lens_host)]
    return window, ranges, [s for s, _ in ranges]


def prepare_extend(case, x):
    mod = _lib.module("extend_attention")
    window, ranges, starts = _window_and_starts(x)
    kv_indptr, kv_indices = conv.token_slots(
        x.kv_indptr, x.kv_page_indices, x.page_size, starts, [e for _, e in ranges]
    )
    k_buf, v_buf = conv.token_view(x.k_cache), conv.token_view(x.v_cache)
    qo_indptr = x.qo_indptr.to(torch.int64)
    custom = x.custom_mask is not None
    offsets = torch.tensor(starts, dtype=torch.int32, device=x.q.device)  # custom mask columns before the table
    max_q = max(x.q_lens_host)
    k_scale, v_scale = layer_scales(x)

    def run():
        if x.save_kv:
            save_new_kv(x)
        mod.extend_attention_fwd(
            x.q, x.k_new, x.v_new, x.o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, x.custom_mask,
            x.causal and not custom, x.mask_indptr, max_q, k_scale, v_scale, sm_scale=x.sm_scale, logit_cap=x.soft_cap,
            skip_prefix_custom_mask=False, sliding_window_size=window, sinks=x.sinks, window_kv_offsets=offsets,
        )  # fmt: skip
        return {"o": x.o}

    run.absent = {"lse": NO_LSE.format("extend_attention_fwd")}
    run.info = {"variant": "extend_attention_fwd" + (" (custom mask)" if custom else "")}
    return run


def prepare_merge_state(case, x):
    mod = _lib.module("merge_state")

    def run():
        mod.merge_state_triton(x.v_a, x.s_a, x.v_b, x.s_b, x.o, x.lse)
        return {"o": x.o, "lse": x.lse}

    run.info = {"variant": "merge_state_triton"}
    return run


def prepare_extend_unified(case, x):
    mod = _lib.module("extend_attention")
    window, _, starts = _window_and_starts(x)
    ps = x.page_size
    prefixes = [L - n for L, n in zip(x.seq_lens_host, x.q_lens_host)]
    # forward_metadata.kv_indptr/kv_indices (window_kv_* for a sliding-window layer) and out_cache_loc
    prefix_indptr, prefix_indices = conv.token_slots(x.kv_indptr, x.kv_page_indices, ps, starts, prefixes)
    _, out_cache_loc = conv.token_slots(x.kv_indptr, x.kv_page_indices, ps, prefixes, list(x.seq_lens_host))
    dev = x.q.device
    extend_seq_lens = torch.tensor(x.q_lens_host, dtype=torch.int32, device=dev)
    extend_start_loc = x.qo_indptr[:-1].to(torch.int32)
    window_start_pos = torch.tensor(starts, dtype=torch.int32, device=dev) if window > 0 else None
    k_buf, v_buf = conv.token_view(x.k_cache), conv.token_view(x.v_cache)
    B, max_q = len(x.q_lens_host), max(x.q_lens_host)
    k_scale, v_scale = layer_scales(x)

    def run():
        if x.save_kv:
            save_new_kv(x)
        kv_indptr, kv_indices, prefix_lens = mod.build_unified_kv_indices(
            prefix_indptr, prefix_indices, extend_start_loc, extend_seq_lens, out_cache_loc, B
        )
        mod.extend_attention_fwd_unified(
            x.q, x.o, k_buf, v_buf, k_scale, v_scale, x.qo_indptr, kv_indptr, kv_indices, prefix_lens.to(torch.int32),
            max_q, custom_mask=x.custom_mask, mask_indptr=x.mask_indptr, sm_scale=x.sm_scale, logit_cap=x.soft_cap,
            is_causal=x.causal, sliding_window_size=window, sinks=x.sinks, window_start_pos=window_start_pos,
        )  # fmt: skip
        return {"o": x.o}

    run.absent = {"lse": NO_LSE.format("extend_attention_fwd_unified")}
    custom = " (custom mask)" if x.custom_mask is not None else ""
    run.info = {"variant": f"build_unified_kv_indices + extend_attention_fwd_unified{custom}"}
    return run


def prepare_prefill(case, x):
    mod = _lib.module("prefill_attention")
    dev = x.q.device
    start_loc = x.qo_indptr[:-1].to(torch.int32)
    seq_len = torch.tensor(x.q_lens_host, dtype=torch.int32, device=dev)
    max_q = max(x.q_lens_host)

    def run():
        if x.save_kv:
            save_new_kv(x)
        mod.context_attention_fwd(x.q, x.k_new, x.v_new, x.o, start_loc, seq_len, max_q, is_causal=x.causal)
        return {"o": x.o}

    run.absent = {"lse": NO_LSE.format("context_attention_fwd")}
    run.info = {"variant": "context_attention_fwd" + ("" if x.causal else " (bidirectional)")}
    return run
