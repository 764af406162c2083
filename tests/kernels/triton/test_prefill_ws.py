"""The warp-specialized Gluon prefill (kernels/triton/prefill_ws.py): where the backend takes it, its tile plan.

It runs on Hopper only (compiled, never interpreted): tests/kernels/triton/test_triton_compile.py compiles it
for sm_90 and tools/probes/prefill_ws_gpu.py checks it against float64 on a GPU (reports/examples/h100-session17).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from attnbench.backend import get_backend  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.kernels.triton import prefill_ws as p  # noqa: E402


def _inputs(case_id):
    return Case.from_id(case_id, "cpu").make_inputs()


@pytest.mark.parametrize(
    "case_id",
    ["extend/b1-q256-pre0-h32x8-d128-p16-bf16", "extend/b2-q200-pre0-h8x1-d64-p16-fp16",
     "extend/b2-q200-pre0-h8x2-d128-p16-bidirectional-bf16"],
)  # fmt: skip
def test_prefills_without_a_prefix_take_it(case_id):
    assert p.prefill_unsupported(_inputs(case_id)) is None


@pytest.mark.parametrize(
    "case_id, reason",
    [
        ("extend/b2-q6-pre17-h4x2-d64-p16-bf16", "cached prefix"),
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


def test_tiles_cover_every_query_once_heaviest_first():
    x = _inputs("extend/b3-q300-pre0-mixed-h4x2-d64-p16-bf16")
    tiles = p.plan_prefill(x).tolist()
    covered = sorted((b, q0 + i) for b, q0 in tiles for i in range(min(p.BLOCK_M, x.q_lens_host[b] - q0)))
    assert covered == sorted((b, q) for b, n in enumerate(x.q_lens_host) for q in range(n))
    work = [min(q0 + p.BLOCK_M, x.q_lens_host[b]) for b, q0 in tiles]  # causal: keys a tile reads
    assert work == sorted(work, reverse=True)


def test_the_backend_takes_it_only_compiled_on_hopper(monkeypatch):
    x = _inputs("extend/b1-q256-pre0-h32x8-d128-p16-bf16")
    be = get_backend("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert be.prefill_ws(x) is None  # the interpreter does not run Gluon
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    run = be.prefill_ws(x)  # a CPU case counts as sm_90 (common.arch); binding compiles nothing yet
    assert run is not None and run.info["kernel"] == "prefill-ws"
    assert get_backend("triton:extend_kernel=triton").settings["extend_kernel"] == "triton"
