"""The replay check with real CUDA graphs (docs/replay.md): the mutant fails, the graph-safe kernels pass.

python -m pytest -m gpu tests/harness/test_replay_gpu.py -v      # < 1 minute on one H100/H200
"""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.mutants.replay import BakedLengthDecode, GraphSafeDecode
from attnbench.run.runner import RunOptions, run_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU"),
]

DECODES = (
    "decode/b8-l1000-mixed-h16x2-d64-p16-bf16",
    "decode/b4-l300-h16x1-d576x512-p64-mla-scale0.1352337788608801-bf16",
    "decode/b8-l1000-mixed-h8x2-d64-p16-swa127-sink-bf16",
)


@pytest.mark.parametrize("case_id", DECODES)
def test_a_graph_replays_the_prepared_length_and_the_check_sees_it(case_id):
    case = Case.from_id(case_id, "cuda")
    good, bad, triton = run_case(case, [GraphSafeDecode(), BakedLengthDecode(), get_backend("triton")],
                                 RunOptions(timing=False))  # fmt: skip
    assert (good.status, good.replay) == ("pass", "pass"), good.reason
    assert (bad.status, bad.replay) == ("fail", "fail"), bad.reason
    assert triton.status == "pass" and triton.replay.startswith("skip: not graph-safe: the split schedule")


@pytest.mark.parametrize(
    "case_id", ["gdn_decode/b8-h4x8-d128x128-pad1-bf16", "gdn_verify/b8-t4-h4x8-d128x128-tree-pad1-bf16"]
)
def test_triton_gdn_replays(case_id):
    case = Case.from_id(case_id, "cuda")
    (row,) = run_case(case, [get_backend("triton")], RunOptions(timing=False))
    assert (row.status, row.replay) == ("pass", "pass"), row.reason
