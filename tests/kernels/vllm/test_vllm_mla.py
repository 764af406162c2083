"""vLLM's Triton MLA decode through the `vllm` backend (kernels/vllm/mla.py), under TRITON_INTERPRET=1 on
tiny absorbed-MLA cases (Dk 576, Dv 512, one latent head), every row through the harness (`run_one`):
float64 verdicts, untouched inputs, canaries, stale outputs. Then mutants of the adapter's call (a wrong
value width, scale, fp8 scale or key range) that those same rows must fail, and the split
rule and limits against vLLM's own.

fp16 here: in the interpreter the kernel (SGLang's split-KV decode, as vLLM carries it) writes garbage for
bf16 inputs, as SGLang's does (tests/kernels/sglang/test_sglang_interpreter.py); bf16 is checked on the GPU.
Needs vllm (tools/install-deployed.sh vllm); skipped with the reason otherwise.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.vllm import _lib, mla
from helpers import KERNEL, run_one

CASES = [
    "decode/b2-l40-h16x1-d576x512-p16-mla-fp16",
    # mixed lengths past 1024 keys: two kv splits (vLLM's rule), a last split shorter than the rest
    "decode/b3-l1100-mixed-h4x1-d576x512-p16-mla-fp16",
    # a 64-token page (the mla suite's) and a request shorter than one page
    "decode/b3-l150-mixed-h4x1-d576x512-p64-mla-fp16",
    # an fp8 latent cache with the layer's scale as both k and v scale (forward_mqa: layer._k_scale)
    "decode/b2-l300-h4x1-d576x512-p32-mla-fp8_e4m3-fp16",
]


@pytest.mark.interpreter
@pytest.mark.parametrize("case_id", CASES)
def test_mla_decode_case_passes(vllm, case_id):
    r = run_one(case_id, vllm, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert "triton_decode_attention" in r.prepare_info["variant"]
    assert not r.prepare_info.get("absent")  # o and lse, both checked


def test_two_splits_are_what_the_long_case_takes():
    case = Case.from_id("decode/b3-l1100-mixed-h4x1-d576x512-p16-mla-fp16", "cpu")
    assert mla.split_count(case.params.kv_len, mla.INTERPRETER_SM_COUNT) == 2


# ---- mutants: the adapter's call with one argument wrong; the harness must fail the row -------------------
def _calling(real, mutate):
    """`real` with its arguments changed by `mutate(args, kwargs) -> (args, kwargs)`."""

    def call(*args, **kwargs):
        args, kwargs = mutate(args, kwargs)
        return real(*args, **kwargs)

    return call


def _positional(index, change):
    def mutate(args, kwargs):
        args = list(args)
        args[index] = change(args[index])
        return args, kwargs

    return mutate


def _keyword(name, change):
    def mutate(args, kwargs):
        return args, {**kwargs, name: change(kwargs[name])}

    return mutate


def _splits(factor):
    def mutate(args, kwargs):  # num_kv_splits must match the scratch: both change together
        args = list(args)
        logits = args[7]
        args[7] = logits.new_empty(logits.shape[0], logits.shape[1], logits.shape[2] * factor, logits.shape[3])
        args[8] = args[8] * factor
        return args, kwargs

    return mutate


MUTANTS = {
    # decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits,
    #                      num_kv_splits, sm_scale, page_size, k_scale=, v_scale=, is_mla=)
    # (not the page size: a wrong one reads past the block table and the cache, which the interpreter
    # does not survive)
    "values 448 wide": _positional(2, lambda v: v[..., :448]),
    "scale 1.02x": _positional(9, lambda s: s * 1.02),
    "head_dim**-0.5 scale": _positional(9, lambda s: 576**-0.5),
    "one key short": _positional(6, lambda n: n - 1),
    "k scale doubled (fp8)": _keyword("k_scale", lambda s: s * 2),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("mutant", MUTANTS)
def test_a_wrong_argument_fails_the_row(vllm, monkeypatch, mutant):
    wrong = _calling(_lib.decode_attention_fwd(), MUTANTS[mutant])
    monkeypatch.setattr(_lib, "decode_attention_fwd", lambda: wrong)
    case_id = CASES[3] if "fp8" in mutant else CASES[1]
    r = run_one(case_id, vllm, **KERNEL)
    assert r.status == "fail", f"{mutant}: {r.status} {r.reason}"  # a verdict, not an error in the call


@pytest.mark.interpreter
def test_more_splits_than_vllm_picks_still_pass(vllm, monkeypatch):
    """The split count is vLLM's choice, not a correctness knob: four splits pass where vLLM takes two (so
    the mutants above fail for what they change, not for any change to the call)."""
    more = _calling(_lib.decode_attention_fwd(), _splits(2))
    monkeypatch.setattr(_lib, "decode_attention_fwd", lambda: more)
    r = run_one(CASES[1], vllm, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"


@pytest.mark.interpreter
def test_mla_path_takes_the_values_from_the_key_tile(vllm, monkeypatch):
    """With is_mla the kernel reuses the loaded key tile (already scaled by k_scale) as the values: v_buffer
    gives only the value width, and v_scale is never read. So a v_buffer pointing elsewhere and a wrong
    v_scale are equivalent mutants (the row still passes), which is why the adapter's V is checked through
    its width and its fp8 scale through k_scale."""
    shifted = _positional(2, lambda v: v.as_strided(v.shape, v.stride(), v.storage_offset() + 64))
    wrong_v_scale = _keyword("v_scale", lambda s: s * 2)

    def both(args, kwargs):
        return wrong_v_scale(*shifted(args, kwargs))

    elsewhere = _calling(_lib.decode_attention_fwd(), both)
    monkeypatch.setattr(_lib, "decode_attention_fwd", lambda: elsewhere)
    r = run_one(CASES[3], vllm, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"


# ---- vLLM's split rule and limits ------------------------------------------------------------------------
def test_split_count_is_vllms_rule():
    assert [mla.split_count(n, 132) for n in (1, 511, 1023, 1024, 1100, 4096, 8192)] == [1, 1, 1, 2, 2, 8, 16]
    assert mla.split_count(3 * 512, 132) == 4  # a power of two at or above max_seq_len // 512
    assert mla.split_count(1 << 20, 4) == 8  # at most two splits per SM


def _vllm_source(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    path = pathlib.Path(spec.origin).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return path.read_text()


def test_split_constants_and_page_rule_are_vllms_source():
    """triton_mla.py does not import without vLLM's server dependencies: its constants are read from its
    source, so a vLLM whose rule moved fails here, not silently in the timings."""
    src = _vllm_source("vllm.v1.attention.backends.mla.triton_mla")
    if src is None:
        pytest.skip("vllm is not installed (tools/install-deployed.sh vllm)")
    consts = {
        t.id: node.value.value
        for node in ast.parse(src).body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert consts["_MIN_WORK_PER_SPLIT"] == mla.MIN_WORK_PER_SPLIT
    assert consts["_SPLIT_OCCUPANCY_MULTIPLIER"] == mla.SPLIT_OCCUPANCY_MULTIPLIER
    assert f"block_size % {mla.PAGE_MULTIPLE} == 0" in src and f"MultipleOf({mla.PAGE_MULTIPLE})" in src
    assert "v_scale=layer._k_scale" in src and "is_mla=True" in src  # one latent scale; the MLA path


@pytest.mark.parametrize(
    "case_id, why",
    [
        ("decode/b2-l64-h16x1-d576x512-p16-mla-cap30-bf16", "soft cap"),
        ("decode/b2-l64-h16x1-d576x512-p16-mla-swa7-bf16", "sliding window"),
        ("decode/b2-l64-h16x1-d576x512-p16-mla-sink-bf16", "sinks"),
        ("decode/b2-l64-h16x1-d576x512-p1-mla-bf16", "multiples of 16"),
        ("decode/b2-l64-h16x1-d576x512-p8-mla-bf16", "multiples of 16"),
        ("decode/b2-l64-h16x1-d576x512-p16-mla-fp8_e5m2-bf16", "fp8_e5m2"),
        ("decode/b2-l64-h16x1-d576x512-p16-mla-fp32", "fp16 and bf16"),
    ],
)
def test_mla_limits_are_vllms_triton_mla_backends(case_id, why):
    reason = get_backend("vllm").limits(Case.from_id(case_id, "cuda"))
    assert reason is not None and why in reason, reason


def test_bf16_on_the_cpu_is_a_skip_naming_the_interpreter():
    """Triton's interpreter gets bf16 tl.dot wrong (the reason says how far); the same case on CUDA runs."""
    b = get_backend("vllm")
    assert "interpreter computes bf16 tl.dot wrong" in b.limits(
        Case.from_id("decode/b5-l1-mixed-h16x1-d576x512-p64-mla-large_logits-bf16", "cpu")
    )
    assert b.limits(Case.from_id("decode/b5-l1-mixed-h16x1-d576x512-p64-mla-large_logits-bf16", "cuda")) is None


def test_mla_decode_runs_where_unified_attention_cannot(monkeypatch):
    b = get_backend("vllm")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert b.limits(Case.from_id("decode/b32-l4096-h128x1-d576x512-p64-mla-bf16", "cuda")) is None
    assert b.limits(Case.from_id("decode/b32-l4096-h128x1-d576x512-p64-mla-fp8_e4m3-bf16", "cuda")) is None
    # under the interpreter (the CPU lane) MLA decode and the unified attention run on the CPU, but for bf16
    assert b.limits(Case.from_id("decode/b2-l40-h16x1-d576x512-p16-mla-fp16", "cpu")) is None
    assert b.limits(Case.from_id("decode/b2-l64-h4x2-d64-p16-fp16", "cpu")) is None
    assert "bf16 tl.dot wrong" in b.limits(Case.from_id("decode/b2-l64-h4x2-d64-p16-bf16", "cpu"))
    # MLA extend is still the unified attention's, which has one head size
    assert "one head size" in b.limits(Case.from_id("extend/b1-q8-pre16-h16x1-d576x512-p16-mla-bf16", "cuda"))


def test_mla_decode_declares_why_it_is_not_graph_safe():
    b = get_backend("vllm")
    mla_case = Case.from_id("decode/b2-l40-h16x1-d576x512-p16-mla-bf16", "cuda")
    assert "num_kv_splits" in b.graph_safe(mla_case)
    assert "max_seqlen_k" in b.graph_safe(Case.from_id("decode/b2-l64-h4x2-d64-p16-bf16", "cuda"))


@pytest.mark.interpreter
def test_the_interpreter_bf16_dot_the_skip_names_is_still_wrong():
    """The bf16 CPU skip stands only while Triton's interpreter gets a plain bf16 tl.dot wrong: once it is
    right, this fails, and the skip (mla.INTERPRETER_BF16) should go."""
    if not _lib.interpreted():
        pytest.skip("needs Triton's CPU interpreter (TRITON_INTERPRET=1, no CUDA device)")
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def dot(A, B, O, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
        m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
        a = tl.load(A + m[:, None] * K + k[None, :])
        b = tl.load(B + k[:, None] * N + n[None, :])
        tl.store(O + m[:, None] * N + n[None, :], tl.dot(a, b))

    gen = torch.Generator().manual_seed(0)
    errors = {}
    for dtype in (torch.float16, torch.bfloat16):
        a = torch.randn(16, 32, generator=gen).to(dtype)
        b = torch.randn(32, 16, generator=gen).to(dtype)
        o = torch.empty(16, 16)
        dot[(1,)](a, b, o, 16, 32, 16)
        errors[dtype] = (o - a.float() @ b.float()).abs().max().item()
    assert errors[torch.float16] < 1e-3 and errors[torch.bfloat16] > 1.0, errors
