"""FlashAttention-4 (flash-attn-4 4.0.0b36, `flash_attn.cute`, CuTe DSL) as the `fa4` backend.

Decode and extend over the canonical paged cache, on SM90 (and newer):

- paged K/V: FA4 takes the pool `[num_pages, page_size, Hkv, D]` as is, a dense page table
  `[B, max_pages]` int32 (`page_table_from_csr`) and the real lengths in `seqused_k`; a page table
  cannot be combined with `cu_seqlens_k`.
- queries: decode as a batch of one query per request (`[B, 1, Hq, D]`, LSE `[B, Hq, 1]`, i.e. the
  canonical `[B, Hq]` memory); extend packed by `cu_seqlens_q` (LSE `[Hq, T]`, transposed into the
  canonical `[T, Hq]` inside the timed call).
- `new_kv: save` writes the new K/V into their slots first (timed, as SGLang's extend does);
  `attend` without prefixes attends `k_new`/`v_new` through `cu_seqlens_k` (no cache at all);
  `attend` with a prefix would need two K/V sources in one call and is a skip.
- masks: bottom-right causal or none; window W as `window_size=(W, 0)` (causal) or `(W, None)`;
  soft cap; sinks as `learnable_sink` logits. No custom masks (FA4's `mask_mod` is not wired).

The kernel is called through `flash_attn.cute.interface._flash_attn_fwd`, the function behind
`flash_attn_varlen_func`, because only it accepts preallocated `out`/`lse` (the public function
would add an output copy to the timed call). Its first call compiles the kernel for the static
configuration (cached in-process by FA4) and runs in `prepare`, timed as `compile_s`.

Partially used last pages. When FA4 loads a page by TMA (page_size equals its key tile, e.g. 128
for head dim 128 on SM90) it reads every row of the page, including those past `seqused_k`; their
scores are masked, but P = 0 times a NaN V row is NaN. FA4's docstring states the requirement
(rows past seqused_k must be finite). attnbench fills those rows with NaN to catch reads past a
sequence and checks that a kernel leaves them untouched, so zeroing them in `prepare` would fail
that check; such cases are skips with this reason. Pages loaded by cp.async (page_size != tile)
are predicated per row and run normally.
"""

from __future__ import annotations

import importlib.util
import os
import time

import torch

from attnbench.backend import Backend, implements, register_backend
from attnbench.cacheroot import compile_cache_dir, compile_caches_on
from attnbench.errors import Unsupported

OTHER_ARCH_TILE_N = 128  # the key tile of FA4 outside SM90 (its SM100 forward); SM90 asks FA4 itself


# ---- conversions (pure PyTorch, CPU-testable) ----------------------------------------------------
def page_table_from_csr(kv_indptr: torch.Tensor, kv_page_indices: torch.Tensor) -> torch.Tensor:
    """Canonical CSR page table -> FA4's dense `[B, max_pages]` int32 table (unused entries 0).

    Args:
        kv_indptr: `[B+1]` int32, request b owns `kv_page_indices[kv_indptr[b]:kv_indptr[b+1]]`.
        kv_page_indices: `[nnz]` int32 page ids.

    FA4 reads an entry only for rows below `seqused_k` ("pages a sequence does not use may hold
    anything"), so the padding value does not matter; 0 is a valid page id.
    """
    starts = kv_indptr[:-1].to(torch.int64)
    counts = kv_indptr[1:].to(torch.int64) - starts
    width = max(int(counts.max()) if counts.numel() else 0, 1)
    pos = torch.arange(width, device=kv_indptr.device)
    valid = pos[None, :] < counts[:, None]
    idx = torch.where(valid, starts[:, None] + pos[None, :], torch.zeros_like(pos)[None, :])
    if kv_page_indices.numel() == 0:
        return torch.zeros(valid.shape, dtype=torch.int32, device=kv_indptr.device)
    table = kv_page_indices.to(torch.int32)[idx.clamp(max=kv_page_indices.numel() - 1)]
    return torch.where(valid, table, torch.zeros_like(table)).contiguous()


def window_size(window: int, causal: bool) -> tuple[int | None, int | None]:
    """Canonical window W (keys [p - W, p] of a query at p) -> FA4 `(window_size_left, right)`.

    Causal: (W, 0). Verified: "FA4 flash_attn_func(causal=True, window_size=(W, 0)) | keys
    [p-W, p], like FlashInfer's window_left". Bidirectional: (W, None), no right bound (FA4 treats
    None as unbounded). No window: (None, None), the causal flag alone decides.
    """
    if window < 0:
        return None, None
    return window, (0 if causal else None)


def lse_heads_tokens_to_canonical(lse_ht: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """FA4's varlen LSE `[Hq, T]` (natural log) -> the canonical `[T, Hq]` in `out`.

    Verified: "FA4 return_lse=True | natural-log LSE, shape (B, Hq, S)"; varlen packs it as
    (Hq, total_q) (interface.py `lse_shape`). Only the layout changes.
    """
    return out.copy_(lse_ht.t())


def reads_partial_pages_by_tma(seq_lens: list[int], page_size: int, tile_n: int) -> bool:
    """True when FA4 loads whole pages by TMA (page_size == tile_n) and some last page is partial."""
    return page_size == tile_n and any(n % page_size for n in seq_lens)


# ---- availability -------------------------------------------------------------------------------
def _find(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


_IMPORT_PROBLEM: list[str | None] = []
CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"  # FA4's own on-disk cache of compiled kernels (off by default)


def use_compile_cache() -> None:
    """Turn FA4's persistent compile cache on, in the attnbench cache (`compile/fa4`), unless the user
    set FA4's variables: each worker process otherwise traces and compiles every kernel variant again
    (9.0 s of prepare in a warm `ci` sweep on an H100, h100-session13). FA4 keys an entry by its compile
    key and a fingerprint of its sources, cutlass and tvm_ffi versions. Read by FA4 when
    `flash_attn.cute.cache_utils` is imported, so this runs before the first import; `FA4`'s
    `compile_s` still says what the first call cost. `$ATTNBENCH_COMPILE_CACHE=off` leaves FA4 as the
    user configured it."""
    if not compile_caches_on():
        return
    os.environ.setdefault(CACHE_ENV, "1")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(compile_cache_dir("fa4")))


def _interface():
    """`flash_attn.cute.interface`, imported with the compile cache set up first (`use_compile_cache`):
    the one place this module imports FA4."""
    use_compile_cache()
    import flash_attn.cute.interface as interface

    return interface


def unavailable() -> str | None:
    """Why FA4 cannot run here (None: it can): packages, a CUDA GPU of sm_90 or newer, the import."""
    missing = [n for n in ("cutlass", "flash_attn.cute", "quack") if not _find(n)]
    if missing:
        return f"FlashAttention-4 needs {', '.join(missing)} (pip install 'attnbench[gpu]')"
    if not torch.cuda.is_available():
        return "FlashAttention-4 needs a CUDA GPU; none is visible"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"FA4's paged forward needs sm_90 or newer; this GPU is sm_{major}{minor}"
    if not _IMPORT_PROBLEM:
        try:
            _interface()
        except Exception as e:
            _IMPORT_PROBLEM.append(f"flash_attn.cute does not import: {type(e).__name__}: {e}")
        else:
            _IMPORT_PROBLEM.append(None)
    return _IMPORT_PROBLEM[0]


# ---- limits ---------------------------------------------------------------------------------------
def case_reason(case) -> str | None:
    """Case-level limits of FA4's forward on SM90 (no GPU needed to decide)."""
    p = case.params
    if case.dtype not in ("bf16", "fp16"):
        return f"FA4 runs fp16/bf16 on SM90 (fp8 is SM100-only), not {case.dtype}"
    if p.mla:
        return "FA4's absorbed-MLA path (qv, head_dim_v 512) asserts Blackwell (SM100); not run on SM90"
    if getattr(p, "kv_dtype", "auto") != "auto":
        return f"FA4 reads fp16/bf16 KV caches on SM90 (fp8 is SM100-only), not {p.kv_dtype}"
    for name, d in (("head_dim", p.head_dim), ("head_dim_v", p.dv)):
        if not (8 <= d <= 256 and d % 8 == 0):
            return (
                f"FA4 on SM90 needs head dims in 8..256 divisible by 8 (interface._validate_head_dims), got {name} {d}"
            )
    if getattr(p, "mask", "causal") == "custom":
        return "custom masks are not wired to FA4 (its mask_mod callback is not used by this adapter)"
    ragged = case.op_name == "extend" and p.new_kv == "attend"
    if ragged and p.prefix_len > 0:
        return (
            "new_kv=attend with a prefix needs K/V from the cache (page_table) and from k_new "
            "(cu_seqlens_k) in one call; FA4 takes one source (page_table cannot combine with cu_seqlens_k)"
        )
    if not ragged and (p.head_dim % 16 or p.dv % 16):
        return (
            f"FA4's cp.async paged-KV loader asserts head dims that are multiples of 16 ('Paged KV does not "
            f"support irregular head dim'), got ({p.head_dim}, {p.dv})"
        )
    return None


def _on_cuda(backend, case) -> str | None:
    if not case.on_cuda:
        return f"FA4 runs on CUDA devices; this case is on {case.device}"
    return None


def _partial_pages_text(page_size: int) -> str:
    return (
        f"FA4 loads pages of {page_size} tokens (its key tile) by TMA and reads the rows past "
        "seqused_k of a partial last page, which must then be finite (flash_attn_varlen_func "
        "docstring); attnbench poisons them with NaN and checks they stay untouched"
    )


def partial_pages(case) -> str | None:
    """Paged cases whose pages FA4 loads by TMA (page_size == its key tile) with a partial last page.

    The tile is FA4's choice for the head dims and mask on the GPU's architecture (SM90 where no GPU
    is visible); without flash_attn installed there is no tile to ask for (the backend is unavailable).
    """
    p = case.params
    if case.op_name == "extend" and p.new_kv == "attend":
        return None  # ragged: K/V from k_new through cu_seqlens_k, no pages
    try:
        causal = getattr(p, "mask", "causal") != "bidirectional"
        tile_n = _tile_n(p.head_dim, p.dv, causal=causal and p.window < 0, local=p.window >= 0)
    except ImportError:
        return None
    seq_lens, _ = case.op.request_lengths(p, case.seed)
    return _partial_pages_text(p.page_size) if reads_partial_pages_by_tma(seq_lens, p.page_size, tile_n) else None


def _limits(backend, case) -> str | None:
    return case_reason(case) or partial_pages(case)


# ---- the backend ----------------------------------------------------------------------------------
def _arch_major() -> int:
    """The GPU's major architecture; 9 (SM90, where attnbench runs FA4) when no GPU is visible."""
    return torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 9


def _tile_n(head_dim: int, head_dim_v: int, causal: bool, local: bool) -> int:
    """FA4's key tile (the TMA page size) for this configuration on the current GPU."""
    if _arch_major() == 9:
        return _interface()._tile_size_fwd_sm90(head_dim, head_dim_v, causal, local).n_block_size
    return OTHER_ARCH_TILE_N


def _first_and_second_call(call, device: torch.device) -> tuple[float, float]:
    """(compile s, run s): the first call compiles (and runs), the second only runs."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sync()
    t0 = time.perf_counter()
    call()
    sync()
    t1 = time.perf_counter()
    call()
    sync()
    t2 = time.perf_counter()
    return max(0.0, (t1 - t0) - (t2 - t1)), t2 - t1


@register_backend("fa4")
class FlashAttention4(Backend):
    description = "FlashAttention-4 4.0.0b36 (CuTe DSL) forward over the paged cache: decode and extend"

    backend_limits = _on_cuda

    def available(self) -> str | None:
        return unavailable()

    @implements(
        "decode",
        limits=_limits,
        graph_safe=(
            "the dense page table is built in prepare from the batch's CSR table (a copy: a page table written in "
            "place never reaches it, and its width is batch A's longest request) and max_seqlen_k is batch A's host "
            "value"
        ),
    )
    def prepare_decode(self, case, x):
        return self._prepare(case, x, decode=True)

    @implements("extend", limits=_limits)
    def prepare_extend(self, case, x):
        return self._prepare(case, x, decode=False)

    def _prepare(self, case, x, *, decode: bool):
        _flash_attn_fwd = _interface()._flash_attn_fwd

        from attnbench.kernels.torch.attention import save_new_kv

        B, T = len(x.seq_lens_host), x.q.shape[0]
        Hq, D, Dv = x.q.shape[1], x.q.shape[2], x.v_cache.shape[3]
        left, right = window_size(x.window, x.causal)
        ragged = x.k_new is not None and not x.save_kv  # attend without prefixes (case_reason)
        common = dict(
            softmax_scale=x.sm_scale,
            causal=x.causal,
            softcap=x.soft_cap if x.soft_cap > 0 else None,
            window_size_left=left,
            window_size_right=right,
            learnable_sink=x.sinks,  # [Hq] fp32 logits; verified: "FA4 learnable_sink=s | sink is a logit"
            num_splits=1,  # SplitKV is not supported on SM90
            return_lse=True,
        )
        if not ragged:
            tile_n = _tile_n(D, Dv, causal=x.causal and x.window < 0, local=x.window >= 0)
            if reads_partial_pages_by_tma(list(x.seq_lens_host), x.page_size, tile_n):  # partial_pages() refused
                raise Unsupported(_partial_pages_text(x.page_size))
            table = page_table_from_csr(x.kv_indptr, x.kv_page_indices)
            paged = dict(page_table=table, seqused_k=x.seq_lens, max_seqlen_k=max(x.seq_lens_host), **common)

        if decode:
            q4, o4, lse3 = x.q.view(B, 1, Hq, D), x.o.view(B, 1, Hq, Dv), x.lse.view(B, Hq, 1)

            def call():
                _flash_attn_fwd(q4, x.k_cache, x.v_cache, out=o4, lse=lse3, **paged)

        else:
            lse_ht = torch.empty(Hq, T, dtype=torch.float32, device=x.q.device)
            varlen = dict(cu_seqlens_q=x.qo_indptr, max_seqlen_q=max(x.q_lens_host), out=x.o, lse=lse_ht)
            if ragged:
                kv = dict(cu_seqlens_k=x.qo_indptr, max_seqlen_k=max(x.q_lens_host), **common)

                def call():
                    _flash_attn_fwd(x.q, x.k_new, x.v_new, **varlen, **kv)

            else:

                def call():
                    if x.save_kv:
                        save_new_kv(x)
                    _flash_attn_fwd(x.q, x.k_cache, x.v_cache, **varlen, **paged)

        def run():
            call()
            if not decode:
                lse_heads_tokens_to_canonical(lse_ht, x.lse)
            return {"o": x.o, "lse": x.lse}

        compile_s, _ = _first_and_second_call(run, x.q.device)
        kind = "cu_seqlens_k (ragged)" if ragged else "page_table + seqused_k"
        run.info = {
            "jit_s": compile_s,
            "compile_s": compile_s,
            "plan_s": 0.0,
            "variant": f"_flash_attn_fwd, {'decode batch' if decode else 'cu_seqlens_q'}, {kind}",
        }
        return run
