"""The op registry: every op contract by the name suites and results use."""

from __future__ import annotations

from attnbench.errors import AttnbenchError
from attnbench.ops.attention import DecodeOp, ExtendOp, MergeStateOp
from attnbench.ops.base import IdField, Op, OutputSpec, Params
from attnbench.ops.gdn import CausalConv1dOp, GDNCommitOp, GDNDecodeOp, GDNExtendOp, GDNGatingOp, GDNVerifyOp
from attnbench.ops.gdn_chain import GDNChainOp
from attnbench.ops.spec import EagleBuildTreeOp, TreeVerifyOp, VerifyGreedyOp

OPS: dict[str, Op] = {
    op.name: op
    for op in (
        DecodeOp(),
        ExtendOp(),
        MergeStateOp(),
        TreeVerifyOp(),
        EagleBuildTreeOp(),
        VerifyGreedyOp(),
        GDNGatingOp(),
        CausalConv1dOp(),
        GDNDecodeOp(),
        GDNExtendOp(),
        GDNVerifyOp(),
        GDNCommitOp(),
        GDNChainOp(),
    )
}


def get_op(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise AttnbenchError(f"unknown op {name!r}; available: {', '.join(sorted(OPS))}") from None


__all__ = ["OPS", "get_op", "Op", "OutputSpec", "Params", "IdField"]
