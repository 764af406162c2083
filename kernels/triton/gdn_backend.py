"""`TritonGDN`: the GDN ops of the `triton` backend, as a mixin for its Backend class.

Each `prepare_gdn_*` does the host-side work (the chunk plan and workspaces of gdn_extend, contiguity
checks) and returns the closure that launches our own kernels (kernels/triton/gdn*.py).
"""

from __future__ import annotations

from attnbench.backend import implements

MAX_EXTEND_HEAD_DIM = 256  # gdn_extend's chunk kernels hold a K x V state block of at most 256 x 256


def extend_head_dims(backend, case) -> str | None:
    p = case.params
    if p.head_dim_k > MAX_EXTEND_HEAD_DIM or p.head_dim_v > MAX_EXTEND_HEAD_DIM:
        return f"triton gdn_extend supports head dims up to {MAX_EXTEND_HEAD_DIM}"
    return None


# the `gdn_*` knobs of the triton backend (kernels/triton/__init__.py) -> gdn.RecurrentConfig's fields
RECURRENT_KNOBS = ("gdn_verify_reg", "gdn_preload", "gdn_inter_store", "gdn_bv", "gdn_warps", "gdn_stages", "gdn_tune")
DEFAULT_TILE = (32, 4, 3)  # (BV, num_warps, num_stages): the first of the default kernel's configs


# gdn_verify's defaults: the state kept in registers along previous-step edges, every step's inputs
# loaded before the step loop. H100 (reports/examples/h100-session17/gdnv): tree verify b32 t4 168.4 ->
# 131.6 us (SGLang 129.1); decode (one step) unchanged, so it keeps the default kernel.
VERIFY_KNOBS = {"gdn_verify_reg": 1, "gdn_preload": 1}


def gdn_layout(backend) -> str:
    """The pool layout the variant's GDN state kernels address (`gdn_layout` knob): "vk" K-last
    `[N, HV, V, K]` (default), the layout SGLang's, vLLM's and FlashInfer's kernels keep, so a server holds
    one pool for our decode, verify, commit and extend and theirs; or "kv" canonical `[N, HV, K, V]`. A
    canonical pool handed in (any sweep row outside a gdn_chain) is converted in prepare and written back in
    finalize, untimed, as the K-last adapters do (kernels/native_states.py). A variant that sets a knob
    of the canonical-pool kernels (`CANONICAL_KNOBS`) and no layout gets "kv", where those knobs were
    measured, so each keeps meaning what it says."""
    settings = backend.settings
    if "gdn_layout" in settings:
        return settings["gdn_layout"]
    return "kv" if any(k in settings for k in CANONICAL_KNOBS) else "vk"


# knobs that choose gdn_decode's canonical-pool kernel (the streamed one) or its tile: the K-last decode has
# neither (its tile: gdn_vk rows on gdn_warps)
CANONICAL_DECODE_KNOBS = ("gdn_stream", "gdn_bv", "gdn_stages", "gdn_tune", "gdn_preload")
# knobs of the canonical-pool recurrence (decode and verify) and the streamed decode: a variant that sets one
# stays on the canonical pool unless it names gdn_layout
CANONICAL_KNOBS = ("gdn_stream", *(k for k in RECURRENT_KNOBS if k != "gdn_warps"))


def gdn_decode_limits(backend, case) -> str | None:
    """The canonical decode kernels' knobs mean nothing to the K-last decode: refuse them beside an
    explicit gdn_layout=vk rather than ignore them."""
    if gdn_layout(backend) == "vk" and (knobs := [k for k in CANONICAL_DECODE_KNOBS if k in backend.settings]):
        verb = "chooses" if len(knobs) == 1 else "choose"
        return (f"{', '.join(knobs)} {verb} the canonical-pool decode; gdn_layout=vk decodes with the K-last "
                "kernel (tile: gdn_vk, gdn_warps)")  # fmt: skip
    return None


def pool_in_layout(x, layout: str):
    """(the pool the kernels of `layout` run on, the `finalize` that writes it back or None): the canonical
    pool itself for "kv"; for "vk" the K-last pool and its write-back (`native_pool_written_back`: a
    canonical pool converted here, untimed; a pool a gdn_chain hands over K-last used as it is)."""
    from attnbench.kernels import native_states as states

    return states.native_pool_written_back(x) if layout == "vk" else (x.state_pool, None)


# the K-last decode kernel's program under gdn_layout=vk, unless gdn_vk / gdn_warps set it: 8 value rows on one
# warp, the fastest measured (H200, reports/examples/h200-session25/gdntile: 272.6 us at B256 H32, FlashInfer 266.4)
VK_DECODE_TILE = {"bv": 8, "num_warps": 1}


def recurrent_config(settings: dict, defaults: dict | None = None):
    """The gdn_decode / gdn_verify variant that the `gdn_*` knobs in `settings` choose over `defaults`
    (knob values; `VERIFY_KNOBS` for gdn_verify): a frozen `gdn.RecurrentConfig`, or None where neither
    sets a knob (the default kernel runs, untouched). A tile knob (`gdn_bv`, `gdn_warps`, `gdn_stages`)
    fixes the tile, the others taken from `DEFAULT_TILE`, and turns autotuning off (`gdn_tune` then has
    nothing to choose)."""
    from attnbench.kernels.triton.gdn import RecurrentConfig

    knobs = (defaults or {}) | {k: v for k, v in settings.items() if k in RECURRENT_KNOBS}
    if not knobs:
        return None
    tiled = [knobs.get(k) for k in ("gdn_bv", "gdn_warps", "gdn_stages")]
    tile = tuple(v if v is not None else d for v, d in zip(tiled, DEFAULT_TILE)) if any(tiled) else None
    return RecurrentConfig(
        carry="reg" if knobs.get("gdn_verify_reg") else "reload",
        preload=bool(knobs.get("gdn_preload")),
        inter_store=knobs.get("gdn_inter_store", ""),
        tile=tile,
        tune=knobs.get("gdn_tune", ""),
    )


def stream_config(settings: dict) -> dict | None:
    """gdn_decode's streamed kernel (kernels/triton/gdn_decode_stream.py) where `gdn_stream` (columns per
    program) or `gdn_stream_bv` (columns per step) is set: its keyword arguments; None otherwise."""
    if "gdn_stream" not in settings and "gdn_stream_bv" not in settings:
        return None
    return {
        "cols": settings.get("gdn_stream", 128),
        "bv": settings.get("gdn_stream_bv", 16),
        "num_warps": settings.get("gdn_warps", 4),
    }


def _record_tile(run, config):
    """A `finalize` (after every checked call, never timed) that puts the autotuned tile the call ran with
    into the row's record (`run.info["tuned_tile"]`)."""
    from attnbench.kernels.triton.gdn import tuned_tile

    def finalize(outputs):
        if tile := tuned_tile(config):
            run.info["tuned_tile"] = tile
        return outputs

    return finalize


def recurrent_info(config) -> dict:
    """run.info's record of the variant (nothing for the default kernel)."""
    return {} if config is None else {"recurrent": {k: v for k, v in vars(config).items()}}


class TritonGDN:
    """Mixin: gdn_gating, causal_conv1d (prefill, update, verify), gdn_decode (plain and packed), gdn_extend,
    gdn_verify, gdn_commit.

    `gdn_tri`: the T kernel's frozen knobs (`gdn_chunk.TriConfig`; None: the default), which variant
    backends (plugins) set; kernels/triton/NOTES.md."""

    gdn_tri = None
    gdn_fuse_out = ""

    @implements("gdn_gating")
    def prepare_gdn_gating(self, case, x):
        from attnbench.kernels.triton.gdn import gdn_gating

        def run():
            gdn_gating(x.A_log, x.a, x.b, x.dt_bias, x.g, x.beta)
            return {"g": x.g, "beta": x.beta}

        return run

    @implements("causal_conv1d")
    def prepare_causal_conv1d(self, case, x):
        from attnbench.kernels.triton.gdn_conv import causal_conv1d_fn, causal_conv1d_update, causal_conv1d_verify

        if x.verify:

            def run():
                causal_conv1d_verify(
                    x.x, x.weight, x.bias, x.conv_states, x.cache_indices, x.intermediate_conv_windows, x.y,
                    x.parents,
                )  # fmt: skip
                return {"y": x.y, "intermediate_conv_windows": x.intermediate_conv_windows}

            return run
        if x.update:

            def run():
                causal_conv1d_update(x.x, x.weight, x.bias, x.conv_states, x.cache_indices, x.y)
                return {"y": x.y}

            return run
        max_len = max(x.lens_host)

        def run():
            causal_conv1d_fn(
                x.x, x.weight, x.bias, x.conv_states, x.cache_indices, x.has_initial_state, x.query_start_loc,
                x.y, max_len,
            )  # fmt: skip
            return {"y": x.y}

        return run

    @implements("gdn_decode", limits=gdn_decode_limits, state_layout=gdn_layout, graph_safe=True)
    def prepare_gdn_decode(self, case, x):
        from attnbench.kernels.triton.gdn import gdn_recurrent

        packed = x.mixed_qkv is not None
        info = {"variant": "packed: q/k/v read in place from mixed_qkv" if packed else "recurrent"}
        if stream := stream_config(self.settings):
            return self._gdn_decode_stream(x, stream, info)
        if "gdn_vk" in self.settings or gdn_layout(self) == "vk":
            return self._gdn_decode_vk(x, info)
        config = recurrent_config(self.settings)

        def run():
            gdn_recurrent(
                x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.state_pool, x.state_indices, x.o, scale=x.scale,
                config=config,
            )  # fmt: skip
            return {"o": x.o}

        run.info = info | recurrent_info(config)
        run.finalize = _record_tile(run, config)
        return run

    def _gdn_decode_stream(self, x, stream: dict, info: dict):
        from attnbench.kernels.triton.gdn_decode_stream import gdn_decode_stream

        def run():
            gdn_decode_stream(
                x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.state_pool, x.state_indices, x.o, scale=x.scale,
                **stream,
            )  # fmt: skip
            return {"o": x.o}

        run.info = info | {"stream": stream}
        return run

    def _gdn_decode_vk(self, x, info: dict):
        from attnbench.kernels import native_states as states
        from attnbench.kernels.triton.gdn_decode_vk import gdn_decode_vk

        pool, finalize = states.native_pool_written_back(x)  # K-last, converted here once (untimed)
        tile = {"bv": self.settings.get("gdn_vk", VK_DECODE_TILE["bv"]),
                "num_warps": self.settings.get("gdn_warps", VK_DECODE_TILE["num_warps"])}  # fmt: skip

        def run():
            gdn_decode_vk(
                x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pool, x.state_indices, x.o, scale=x.scale, **tile
            )  # fmt: skip
            return {"o": x.o}

        run.finalize = finalize
        run.info = info | {"k_last": tile}
        return run

    @implements("gdn_verify", state_layout=gdn_layout, graph_safe=True)
    def prepare_gdn_verify(self, case, x):
        from attnbench.kernels import native_states as states
        from attnbench.kernels.triton.gdn import gdn_recurrent

        config = recurrent_config(self.settings, VERIFY_KNOBS)
        layout = gdn_layout(self)
        if layout == "kv":
            pool, inter = x.state_pool, x.inter_states
        else:  # the pool read K-last and the intermediate states written K-last (as SGLang's verify writes
            # them), made canonical after the call, untimed; verify leaves the pool alone: nothing to write back
            pool, inter = states.native_pool(x)[0], states.state_v_major(x.inter_states)

        def run():
            gdn_recurrent(
                x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pool, x.state_indices, x.o,
                scale=x.scale, steps=x.draft, inter=inter, parents=x.parents, config=config, pool_layout=layout,
            )  # fmt: skip
            return {"o": x.o, "inter_states": inter}

        record = _record_tile(run, config)

        def finalize(outputs):
            if inter is not x.inter_states:
                outputs = outputs | {"inter_states": states.state_canonical_(x.inter_states, inter)}
            return record(outputs)

        run.info = recurrent_info(config)
        run.finalize = finalize
        return run

    @implements("gdn_commit", state_layout=gdn_layout)
    def prepare_gdn_commit(self, case, x):
        from attnbench.kernels.triton.gdn_commit import gdn_commit

        layout = gdn_layout(self)
        pool, finalize = pool_in_layout(x, layout)

        def run():
            gdn_commit(
                x.inter_states, x.inter_conv_windows, x.last_accepted, pool, x.conv_states, x.state_indices,
                pool_layout=layout,
            )  # fmt: skip
            return {}

        if finalize is not None:
            run.finalize = finalize
        return run

    @implements("gdn_extend", limits=extend_head_dims, state_layout=gdn_layout)
    def prepare_gdn_extend(self, case, x):
        groups = 1 if self.gdn_fuse_out else self.settings.get("gdn_groups", 1)
        regs = bool(self.settings.get("gdn_state_regs", 0))
        out = self.settings.get("gdn_out", "")
        return prepare_gdn_extend(case, x, self.gdn_tri, self.gdn_fuse_out, groups, gdn_layout(self), regs, out)


def prepare_gdn_extend(case, x, tri=None, fuse_out="", groups=1, layout="kv", state_regs=False, out_tune=""):
    """The chunked prefill: the chunk plan and workspaces are built here, the closure launches the
    kernels of gdn_chunk.py. `tri`: a frozen `gdn_chunk.TriConfig` for bf16/fp16 (None: `gdn_chunk.TRI`);
    `fuse_out`: "" a separate output kernel; "tri" / "loop" the output inside the state recurrence (no H / U'
    round trip), its q^ k^T block from the T kernel or computed in the loop (`gdn_chunk.plan`); `groups`:
    v-head groups whose state pass overlaps the next group's chunk-parallel kernels (`gdn_chunk.plan`);
    `layout`: the pool layout the kernels address (`gdn_layout`); `state_regs`: the state pass on the
    transposed state (`gdn_chunk._chunk_state_regs_kernel`, separate output kernel only); `out_tune`: the
    output kernel's configs (`gdn_chunk.OUT_TUNED`; "": `gdn_chunk.out_tune_for` the inputs' dtype)."""
    from attnbench.kernels.triton.gdn_chunk import TRI, chunk_gated_delta_rule, out_tune_for, plan

    tri = tri or TRI
    K, V = x.q.shape[2], x.v.shape[2]
    out_tune = out_tune_for(x.q.dtype, out_tune)
    p = plan(list(x.lens_host), x.q.shape[1], x.v.shape[1], K, V, x.q.dtype, x.q.device, fuse_out, tri, groups)

    pool, finalize = pool_in_layout(x, layout)

    def run():
        chunk_gated_delta_rule(
            x.q, x.k, x.v, x.g, x.beta, pool, x.state_indices, x.has_initial_state, x.cu_seqlens,
            x.o, p, scale=x.scale, tri=tri, pool_layout=layout, state_regs=state_regs, out_tune=out_tune,
        )  # fmt: skip
        return {"o": x.o}

    if finalize is not None:
        run.finalize = finalize

    run.info = {"chunk": 64, "chunks": int(p.chunks.shape[0]), "fuse_out": fuse_out, "head_groups": p.groups,
                "state_regs": state_regs, "out_tune": out_tune}  # fmt: skip
    return run
