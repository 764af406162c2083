"""Our absorbed-MLA decode kernel (kernels/triton/decode_mla.py) against float64, in the interpreter.

The cases reach every block kind of the kernel: whole blocks, a masked tail (a partial last page), a
masked head block (a window start inside a block), a key range inside one block, several splits per
request (merged by decode.py's merge kernel), 128 heads (two head blocks of 64), sinks and soft cap.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels run on the CPU under TRITON_INTERPRET=1 (conftest sets it)", allow_module_level=True)

from attnbench.backend import get_backend  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.kernels.triton import decode_mla as m  # noqa: E402

# The Gluon modules import now, under the session's interpreter setting: imported later inside a test that
# sets TRITON_INTERPRET=0 (the gate's view of sm_90), gluon rejects triton.language's interpreted functions
from attnbench.kernels.triton import decode_mla_gluon, decode_mla_ws  # noqa: E402, F401
from tests.support.helpers import KERNEL, run_one  # noqa: E402

CASES = [
    "decode/b3-l200-mixed-h128x1-d576x512-p64-mla-bf16",  # two head blocks, partial last pages
    "decode/b2-l150-h16x1-d576x512-p16-mla-swa40-sink-cap5-fp16",  # window start inside a block, sink, cap
    "decode/b2-l20-h16x1-d576x512-p64-mla-swa6-bf16",  # the whole range inside one block
]


@pytest.mark.parametrize("backend", ["triton", "triton-det", "triton:split_keys=64"])
@pytest.mark.parametrize("case_id", CASES)
def test_mla_kernel_matches_float64(case_id, backend):
    be = get_backend(backend)
    x = Case.from_id(case_id, "cpu").make_inputs()
    assert m.mla_unsupported(x, m.mla_config(x.q.shape[1], x.k_cache.shape[1], 90)) is None
    r = run_one(case_id, be, **KERNEL)
    assert r.status == "pass", r.reason
    assert r.prepare_info["kernel"] == "mla"
    if backend.endswith("=64") and case_id == CASES[0]:  # 64-key splits of up to 200 keys: partials merged
        assert r.prepare_info["max_splits"] >= 2


@pytest.mark.parametrize(
    "case_id, reason",
    [
        ("decode/b2-l40-h16x1-d576x512-p1-mla-bf16", "page size 1"),  # token slots: blocks of one key
        ("decode/b2-l40-h16x1-d576x512-p16-mla-fp8_e4m3-bf16", "cache with"),  # fp8: the generic kernel
        ("decode/b2-l40-h16x1-d576x512-p16-mla-fp32", "float32 queries"),
        ("decode/b2-l40-h8x2-d576x512-p16-bf16", "not absorbed MLA"),
    ],
)
def test_other_layouts_take_the_generic_kernel(case_id, reason):
    x = Case.from_id(case_id, "cpu").make_inputs()
    why = m.mla_unsupported(x, m.mla_config(x.q.shape[1], x.k_cache.shape[1], 90))
    assert why is not None and reason in why
    r = run_one(case_id, get_backend("triton"), **KERNEL)
    assert r.status == "pass", r.reason
    assert "kernel" not in r.prepare_info


def test_splits_fill_waves_and_keep_partials_small():
    # H100 (132 SMs), 128 heads in two blocks of 64, 64-key blocks; partials of one split ~ 114 keys
    # measured (reports/examples/h100-session10): B128 L8192 unsplit 1284 us vs 2 splits 1370 us;
    # B32 L4096 two splits 184 us vs one 306 us and four 192 us
    assert m.mla_splits([8192] * 128, 2, 132, 64, 114) == 1
    assert m.mla_splits([4096] * 32, 2, 132, 64, 114) == 2
    assert m.mla_splits([4096], 2, 132, 64, 114) > 8  # one request: spread over the SMs
    assert m.mla_splits([64] * 4, 2, 132, 64, 114) == 1  # nothing to split


# ---- the Gluon kernels (decode_mla_ws.py, decode_mla_gluon.py): where the plan takes them -----------------------
# They run on Hopper only (compiled, never interpreted): tests/kernels/triton/test_triton_compile.py compiles them
# for sm_90 and tools/probes/mla_gluon_gpu.py checks them against float64 on a GPU. Here: the gate.


def _plan(case_id, monkeypatch, **cfg):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the gate asks; nothing is launched
    x = Case.from_id(case_id, "cpu").make_inputs()
    config = m.mla_config(x.q.shape[1], x.k_cache.shape[1], 90)
    assert config.impl == "ws"  # the default on sm_90 when compiled
    from dataclasses import replace

    return m.plan_mla_decode(x, config=replace(config, **cfg), num_sms=132)


@pytest.mark.parametrize("impl, kernel", [("ws", "mla_decode_ws_kernel"), ("wgmma", "mla_decode_gluon_kernel")])
def test_hopper_takes_a_gluon_kernel_where_it_applies(impl, kernel, monkeypatch):
    case_id = "decode/b3-l200-mixed-h128x1-d576x512-p64-mla-bf16"
    plan = _plan(case_id, monkeypatch, impl=impl)
    assert plan.config.impl == impl
    launches = m._launches(Case.from_id(case_id, "cpu").make_inputs(), plan)
    assert launches[0][0].__name__ == kernel


@pytest.mark.parametrize(
    "case_id, cfg",
    [
        ("decode/b2-l150-h16x1-d576x512-p64-mla-bf16", {}),  # 16 heads: programs of 64 would be 3/4 padding
        ("decode/b2-l150-h128x1-d576x512-p16-mla-bf16", {}),  # pages of 16: blocks of 64 keys span pages
        ("decode/b2-l150-h128x1-d576x512-p64-mla-swa40-sink-cap5-bf16", {}),  # sinks and soft cap
        ("decode/b3-l200-mixed-h128x1-d576x512-p64-mla-bf16", {"fused_merge": True}),
    ],
)
def test_other_mla_cases_keep_the_triton_mla_kernel(case_id, cfg, monkeypatch):
    assert _plan(case_id, monkeypatch, **cfg).config.impl == "triton"


def test_interpreter_and_other_archs_never_take_a_gluon_kernel(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert m.mla_config(128, 64, 90).impl == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert m.mla_config(128, 64, 100).impl == m.mla_config(128, 64, 80).impl == "triton"
    assert m.mla_config(128, 64, 90).impl == "ws"


def test_an_unknown_mla_kernel_is_an_error(monkeypatch):
    with pytest.raises(ValueError, match="one of triton, wgmma, ws"):
        _plan("decode/b3-l200-mixed-h128x1-d576x512-p64-mla-bf16", monkeypatch, impl="fast")


def test_gluon_kernels_weigh_partials_by_their_own_key_rate():
    # H100 (reports/examples/h100-session17): ws unsplit beat two splits at B32 L1024 (41.2 against 47.5 us),
    # two splits won at B32 L4096; B128 L8192 stays whole; one request still spreads over the SMs
    units, slots = 2, 132
    pk = -(-64 * 514 * 4 // 1152)
    ws = pk * m.PARTIAL_WEIGHT["ws"]
    assert m.mla_splits([1024] * 32, units, slots, 64, ws) == 1
    assert m.mla_splits([1024] * 32, units, slots, 64, pk) == 2  # the Triton MLA kernel's rule split it
    assert m.mla_splits([4096] * 32, units, slots, 64, ws) == 2
    assert m.mla_splits([8192] * 128, units, slots, 64, ws) == 1
    assert 8 < m.mla_splits([8192], units, slots, 64, ws) < m.mla_splits([8192], units, slots, 64, pk)
