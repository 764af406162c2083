"""The warp-specialized Gluon prefill (kernels/triton/prefill_ws.py): where the backend takes it, its tile plan.

It runs on Hopper only (compiled, never interpreted): tests/kernels/triton/test_triton_compile.py compiles it
for sm_90 and tools/probes/prefill_ws_gpu.py checks it against float64 on a GPU (reports/examples/h100-session17).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from attnbench.backend import get_backend  # noqa: E402
from attnbench.case import Case  # noqa: E402

# extend.py imported here, under the interpreter: a first import inside a test that sets TRITON_INTERPRET=0
# would leave its kernels compiled-only for every later test of this process
from attnbench.kernels.triton import extend  # noqa: E402, F401
from attnbench.kernels.triton import prefill_ws as p  # noqa: E402


def _inputs(case_id):
    return Case.from_id(case_id, "cpu").make_inputs()


@pytest.mark.parametrize(
    "case_id",
    ["extend/b1-q256-pre0-h32x8-d128-p16-bf16", "extend/b2-q200-pre0-h8x1-d64-p16-fp16",
     "extend/b2-q200-pre0-h8x2-d128-p16-bidirectional-bf16", "extend/b2-q6-pre17-h4x2-d64-p16-bf16",
     "extend/b2-q200-pre300-h8x2-d128-p1-bf16", "extend/b2-q200-pre300-h8x2-d128-p128-bidirectional-bf16"],
)  # fmt: skip
def test_prefills_and_extends_over_a_prefix_take_it(case_id):
    assert p.prefill_unsupported(_inputs(case_id)) is None


@pytest.mark.parametrize(
    "case_id, reason",
    [
        ("extend/b2-q6-pre17-h4x2-d64-p16-fp8_e4m3-bf16", "cache (attended as stored"),
        ("extend/b1-q64-pre0-h4x2-d64-p16-swa5-bf16", "window"),
        ("extend/b1-q64-pre0-h4x2-d64-p16-cap5-bf16", "soft cap"),
        ("extend/b1-q64-pre0-h4x2-d64-p16-sink-bf16", "sinks"),
        ("extend/b1-q64-pre0-h4x2-d80-p16-bf16", "head dims 80"),
        ("extend/b1-q64-pre0-h4x2-d64-p16-fp32", "not all bf16"),
        ("extend/b1-q64-pre0-h4x2-d64-p16-fp8_e4m3-bf16", "cache (attended as stored"),
        ("extend/b1-q64-pre0-h4x2-d192x128-p16-bf16", "head dims 192/128"),
    ],
)
def test_other_extends_keep_the_triton_kernel(case_id, reason):
    why = p.prefill_unsupported(_inputs(case_id))
    assert why is not None and reason in why


@pytest.mark.parametrize("case_id", ["extend/b3-q300-pre0-mixed-h4x2-d64-p16-bf16",
                                     "extend/b3-q300-pre500-mixed-h4x2-d64-p16-bf16"])  # fmt: skip
def test_tiles_cover_every_query_once_heaviest_first(case_id):
    x = _inputs(case_id)
    tiles = p.plan_prefill(x).tolist()
    covered = sorted((b, q0 + i) for b, q0 in tiles for i in range(min(p.BLOCK_M, x.q_lens_host[b] - q0)))
    assert covered == sorted((b, q) for b, n in enumerate(x.q_lens_host) for q in range(n))
    pre = [L - n for L, n in zip(x.seq_lens_host, x.q_lens_host)]
    work = [pre[b] + min(q0 + p.BLOCK_M, x.q_lens_host[b]) for b, q0 in tiles]  # causal: keys a tile reads
    assert work == sorted(work, reverse=True)


@pytest.mark.parametrize("page, tma", [(1, False), (8, True), (16, True), (24, False), (64, True), (128, True),
                                       (192, False), (256, True)])  # fmt: skip
def test_whole_prefix_blocks_load_by_tma_where_pages_tile_them(page, tma):
    assert p.page_tma(page) is tma


@pytest.mark.parametrize(
    "case_id, declined",
    [
        ("extend/b1-q4096-pre0-h32x8-d128-p16-bf16", None),  # 16.5 key blocks a tile
        ("extend/b8-q512-pre1024-h32x8-d128-p16-bf16", None),  # 32 tiles x 32 heads >= the SMs
        ("extend/b4-q512-pre1024-h32x8-d128-p64-bf16", None),
        ("extend/b1-q1024-pre0-h32x8-d128-p16-bf16", "4.5 key blocks a tile"),
        ("extend/b2-q512-pre0-h32x8-d128-p16-bf16", "2.5 key blocks a tile"),
        ("extend/b1-q4096-pre0-h64x8-d64x64-p16-bf16", "head dim 64"),
        ("extend/b4-q512-pre1024-h32x8-d128-p1-bf16", "pages of 1 (gathered)"),
        ("extend/b1-q256-pre4096-h32x8-d128-p16-bf16", "at most half the SMs"),
        ("extend/b2-q256-pre1024-h32x8-d128-p16-bidirectional-bf16", None),  # 128 programs: ahead at 132 SMs
        ("extend/b64-q4-pre1000-h32x8-d128-p16-bf16", "GQA-packed tiles"),
    ],
)
def test_the_policy_leaves_what_the_triton_kernel_runs_faster_to_it(monkeypatch, case_id, declined):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = _inputs(case_id)
    why = p.prefill_declined(x, p.plan_prefill(x))
    assert why == declined if declined is None else (why is not None and declined in why)
    fast, det, forced = (get_backend(b).prefill_ws(x) for b in ("triton", "triton-det", "triton:extend_kernel=ws"))
    assert callable(fast) is (declined is None) and (why == fast if why else True)
    assert callable(det) and callable(forced)  # batch-invariant: wherever it applies; forced: likewise


def test_an_extend_it_does_not_run_says_why_in_its_info():
    case = Case.from_id("extend/b2-q512-pre0-h32x8-d128-p16-bf16", "cpu")
    run = get_backend("triton").prepare_extend(case, case.make_inputs())  # the interpreter: extend.py's kernel
    assert run.info["not_prefill_ws"] == "not compiled for Hopper"
    assert (
        get_backend("triton:extend_kernel=triton").prepare_extend(case, case.make_inputs()).info["not_prefill_ws"]
        == "extend_kernel=triton"
    )
