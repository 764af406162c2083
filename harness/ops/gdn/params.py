"""Parameters of the GDN ops (semantics: harness/ops/gdn/__init__.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from attnbench.ops.base import (
    Params,
)


class GatingParams(Params):
    tokens: int = Field(64, ge=1, description="rows of a and b (tokens of the batch)")
    heads_v: int = Field(8, ge=1)


class ConvParams(Params):
    mode: Literal["prefill", "update", "verify"] = Field(
        "prefill", description="varlen prefill, one token each, or speculative verify (draft tokens each)"
    )
    batch: int = Field(2, ge=1)
    seq_len: int = Field(
        1, ge=1, description="prefill: tokens per request (the most, for mixed); update: 1; verify: draft tokens"
    )
    dim: int = Field(256, ge=1, description="channels: 2 H K + HV V of the model")
    width: int = Field(4, ge=2, le=4)
    lens: Literal["equal", "mixed"] = "equal"
    init: Literal["all", "none", "mixed"] = Field("all", description="which requests have an initial state")
    tree: bool = Field(False, description="verify: the draft tokens form a tree (parents array), not a chain")
    pad: int = Field(
        0, ge=0, description="update and verify: padding requests (cache index -1), a CUDA-graph-padded batch's"
    )

    @model_validator(mode="after")
    def _update(self):
        if self.mode == "update" and (self.seq_len != 1 or self.lens != "equal" or self.init != "all"):
            raise ValueError("mode update: one token per request, each with a state (seq_len 1, init all)")
        if self.mode == "verify" and (self.lens != "equal" or self.init != "all"):
            raise ValueError("mode verify: seq_len draft tokens per request, each from its state (init all)")
        if self.mode != "verify" and self.tree:
            raise ValueError("tree is a parameter of mode verify")
        if self.mode == "prefill" and self.pad:
            raise ValueError("pad is a parameter of modes update and verify (padded decode batches), not prefill")
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self


class GDNParams(Params):
    """Shared by gdn_decode, gdn_extend and gdn_verify."""

    batch: int = Field(4, ge=1)
    heads_qk: int = Field(4, ge=1, description="H: q/k heads")
    heads_v: int = Field(8, ge=1, description="HV: v-heads (a multiple of H)")
    head_dim_k: int = Field(128, ge=1)
    head_dim_v: int = Field(128, ge=1)
    scale: float | None = Field(None, gt=0.0, description="multiplies the normalised q; default K**-0.5")
    state_slots: int | None = Field(
        None,
        ge=1,
        description="slots in the state pool (default: the batch + ~12% spare): a production-size pool with every "
        "slot a request uses at its end, past 2^31 elements where it is that large (int32 offsets); the slots "
        "before are spare and NaN",
    )

    @model_validator(mode="after")
    def _heads(self):
        if self.heads_v % self.heads_qk:
            raise ValueError(f"heads_v ({self.heads_v}) must be a multiple of heads_qk ({self.heads_qk})")
        return self

    @property
    def q_scale(self) -> float:
        return self.head_dim_k**-0.5 if self.scale is None else self.scale


class GDNDecodeParams(GDNParams):
    pad: int = Field(0, ge=0, description="padding rows (state index -1) among the batch")
    packed: bool = Field(False, description="q, k, v come as one mixed_qkv [B, 2 H K + HV V] row per request")

    @model_validator(mode="after")
    def _pad(self):
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self


class GDNExtendParams(GDNParams):
    seq_len: int = Field(128, ge=1, description="tokens per request (the most, for mixed)")
    lens: Literal["equal", "mixed"] = "equal"
    init: Literal["all", "none", "mixed"] = Field("all", description="requests that start from a pool state")


class GDNCommitParams(Params):
    batch: int = Field(4, ge=1)
    draft: int = Field(4, ge=1, description="T: draft tokens per request of the verify before")
    heads_v: int = Field(8, ge=1, description="HV: v-heads")
    head_dim_k: int = Field(128, ge=1)
    head_dim_v: int = Field(128, ge=1)
    dim: int = Field(256, ge=1, description="conv channels: 2 H K + HV V of the model")
    width: int = Field(4, ge=2, le=4, description="conv width W (windows of W-1 raw inputs)")
    pad: int = Field(0, ge=0, description="padding requests (slot -1)")
    accept: Literal["mixed", "none", "all"] = Field(
        "mixed", description="accepted draft tokens per request: random 0..draft, none, or all"
    )

    @model_validator(mode="after")
    def _pad(self):
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self


class GDNVerifyParams(GDNParams):
    draft: int = Field(4, ge=1, description="T: draft tokens per request")
    tree: bool = Field(False, description="tokens form a tree (parents array), not a chain")
    pad: int = Field(0, ge=0, description="padding requests (state index -1)")

    @model_validator(mode="after")
    def _pad(self):
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self
