"""Our Triton backend: the attention family (paged decode, extend, merge_state), the spec ops
(tree_verify through extend, EAGLE tree building, greedy verification) and the GDN family.

Two registered names:

- `triton`: decode splits planned from the SM count, the batch, the heads and the lengths; every op.
- `triton-det`: the deterministic (batch-invariant) decode: fixed splits of 256 keys, so a request's
  output and LSE do not depend on which other requests share its batch. Extend always takes the
  unsplit, unpacked path there (one program per query tile and head: batch-invariant; whether
  `triton` splits extend's keys or packs its GQA heads depends on the whole batch), and merge_state
  is the same kernel. It runs the attention ops only (the spec and GDN kernels have no split to fix).

Kernels live in decode.py, extend.py (its plan: extend_plan.py), merge.py, spec.py and gdn*.py (kernel -> launcher -> public function); the
schedule (splits, query tiles) and scratch buffers are built in `prepare`, never in the timed call.
On Hopper (compiled, not interpreted) three Gluon kernels take the cases they fit, each falling back to the
Triton kernel with the reason: absorbed-MLA decode by decode_mla_ws.py (warp-specialized; knob `mla_kernel`,
decode_mla_gluon.py its non-specialized variant) and prefill / extend over a paged prefix by prefill_ws.py
(knobs `extend_kernel`, `prefill_stages`, `prefill_persistent`; the fast backend where prefill_ws.PrefillPolicy finds it faster).
Triton is imported lazily, so this package imports without it. Design notes: NOTES.md.

fp8 KV caches (`kv_dtype` fp8_e4m3/fp8_e5m2, per-tensor or per-head scales) are read by decode and
extend (MLA and tree_verify included) for bf16, fp16 and fp32 queries.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

from attnbench.backend import Backend, Knob, implements, register_backend
from attnbench.kernels.triton.gdn_backend import TritonGDN
from attnbench.kernels.triton.limits import (  # noqa: F401
    EXTEND_KNOBS,
    GDN_HEAD_GROUPS,
    GDN_STREAM_COLS,
    GDN_STREAM_TILES,
    GDN_VK_TILES,
    MAX_DK,
    MAX_DV,
    attention_head_dims,
    interpreting,
    on_device,
)
from attnbench.kernels.triton.spec_backend import TritonSpec

DETERMINISTIC_SPLIT_TILE = 256
MLA_DETERMINISTIC_SPLIT_TILE = 2048  # the generic planner's deterministic MLA tile (head dims only)
SPLIT_POLICY_KNOBS = ("min_split", "fill_ctas", "fill_keys", "step_keys")  # decode.SplitPolicy's fields
DECODE_TILE_KNOBS = {"block_n": "block_n", "decode_warps": "num_warps", "decode_stages": "num_stages"}  # DecodeConfig's
MERGE_KNOBS = {"fused_merge": "fused_merge", "decode_pdl": "pdl"}  # DecodeConfig's and MLAConfig's (booleans)
# why decode's closure may not be replayed in a CUDA graph on another batch (the replay check, docs/replay.md)
PLANNED_SPLITS = (
    "the split schedule (work items, grid, merge table) is planned in prepare from the batch's host-side lengths: "
    "a graph replays batch A's key ranges"
)


def _triton_missing() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    try:
        import triton  # noqa: F401
    except Exception as e:  # a broken install is a reason, not a crash
        return f"triton does not import: {type(e).__name__}: {e}"
    return None


def _merge_fields(knobs: dict) -> dict:
    """The config fields the merge knobs set (`MERGE_KNOBS`), as booleans."""
    return {field: bool(knobs[k]) for k, field in MERGE_KNOBS.items() if k in knobs}


class _TritonAttention(Backend):
    deterministic = False
    backend_limits = on_device
    knobs = {
        "split_keys": Knob("decode: fixed keys per KV split (default: planned from the SM count)",
                           (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)),
        "block_n": Knob("decode: keys per stage-1 step (default: by head dims)", (16, 32, 64, 128)),
        "decode_warps": Knob("decode: warps per stage-1 program (default 4, 8 for MLA sizes; fixes the tiling, no "
                             "tuning)", (2, 4, 8)),
        "decode_stages": Knob("decode: software-pipelining stages of stage 1 (default 3 on sm_80+; fixes the "
                              "tiling, no tuning)", (1, 2, 3, 4, 5)),
        "fused_merge": Knob("decode: KV splits merged by their last split program, one launch (1), or by a "
                            "second kernel (0) (default: DecodeConfig's)", (0, 1)),
        "decode_pdl": Knob("decode (MLA too): the merge kernel launched as a programmatic dependent of the split "
                           "kernel (1; Hopper's PDL, compiled kernels on sm_90+) or after it (0); default 1 for GQA/MHA "
                           "decode, 0 for MLA", (0, 1)),
        "mla_kernel": Knob("MLA decode: ws (Gluon, warp-specialized; the default on Hopper where it applies), "
                           "wgmma (Gluon, two warpgroups side by side) or triton (the Triton MLA kernel)",
                           ("ws", "wgmma", "triton")),
        # decode's split rule (decode.SplitPolicy; not the MLA kernel's, which weighs its own partials); the
        # tuner times its tilings under the knob's rule (decode.tuned_decode_config)
        "min_split": Knob("decode: the shortest KV split of the default plan, keys (default 256)",
                          (64, 128, 256, 512, 1024, 2048)),
        "fill_ctas": Knob("decode: programs per SM aimed at while the unsplit batch runs fewer (default 2)", (1, 2, 3, 4)),
        "fill_keys": Knob("decode: the shortest split worth a second program per SM, keys (default 512 where "
                          "the merge is PDL-launched, else 1024)",
                          (256, 512, 1024, 2048, 4096)),
        "step_keys": Knob("decode: a program's fixed cost in keys when split counts are weighed (default 128)",
                          (0, 64, 128, 256, 512)),
        "extend_kernel": Knob("extend: ws (the warp-specialized Gluon prefill of prefill_ws.py wherever it applies on "
                              "Hopper) or triton (extend.py's kernel everywhere); default: ws where "
                              "prefill_ws.PrefillPolicy finds it faster (triton-det: wherever it applies)",
                              ("ws", "triton")),
        "prefill_stages": Knob("extend: K/V ring stages of the Gluon prefill (default 2)", (2, 3)),
        "prefill_persistent": Knob("extend: the Gluon prefill as one program per SM walking the (tile, head) items "
                                   "heaviest first (1), or one program per item (0, default)", (0, 1)),
        # extend (prefill): values from limits.EXTEND_KNOBS, applied by extend_plan.with_extend_knobs
        "extend_tma": Knob("extend: new-token K/V blocks (and whole-page cache blocks) by TMA tensor descriptor "
                           "(1) or by pointers (0, default); the tuner times TMA tilings", EXTEND_KNOBS["extend_tma"]),
        "extend_persistent": Knob("extend: one program per SM walking the tiles heaviest first (1) or one "
                                  "program per tile and head (0, default)", EXTEND_KNOBS["extend_persistent"]),
        "extend_block_n": Knob("extend: keys per step (default: by head dims; fixes the tiling, no tuning)",
                               EXTEND_KNOBS["extend_block_n"]),
        "extend_stages": Knob("extend: software-pipelining stages (default: by head dims; fixes the tiling)",
                              EXTEND_KNOBS["extend_stages"]),
        # gdn_decode / gdn_verify variants (gdn.RecurrentConfig, gdn_backend.recurrent_config; gdn_verify
        # defaults to gdn_verify_reg=1,gdn_preload=1 (gdn_backend.VERIFY_KNOBS), gdn_decode to the default kernel)
        "gdn_verify_reg": Knob("gdn_verify: a tree step keeps the state in registers when its parent is the previous "
                               "step, reloading only another parent (1, default), or reloads every step (0)", (0, 1)),
        "gdn_preload": Knob("gdn_decode/gdn_verify: q/k/v and gates of all steps loaded before the step loop (1; "
                            "default for gdn_verify)", (0, 1)),
        "gdn_inter_store": Knob("gdn_verify: cache policy of the per-step state stores (default: none)",
                                ("evict_first", "cs")),
        "gdn_bv": Knob("gdn_decode/gdn_verify: value columns per program (fixes the tile, no tuning)",
                       (8, 16, 32, 64, 128)),
        "gdn_warps": Knob("gdn_decode/gdn_verify: warps per program (fixes the tile, no tuning)", (1, 2, 4, 8, 16)),
        "gdn_stages": Knob("gdn_decode/gdn_verify: software-pipelining stages (fixes the tile, no tuning)",
                           (1, 2, 3, 4)),
        "gdn_stream": Knob("gdn_decode: the streamed kernel (gdn_decode_stream.py), this many value columns per "
                           "program, walked in tiles with the next tile's state in flight (slower than the default on an "
                           "H200: 1.16-3.3x, h200-session24/gdnd)", GDN_STREAM_COLS),
        "gdn_stream_bv": Knob("gdn_decode: the streamed kernel's columns per step (default 16; alone: 128 columns "
                              "per program)", GDN_STREAM_TILES),
        "gdn_vk": Knob("gdn_decode: the K-last kernel's value rows per program (gdn_decode_vk.py; default 8, warps "
                       "from gdn_warps, default 1: 0.98 of FlashInfer on an H200, h200-session25/gdntile); beside "
                       "gdn_layout=kv it runs on a K-last copy of the pool made in prepare", GDN_VK_TILES),
        "gdn_groups": Knob("gdn_extend: v-head groups, each group's serial state pass and output kernel on a stream "
                           "of its own while the next groups' chunk-parallel kernels run (default 1: every kernel "
                           "over all heads, one stream; slower on an H200: G=2 1.03x, G=4 1.15x the default, "
                           "h200-session26/gdngroups)", GDN_HEAD_GROUPS),
        "gdn_state_regs": Knob("gdn_extend: the serial state pass on the transposed state, whose products take the "
                               "state as their register operand (1), or on S as the tensor cores' shared-memory "
                               "operand (0, default); not with the fused-output variants; slower on an H200: 1.02-1.20x the default, "
                               "h200-session27/regs)", (0, 1)),
        "gdn_out": Knob("gdn_extend: the output kernel's tuner weighs only configs that compute a program's "
                        "columns in one block (narrow), not also 128 columns in two blocks of 64 (default; 4-5% "
                        "faster on an H200, h200-session28/extend2)", ("narrow",)),
        "gdn_layout": Knob("gdn_decode/verify/commit/extend: the state pool layout the kernels address, vk "
                           "([N, HV, V, K], K-last, default: as SGLang, vLLM and FlashInfer keep it; a canonical pool "
                           "is converted in prepare, untimed; gdn_decode runs the K-last kernel, gdn_vk rows, default "
                           "8 on gdn_warps 1) or kv ([N, HV, K, V], canonical; gdn_decode on the tuned canonical "
                           "kernel)", ("vk", "kv")),
        "gdn_tune": Knob("gdn_decode/gdn_verify: autotune over the default configs plus 1-/2-warp tiles and "
                         "stage counts (wide)", ("wide",)),
    }  # fmt: skip

    def available(self) -> str | None:
        missing = _triton_missing()
        if missing:
            return missing
        import torch

        if not torch.cuda.is_available() and not interpreting():
            return "no CUDA device (set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)"
        return None

    @implements("decode", limits=attention_head_dims, graph_safe=PLANNED_SPLITS)
    def prepare_decode(self, case, x):
        from attnbench.kernels.triton import decode as d
        from attnbench.kernels.triton.common import first_that_fits

        # the deterministic variant keeps the fixed heuristic: a timing-dependent choice would make
        # its results depend on the process; knob settings (split_keys, block_n) replace the tuning
        knobs = self.settings
        mla = self.mla_decode(x, knobs)
        if mla is not None:
            return mla
        policy_knobs = {k: v for k, v in knobs.items() if k in SPLIT_POLICY_KNOBS}
        if "fill_keys" in policy_knobs:  # one value, whether the merge overlaps the splits or not
            policy_knobs["fill_keys_overlapped"] = policy_knobs["fill_keys"]
        policy = replace(d.SPLITS, **policy_knobs)
        # knobs that fix the tiling or the splits turn the tuner off; a split rule's knobs (SplitPolicy) keep
        # it on, its candidates planned under that rule, so `triton` and `triton:fill_keys=512` differ in
        # the rule alone
        tiling = {k: v for k, v in knobs.items() if k in ("split_keys", *DECODE_TILE_KNOBS)}
        config, tuned = (None, {}) if self.deterministic or tiling else d.tuned_decode_config(x, policy)
        if tile := {field: knobs[k] for k, field in DECODE_TILE_KNOBS.items() if k in knobs}:
            config = replace(d.default_decode_config(x), **tile)
        if merging := _merge_fields(knobs):  # the tuner's tiling (or the heuristic's), merged as the knobs say
            config = replace(config or d.default_decode_config(x), **merging)
        plans = {}

        def build(cfg):
            fixed = self.deterministic or "split_keys" in knobs
            det = dict(deterministic=fixed, split_tile=knobs.get("split_keys", DETERMINISTIC_SPLIT_TILE))
            plans[cfg] = d.plan_decode(x, config=cfg, policy=policy, **det)
            return d.bind_decode(x, plans[cfg])

        run, config, shrunk = first_that_fits(
            config or d.default_decode_config(x), d.shrink_decode_config, build, x.q.device
        )
        plan = plans[config]
        run.info = {
            "max_splits": max(plan.splits),
            "work_items": int(plan.work.shape[0]),
            "config": vars(config) | {"two_stage": plan.merge is not None and not plan.fused},
            **tuned,
            **({"did_not_fit": shrunk} if shrunk else {}),
        }
        return run

    def mla_decode(self, x, knobs):
        """The absorbed-MLA decode kernel (decode_mla.py) where it applies (None: the generic kernel runs;
        always under a `block_n`, `decode_warps` or `decode_stages` knob, which size the generic kernel)."""
        from attnbench.kernels.triton import decode_mla as m
        from attnbench.kernels.triton.common import arch

        if any(k in knobs for k in DECODE_TILE_KNOBS):
            return None
        cfg = m.mla_config(x.q.shape[1], x.k_cache.shape[1], arch(x.q.device))
        cfg = replace(cfg, **_merge_fields(knobs))
        if "mla_kernel" in knobs:
            cfg = replace(cfg, impl=knobs["mla_kernel"])
        if m.mla_unsupported(x, cfg):
            return None
        fixed = self.deterministic or "split_keys" in knobs
        plan = m.plan_mla_decode(
            x, config=cfg, deterministic=fixed, split_tile=knobs.get("split_keys", MLA_DETERMINISTIC_SPLIT_TILE)
        )
        run = m.bind_mla_decode(x, plan)
        run.info = {
            "kernel": "mla" if plan.config.impl == "triton" else f"mla-{plan.config.impl}",
            "max_splits": max(plan.splits),
            "work_items": int(plan.work.shape[0]),
            "config": vars(plan.config) | {"two_stage": plan.merge is not None and not plan.fused},
        }
        return run

    @implements("extend", limits=attention_head_dims)
    def prepare_extend(self, case, x):
        from attnbench.errors import Unsupported
        from attnbench.kernels.triton import extend as e
        from attnbench.kernels.triton import extend_plan as ep
        from attnbench.kernels.triton.common import first_that_fits

        knobs = {k: v for k, v in self.settings.items() if k.startswith("extend_") and k != "extend_kernel"}
        ws_why = "knobs" if knobs else "extend_kernel=triton"
        if not knobs and self.settings.get("extend_kernel") != "triton":
            ws_why = self.prefill_ws(x)
            if not isinstance(ws_why, str):
                return ws_why
        variants = dict(use_tma=bool(knobs.get("extend_tma")), persistent=bool(knobs.get("extend_persistent")))
        fixed = self.deterministic or ep.tiling_knobs(knobs)
        config, tuned = (None, {}) if fixed else e.tuned_extend_config(x, **variants)
        config = ep.with_extend_knobs(config or ep.default_extend_config(x, self.deterministic), knobs)
        plans = {}

        def build(cfg):
            plans[cfg] = ep.plan_extend(x, config=cfg, deterministic=self.deterministic)
            return e.bind_extend(x, plans[cfg])

        try:
            run, config, shrunk = first_that_fits(config, ep.shrink_extend_config, build, x.q.device)
        except ep.TMAUnavailable as err:
            raise Unsupported(str(err)) from None
        plan = plans[config]
        run.info = {
            "tiles": int(plan.tiles.shape[0]),  # split path: work items (tile x key split)
            "gqa_heads": plan.meta["HEADS"],  # query heads packed per token of a tile (1: unpacked)
            **({"kv_splits": plan.splits, "two_stage": plan.merge is not None} if plan.meta["SPLIT"] else {}),
            "config": vars(config),
            **({"tma": sorted(k for k in plan.extra if k.endswith("_desc"))} if config.use_tma else {}),
            **({"grid": plan.grid[0]} if config.persistent else {}),
            **tuned,
            **({"did_not_fit": shrunk} if shrunk else {}),
            "not_prefill_ws": ws_why,
        }
        return run

    def prefill_ws(self, x):
        """The warp-specialized Gluon prefill (prefill_ws.py) where it applies: Hopper, compiled, and
        `prefill_unsupported` says yes (else why not, and extend.py's kernel runs). Batch-invariant: one program per
        (128-row tile, head), no key splits, keys in the same blocks whatever the batch, so triton-det takes
        it wherever it applies; the fast backend where `prefill_declined` (PrefillPolicy) finds it faster,
        unless the knob `extend_kernel=ws` asks for it wherever it applies."""
        from attnbench.kernels.triton.common import arch

        if interpreting() or arch(x.q.device) != 90:
            return "not compiled for Hopper"
        from attnbench.kernels.triton import prefill_ws as p
        from attnbench.kernels.triton.common import bind_launches

        why = p.prefill_unsupported(x)
        if why:
            return why
        tiles = p.plan_prefill(x)
        if not self.deterministic and self.settings.get("extend_kernel") != "ws":
            why = p.prefill_declined(x, tiles)
            if why:
                return why
        stages = int(self.settings.get("prefill_stages", 2))
        persistent = bool(int(self.settings.get("prefill_persistent", 0)))
        attend = bind_launches(p.prefill_launches(x, tiles, stages, persistent), {"o": x.o, "lse": x.lse})
        if x.save_kv:  # the new tokens into their cache slots first (index_put), as the peers' adapters do
            from attnbench.kernels.torch.attention import save_new_kv

            def run():
                save_new_kv(x)
                return attend()
        else:
            run = attend
        run.info = {"kernel": "prefill-ws", "tiles": int(tiles.shape[0]), "stages": stages, "persistent": persistent,
                    "save_kv": "index_put" if x.save_kv else ""}  # fmt: skip
        return run

    @implements("merge_state")
    def prepare_merge_state(self, case, x):
        from attnbench.kernels.triton.merge import bind_merge_state

        call = bind_merge_state(x.v_a, x.s_a, x.v_b, x.s_b, x.o, x.lse)
        out = {"o": x.o, "lse": x.lse}

        def run():
            call()
            return out

        return run


@register_backend("triton")
class TritonBackend(TritonSpec, TritonGDN, _TritonAttention):
    description = "our Triton kernels: split-KV decode (splits from the SM count), FA2-style extend, merge"


@register_backend("triton-det")
class TritonDeterministicBackend(_TritonAttention):
    description = f"our Triton kernels, batch-invariant decode (fixed {DETERMINISTIC_SPLIT_TILE}-key splits)"
    deterministic = True
