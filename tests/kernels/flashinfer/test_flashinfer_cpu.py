"""The FlashInfer adapters on a CPU: conversions, skip reasons, and plumbing through fake kernels.

The plumbing tests run FlashInfer's real wrappers (plan, run, their checks) with every JIT kernel
replaced by a recorder (`fake_flashinfer.py`), and check what reaches each kernel: the case's
tensors, lengths, masks, window, scale, and the LSE conversions around the calls.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.flashinfer import _lib, limits
from attnbench.kernels.flashinfer import conventions as conv
from attnbench.plan.suite import load
from helpers import run_one

FI_BACKENDS = ("flashinfer", "flashinfer-fa3", "flashinfer-cudacore", "flashinfer-ragged", "flashinfer-ragged-fa3")
MLA = "d576x512-p16-mla-scale0.1352337788608801"


# ---- conversions -----------------------------------------------------------------------------------
def test_window_and_soft_cap_conversions():
    assert conv.window_left(127) == 127  # keys [p-127, p]: FlashInfer's window_left is the same W
    assert conv.window_left(0) == 0
    assert conv.window_left(-1) == -1
    assert conv.soft_cap(50.0) == 50.0
    assert conv.soft_cap(0.0) is None


def test_last_page_len_hand_values():
    seq = torch.tensor([1, 15, 16, 17, 32, 45], dtype=torch.int32)
    assert conv.last_page_len(seq, 16).tolist() == [1, 15, 16, 1, 16, 13]
    assert conv.last_page_len(seq, 1).tolist() == [1] * 6
    assert conv.last_page_len(seq, 16).dtype == torch.int32


def test_lse_base_conversions():
    ln = torch.tensor([0.0, 1.0, -2.5, -math.inf])
    base2 = torch.empty_like(ln)
    conv.lse_ln_to_log2(ln, base2)
    assert torch.allclose(base2[:3], torch.tensor([0.0, 1 / math.log(2), -2.5 / math.log(2)]))
    assert base2[3] == -math.inf
    back = conv.lse_log2_to_ln_(base2.clone())
    assert torch.allclose(back[:3], ln[:3]) and back[3] == -math.inf
    # log2(2^3 + 2^3) = 4 in base 2 is ln(e^(3 ln2) * 2) = 4 ln 2
    assert conv.lse_log2_to_ln_(torch.tensor([4.0])).item() == pytest.approx(4 * math.log(2))


def test_mla_split_is_zero_copy():
    q = torch.randn(5, 3, 576)
    k = torch.randn(7, 16, 1, 576)
    (q_nope, q_pe), (ckv, kpe) = conv.mla_split(q, k)
    assert q_nope.shape == (5, 3, 512) and q_pe.shape == (5, 3, 64)
    assert ckv.shape == (7, 16, 512) and kpe.shape == (7, 16, 64)
    assert q_nope.data_ptr() == q.data_ptr() and q_pe.data_ptr() == q.data_ptr() + 512 * 4
    assert ckv.data_ptr() == k.data_ptr() and ckv.stride() == (16 * 576, 576, 1)
    assert torch.equal(kpe[3, 2], k[3, 2, 0, 512:])
    with pytest.raises(ValueError):
        conv.mla_split(q, torch.randn(7, 16, 2, 576))


def test_prefix_page_table_hand_example():
    # request 0: pages [4, 1, 6] for 40 tokens, prefix 17 -> pages [4, 1], 1 key in the last
    # request 1: pages [0, 3] for 20 tokens, prefix 16 -> page [0], full
    indptr, indices, last = conv.prefix_page_table([0, 3, 5], torch.tensor([4, 1, 6, 0, 3]), [17, 16], 16)
    assert indptr.tolist() == [0, 2, 3]
    assert indices.tolist() == [4, 1, 0]
    assert last.tolist() == [1, 16]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    with pytest.raises(ValueError):
        conv.prefix_page_table([0, 1], torch.tensor([2]), [0], 16)


# ---- limits ------------------------------------------------------------------------------------------
def test_head_dim_limits():
    assert limits.fa2_head_dims(64, 64) is None
    assert limits.fa2_head_dims(192, 128) is None
    assert limits.fa2_head_dims(512, 512) is None
    for dk, dv in ((80, 80), (96, 96), (13, 13), (32, 32), (320, 320)):
        assert "4299" in limits.fa2_head_dims(dk, dv)
    assert limits.fa3_head_dims(192, 128) is None and limits.fa3_head_dims(128, 128) is None
    assert "64, 128, 256 and (192, 128)" in limits.fa3_head_dims(192, 192)
    assert "equal page and token strides" in limits.fa3_paged_strides(192, 128)
    assert limits.cuda_core_decode(128, 4) is None
    assert "power of two" in limits.cuda_core_decode(192, 4)
    assert "GQA groups" in limits.cuda_core_decode(128, 32)


def test_merge_limits():
    assert limits.merge_threads(128, 32) == 16 * 32
    assert limits.merge_threads(512, 4) == 32 * 4
    p = Case.from_id("merge_state/t33-h4-d64-fp32").params
    assert "fp16/bf16" in limits.merge_state(p, "fp32")
    assert limits.merge_state(p, "bf16") is None
    assert "head dims" in limits.merge_state(Case.from_id("merge_state/t4-h4-d96-bf16").params, "bf16")
    assert "1024" in limits.merge_state(Case.from_id("merge_state/t4-h128-d128-bf16").params, "bf16")


@pytest.mark.parametrize(
    "backend, case_id, expect",
    [
        ("flashinfer", "decode/b2-l45-h4x2-d64-p16-bf16", None),
        ("flashinfer", "decode/b2-l45-h4x2-d64-p16-fp32", "fp16/bf16"),
        ("flashinfer", "decode/b2-l45-h4x2-d80-p16-bf16", "4299"),
        ("flashinfer", "decode/b2-l45-h4x2-d192x128-p16-bf16", "one head_dim"),
        ("flashinfer", "decode/b3-l70-skewed-h8x2-d64-p16-swa7-sink-bf16", None),
        ("flashinfer", "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16", "soft-cap"),
        ("flashinfer", f"decode/b2-l40-h16x1-{MLA}-bf16", None),
        ("flashinfer", f"decode/b2-l40-h16x1-{MLA}-swa7-bf16", "sliding window"),
        ("flashinfer-fa3", "decode/b2-l45-h4x2-d96-p16-bf16", "fa3 kernels exist"),
        ("flashinfer-cudacore", "decode/b3-l70-skewed-h8x2-d64-p16-sink-bf16", "no sink term"),
        ("flashinfer-cudacore", f"decode/b2-l40-h16x1-{MLA}-bf16", "BatchMLAPagedAttentionWrapper"),
        ("flashinfer-cudacore", "decode/b2-l45-h32x1-d128-p16-bf16", "GQA groups"),
        ("flashinfer", "extend/b3-q9-pre21-mixed-h8x2-d64-p16-custom-bf16", None),
        ("flashinfer-fa3", "extend/b3-q9-pre21-mixed-h8x2-d64-p16-custom-bf16", "no custom mask"),
        ("flashinfer-fa3", "extend/b2-q6-pre17-h4x2-d192x128-p16-bf16", "equal page and token strides"),
        ("flashinfer-fa3", "extend/b2-q6-pre0-h4x2-d192x128-p16-kvattend-bf16", None),
        ("flashinfer", "extend/b2-q7-pre19-h4x2-d64-p16-kvattend-bf16", None),
        ("flashinfer", "extend/b2-q7-pre19-h4x2-d64-p16-kvattend-swa5-bf16", "window"),
        ("flashinfer", "extend/b2-q7-pre19-h4x2-d64-p16-kvattend-sink-bf16", "sink"),
        ("flashinfer", "extend/b2-q8-pre30-h8x2-d64-p1-custom-sink-bf16", "custom mask"),
        ("flashinfer", f"extend/b2-q5-pre20-h16x1-{MLA}-kvattend-bf16", "paged cache only"),
        ("flashinfer-ragged", "extend/b2-q7-pre19-h4x2-d64-p16-kvshared-bf16", "new_kv=shared"),
        ("flashinfer-ragged", "extend/b2-q7-pre0-h4x2-d64-p16-custom-swa5-bf16", None),
        ("flashinfer-ragged", "extend/b2-q7-pre19-h4x2-d64-p16-custom-bf16", "splitting per half"),
        ("flashinfer-ragged-fa3", "extend/b2-q7-pre0-h4x2-d64-p16-custom-bf16", "no custom mask"),
        ("flashinfer", "merge_state/t33-h4-d64-fp32", "fp16/bf16"),
    ],
)
def test_case_limits(backend, case_id, expect):
    reason = get_backend(backend).limits(Case.from_id(case_id, "cuda"))
    if expect is None:
        assert reason is None
    else:
        assert reason and expect in reason, reason


# ---- availability on this machine ---------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-machine skips")
def test_every_smoke_row_is_a_skip_with_a_reason_on_cpu():
    cases = load("smoke").cases
    for name in FI_BACKENDS:
        b = get_backend(name)
        for case in cases:
            reason = b.supports(case)
            assert reason, (name, case.id)
        first = next(c for c in cases if c.op_name in b.ops)
        row = run_one(first.id, b)
        assert row.status == "skip" and ("CUDA" in row.reason or "not installed" in row.reason), row.reason


def test_not_installed_is_a_skip_reason(monkeypatch):
    monkeypatch.setattr(_lib, "_installed", lambda: False)
    assert "not installed" in get_backend("flashinfer").available()
    case = Case.from_id("decode/b1-l8-h4x4-d64-p16-bf16")
    assert "not installed" in get_backend("flashinfer-fa3").supports(case)


def test_importing_the_backends_imports_no_gpu_library():
    code = (
        "import sys, attnbench.kernels; "
        "bad = [m for m in ('flashinfer', 'cutlass', 'flash_attn') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- plumbing through FlashInfer's wrappers with fake kernels ------------------------------------------
@pytest.fixture
def fake(monkeypatch, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("fake-kernel plumbing runs on CPU machines; GPU machines run the real kernels")
    pytest.importorskip("flashinfer")
    import fake_flashinfer

    yield fake_flashinfer.fake_kernels(monkeypatch, tmp_path)
    fake_flashinfer.CURRENT[0] = None


def _prepared(backend, case_id):
    case = Case.from_id(case_id)
    x = case.make_inputs()
    fn = get_backend(backend).prepare(case, x)
    return case, x, fn


def _write_lse(x, value):
    """A kernel effect: write `value` into whichever argument is the case's LSE buffer."""

    def effect(name, attr, args):
        for a in args:
            if isinstance(a, torch.Tensor) and a.data_ptr() == x.lse.data_ptr():
                a.fill_(value)

    return effect


def test_decode_tensor_core_plumbing(fake):
    case, x, fn = _prepared("flashinfer", "decode/b3-l45-mixed-h8x2-d64-p16-swa7-cap5-bf16")
    [(name, plan)] = fake.named("plan")[-1:]
    assert "use_swa_True_use_logits_cap_True" in name and name.endswith("kv_stride_equal")
    assert plan[5].tolist() == list(x.seq_lens_host)  # kv lengths FlashInfer derived from last_page_len
    assert (plan[8], plan[9], plan[10], plan[12], plan[13], plan[15]) == (8, 2, 16, 64, 64, 7)
    fake.clear()
    fake.effect = _write_lse(x, 3.0)
    out = fn()
    [(_, run)] = fake.named("paged_run")
    assert run[3] is x.q and run[4] is x.k_cache and run[5] is x.v_cache
    assert run[10] is x.o and run[11] is x.lse
    assert (run[12], run[14], run[24], run[25]) == (0, 7, 5.0, x.sm_scale)  # non-causal, window, cap, scale
    assert torch.allclose(out["lse"], torch.full_like(x.lse, 3.0 * math.log(2)))  # base 2 -> ln
    assert fn.info["variant"].endswith("tensor-core fa2") and {"jit_s", "plan_s"} <= set(fn.info)


def test_decode_fa3_and_cuda_core_plumbing(fake):
    case, x, fn = _prepared("flashinfer-fa3", "decode/b2-l45-h4x2-d64-p16-bf16")
    fn()
    [(name, run)] = fake.named("paged_run")
    assert name.endswith("_sm90") and run[10] is x.o and run[21] == x.sm_scale
    fake.clear()
    case, x, fn = _prepared("flashinfer-cudacore", "decode/b3-l80-mixed-h8x1-d128-p64-bf16")
    fake.effect = _write_lse(x, -1.0)
    fn()
    [(name, run)] = fake.named("run")
    assert name.startswith("batch_decode_with_kv_cache")
    assert run[3] is x.q and run[9] is x.o and run[10] is x.lse and run[16] == x.sm_scale
    assert run[8].tolist() == conv.last_page_len(x.seq_lens, 64).tolist()
    assert torch.allclose(x.lse, torch.full_like(x.lse, -math.log(2)))


def test_extend_paged_custom_mask_plumbing(fake):
    case, x, fn = _prepared("flashinfer", "extend/b3-q9-pre21-mixed-h8x2-d64-p16-custom-bf16")
    _, pack = fake.named("segment_packbits")[-1]  # plan() ran twice (JIT, then plan timing)
    assert torch.equal(pack[0], x.custom_mask)  # True = visible, packed by the wrapper (little-endian)
    assert pack[1].tolist() == x.mask_indptr.tolist()  # FlashInfer's per-request [q_len, kv_len] layout
    assert pack[3] == "little"
    plan = fake.named("plan")[-1][1]
    assert plan[14] is False  # a custom mask plans non-causal: it alone decides
    fake.clear()
    fake.effect = _write_lse(x, 2.0)
    fn()
    [(_, run)] = fake.named("paged_run")
    assert run[12] == 2 and run[16] is not None and run[14] == -1  # MaskMode.CUSTOM, packed mask, no window
    assert torch.allclose(x.lse, torch.full_like(x.lse, 2.0 * math.log(2)))  # lse_base="ln"


def test_extend_save_writes_slots_before_attending(fake):
    case, x, fn = _prepared("flashinfer", "extend/b2-q7-pre19-h4x2-d64-p16-bf16")
    seen = {}

    def effect(name, attr, args):
        if attr == "paged_run":
            seen["slots"] = x.k_cache.view(-1, 2, 64)[x.slot_mapping].clone()

    fake.effect = effect
    fn()
    assert torch.equal(seen["slots"], x.k_new)  # the new keys were in the cache when the kernel ran
    plan = fake.named("plan")[-1][1]
    assert plan[14] is True and plan[5].tolist() == list(x.seq_lens_host)


def test_extend_dk_ne_dv_uses_the_independent_stride_module(fake):
    case, x, fn = _prepared("flashinfer", "extend/b2-q6-pre17-h4x2-d192x128-p16-bf16")
    fake.clear()
    fn()
    [(name, run)] = fake.named("paged_run")
    assert name.endswith("paged_kv_stride_independent")  # built in prepare, not at the first run
    assert run[10] is x.o and x.o.shape[-1] == 128


def test_cascade_plumbing(fake):
    case, x, fn = _prepared("flashinfer", "extend/b2-q7-pre19-h4x2-d64-p16-kvattend-bf16")
    plans = fake.named("plan")
    ragged_plan, paged_plan = plans[-2][1], plans[-1][1]
    assert ragged_plan[5].tolist() == [7, 7] and ragged_plan[14] is True  # new tokens, causal among them
    assert paged_plan[5].tolist() == [19, 19] and paged_plan[14] is False  # the prefix, all visible
    fake.clear()
    fake.effect = _write_lse(x, 1.0)
    fn()
    assert [a for _, a, _ in fake.calls] == ["paged_run", "ragged_run", "merge_state_in_place"]
    paged, ragged, merge = (args for _, _, args in fake.calls)
    assert paged[10] is x.o and paged[11] is x.lse
    assert ragged[4] is x.k_new and ragged[5] is x.v_new and ragged[8] is not x.o
    assert merge[0] is x.o and merge[1] is x.lse and merge[2] is ragged[8] and merge[3] is ragged[9]
    assert torch.allclose(x.lse, torch.full_like(x.lse, math.log(2)))  # merged in base 2, then -> ln


def test_prefix_free_ragged_plumbing(fake):
    case, x, fn = _prepared("flashinfer-ragged", "extend/b2-q7-pre0-h4x2-d64-p16-custom-swa5-bf16")
    fn()
    assert [a for _, a, _ in fake.calls if a.endswith("run")] == ["ragged_run"]
    run = fake.named("ragged_run")[0][1]
    assert run[8] is x.o and run[9] is x.lse and run[10] == 2 and run[12] == 5


def test_sinks_plumbing(fake):
    case, x, fn = _prepared("flashinfer", "decode/b3-l70-skewed-h8x2-d64-p16-swa7-sink-bf16")
    assert fn.info["jit_module"] == "batch_prefill_attention_sink_bf16_swa_True_fa2"
    fake.clear()
    fn()
    [(name, run)] = fake.named("paged_run")
    assert name == "batch_prefill_attention_sink_bf16_swa_True_fa2"
    assert run[10] is x.o and run[11] is x.lse and run[14] == 7
    assert run[16] is x.sinks and run[17] == x.sm_scale  # the variant's extra tensor and scalar


def test_sink_module_name_collision_is_a_skip(fake):
    from attnbench.errors import Unsupported

    _prepared("flashinfer", "decode/b2-l30-h4x2-d64-p16-sink-fp16")
    with pytest.raises(Unsupported, match="without head dims"):
        _prepared("flashinfer", "decode/b2-l30-h4x2-d128-p16-sink-fp16")


def test_mla_plumbing(fake):
    case, x, fn = _prepared("flashinfer", f"extend/b2-q5-pre20-h16x1-{MLA}-bf16")
    plan = fake.named("plan_with_staged_workspace_bytes")[-1][1]
    assert plan[5].tolist() == list(x.seq_lens_host) and plan[6:] == (16, 512, True)
    fake.clear()
    fn()
    [(name, run)] = fake.named("run")
    assert "head_dim_ckv_512_head_dim_kpe_64" in name
    q_nope, q_pe, ckv, kpe = run[3:7]
    assert q_nope.data_ptr() == x.q.data_ptr() and q_pe.data_ptr() == x.q[..., 512:].data_ptr()
    assert ckv.data_ptr() == x.k_cache.data_ptr() and kpe.data_ptr() == x.k_cache[..., 512:].data_ptr()
    assert run[8] is x.o and run[9] is x.lse and run[13] == x.sm_scale and run[14] is True  # LSE base e


def test_merge_state_plumbing(fake):
    case, x, fn = _prepared("flashinfer", "merge_state/t33-h4-d64-empty-bf16")
    fake.effect = _write_lse(x, 0.5)
    fn()
    [(_, args)] = fake.named("merge_state")
    assert args[0] is x.v_a and args[2] is x.v_b and args[4] is x.o and args[5] is x.lse
    assert torch.allclose(args[1], x.s_a / math.log(2))  # ln -> base 2 on the way in
    assert torch.isinf(args[3]).sum() == torch.isinf(x.s_b).sum()  # empty states stay -inf
    assert torch.allclose(x.lse, torch.full_like(x.lse, 0.5 * math.log(2)))


# ---- prebuild ------------------------------------------------------------------------------------------
def test_prebuild_keys_and_specs_for_smoke(monkeypatch, tmp_path):
    pytest.importorskip("flashinfer")
    from attnbench.kernels.flashinfer import prebuild
    from fake_flashinfer import use_scratch_jit_dirs

    use_scratch_jit_dirs(monkeypatch, tmp_path)
    # limits read the case's device: FlashInfer runs CUDA cases. The smoke suite (generated from the ops'
    # smoke spaces) has no paged extend with Dk != Dv, which fa2 runs with its independent-stride module:
    # the extend suite's MLA prefills do.
    cases = load("smoke", device="cuda").cases + load("extend", device="cuda").cases
    keys = {}
    for name in FI_BACKENDS:
        b = get_backend(name)
        for case in cases:
            if case.op_name in b.ops and b.limits(case) is None:
                keys.update(dict.fromkeys(b.jit_keys(case)))
    kinds = {k.kind for k in keys}
    assert kinds == {"prefill", "prefill-independent", "decode", "mla", "cascade", "sink", "packbits"}
    names = [s.name for s in prebuild.specs(keys)]
    assert len(names) == len(set(names))
    sinks = [n for n in names if n.startswith("batch_prefill_attention_sink_")]  # e.g. ..._f16_swa_True_fa2
    assert {n.rsplit("_", 1)[1] for n in sinks} == {"fa2", "fa3"}, sinks
    assert any(n.endswith("_sm90") for n in names)
