"""vLLM's unified attention over fp8 e4m3 KV caches with the layer's k/v scales (issue #36), under
TRITON_INTERPRET=1 on tiny fp16/fp32 cases, every row through the harness (`run_one`): float64 verdicts.

vLLM's Triton backend passes `k_descale`/`v_descale` as the layer's 0-d scales expanded to `[B, Hkv]` and
`kv_quant_mode = FP8_PER_TENSOR`; the kernel then dequantises each K/V tile to the query dtype (exactly:
the harness's scales are powers of two), so these rows are held to the float64 reference of the
dequantised cache like any other. Mutants of the call (the scales as 1.0, swapped, or the mode left at
NONE, which casts the entries unscaled: what the adapter passed before fp8 was wired) fail the same rows.
Needs vllm (tools/install-deployed.sh vllm); skipped with the reason otherwise.
"""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.vllm import _lib, attention
from helpers import KERNEL, run_one

pytestmark = pytest.mark.interpreter

CASES = [
    "decode/b2-l40-h4x2-d32-p16-fp8_e4m3-fp16",  # split-K (3D) path
    "extend/b2-q12-pre20-h4x2-d32-p16-fp8_e4m3-fp16",  # 2D path; new tokens saved quantized first
    "decode/b3-l70-mixed-h4x2-d32-p16-swa7-cap30-sink-fp8_e4m3-fp32",
    # tree_verify's fp8 rows run on CUDA only: the interpreter misreads its qq_bias mask (INTERPRETER_TREE)
]


@pytest.mark.parametrize("case_id", CASES)
def test_fp8_rows_pass_with_the_layers_scales(vllm, case_id):
    r = run_one(case_id, vllm, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert "fp8 per-tensor k/v descales" in r.prepare_info["variant"]


def _ones(x, batch, heads_kv):
    k, v, mode = REAL(x, batch, heads_kv)
    return torch.ones_like(k), torch.ones_like(v), mode


def _swapped(x, batch, heads_kv):
    k, v, mode = REAL(x, batch, heads_kv)
    return v, k, mode


def _unscaled(x, batch, heads_kv):
    k, v, _ = REAL(x, batch, heads_kv)
    return k, v, _lib.kv_quant_mode().NONE


REAL = attention.descales


@pytest.mark.parametrize("mutant", [_ones, _swapped, _unscaled], ids=["scales-1.0", "swapped", "mode-none"])
@pytest.mark.parametrize("case_id", [CASES[0], CASES[1]])
def test_a_wrong_scale_call_fails_the_rows(vllm, monkeypatch, mutant, case_id):
    monkeypatch.setattr(attention, "descales", mutant)
    r = run_one(case_id, vllm, **KERNEL)
    assert r.status == "fail", f"{mutant.__name__}: {r.status} {r.reason}"


def test_tree_verify_on_the_cpu_is_a_skip_naming_the_interpreters_and(monkeypatch):
    """Triton's interpreter evaluates `a >= 0 and a < n` on tensors as Python's `and`; compiled Triton as an
    elementwise and. tree_verify (qq_bias) is therefore a CPU skip; on CUDA it runs."""
    import triton
    import triton.language as tl

    @triton.jit
    def both(out):
        a = tl.arange(0, 8) - 4
        m = a >= 0 and a < 2
        tl.store(out + tl.arange(0, 8), m.to(tl.int32))

    out = torch.zeros(8, dtype=torch.int32)
    both[(1,)](out)
    # fails once the interpreter gives [0, 0, 0, 0, 1, 1, 0, 0]: then the skip can go
    assert out.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    b = get_backend("vllm")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    case_id = "tree_verify/b2-pre20-h4x2-d16-p16-treeeagle-depth3-k2-n6-fp8_e4m3-fp16"
    assert "Python's `and`" in b.limits(Case.from_id(case_id, "cpu"))
    assert b.limits(Case.from_id(case_id, "cuda")) is None


def test_descales_are_the_layers_scales_expanded_as_vllms_backend_builds_them(vllm):
    case = Case.from_id(CASES[0], "cpu")
    x = case.make_inputs()
    k, v, mode = attention.descales(x, 2, 2)
    assert k.shape == v.shape == (2, 2) and k.dtype == v.dtype == torch.float32
    assert k.stride() == v.stride() == (0, 0)  # layer._k_scale.expand(descale_shape)
    assert float(k[0, 0]) == float(x.k_scale) and float(v[0, 0]) == float(x.v_scale)
    assert float(x.k_scale) != float(x.v_scale)  # the harness makes them differ (a swap is seen)
    assert mode == _lib.kv_quant_mode().FP8_PER_TENSOR
    plain = Case.from_id("decode/b2-l40-h4x2-d32-p16-fp16", "cpu").make_inputs()
    k, v, mode = attention.descales(plain, 2, 2)
    assert float(k.min()) == float(k.max()) == 1.0 and mode == _lib.kv_quant_mode().NONE
