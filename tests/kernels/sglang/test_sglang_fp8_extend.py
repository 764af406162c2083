"""SGLang's extend kernels over an fp8 KV cache with the layer's k/v scales (issue #36): `extend_attention_fwd`
(extend, and tree_verify as SGLang's server runs target verify) and `extend_attention_fwd_unified`
(`sglang-unified`), under TRITON_INTERPRET=1 on tiny fp16 cases.

Both kernels round the query and P to the cache's fp8 dtype (docs/findings.md), so their rows fail the
float64 check by design; what these tests hold them to is a float64 model of that rounding with the
case's scales (tests/support/sglang_fp8_model.py), within two units of the harness's floor (the
output's rounding and float32 sums). The scales are powers of two from 2^-14 to 2^-5 here, so a
call that passes 1.0 for them, or swaps them, is orders of magnitude off the model.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from attnbench.case import Case
from attnbench.check.tolerance import Rule
from attnbench.kernels.sglang import attention as attn
from sglang_env import sglang_backend_or_skip

pytestmark = pytest.mark.interpreter

CPU_BLOCK_N = 64  # SGLang's extend key block off CUDA (`_get_block_sizes_for_extend_attention`, Lq <= 128)

CASES = [
    ("sglang", "extend/b2-q6-pre13-h4x2-d16-p4-kvattend-fp8_e4m3-fp16"),  # new tokens never stored
    ("sglang", "extend/b3-q9-pre70-mixed-h4x2-d16-p4-custom-fp8_e4m3-fp16"),  # saved first; prefix of 2 blocks
    ("sglang", "extend/b2-q7-pre19-h4x4-d16-p4-fp8_e5m2-fp16"),
    ("sglang", "tree_verify/b2-pre20-h4x2-d16-p4-treeeagle-depth3-k2-n6-fp8_e4m3-fp16"),
    ("sglang-unified", "extend/b3-q9-pre70-mixed-h4x2-d16-p4-custom-fp8_e4m3-fp16"),
    ("sglang-unified", "extend/b2-q6-pre13-h4x2-d16-p4-fp8_e4m3-fp16"),
]


def _off_the_model(backend: str, case_id: str) -> tuple[float, float]:
    """(max |o - model|, the bound) of the backend's closure on the case."""
    from sglang_fp8_model import sglang_fp8_extend

    b = sglang_backend_or_skip(backend)
    case = Case.from_id(case_id)
    x = case.make_inputs()
    pristine = copy.deepcopy(x)
    o = b.prepare(case, x)()["o"].double()
    model = sglang_fp8_extend(pristine, unified=backend == "sglang-unified", block_n=CPU_BLOCK_N)
    keys = case.params.keys
    bound = 2 * Rule().floor_abs(case.torch_dtype, float(model.abs().max()), math.sqrt(case.params.head_dim + keys))
    return float((o - model).abs().max()), bound


@pytest.mark.parametrize("backend, case_id", CASES)
def test_kernel_is_the_model_of_its_fp8_rounding_with_the_layers_scales(backend, case_id):
    err, bound = _off_the_model(backend, case_id)
    assert err <= bound, f"{err:.3g} off the model (bound {bound:.3g})"


@pytest.mark.parametrize("backend, case_id", [CASES[1], CASES[3], CASES[4]], ids=["extend", "tree_verify", "unified"])
@pytest.mark.parametrize("wrong", ["ignored", "swapped"])
def test_scales_passed_as_one_or_swapped_miss_the_model(backend, case_id, wrong, monkeypatch):
    """The model test can fail: the same calls with k_scale = v_scale = 1.0 (what the adapter passed before
    issue #36) or with the two swapped are far off it."""
    right = attn.layer_scales
    broken = {"ignored": lambda x: (1.0, 1.0), "swapped": lambda x: right(x)[::-1]}[wrong]
    monkeypatch.setattr(attn, "layer_scales", broken)
    err, bound = _off_the_model(backend, case_id)
    assert err > 50 * bound, f"{err:.3g} off the model (bound {bound:.3g})"


def test_the_models_rounding_is_what_fails_the_float64_check():
    """The model itself (q and P in fp8, as the kernel rounds them here) is off float64 by far more than the
    harness's bound for the row: the extend rows fail on that rounding, not on the scales."""
    from sglang_fp8_model import sglang_fp8_extend

    case = Case.from_id(CASES[0][1])
    x = case.make_inputs()
    ref = case.op.expected(case.params, x, torch.float64)["o"]
    twin = case.op.expected(case.params, x, case.torch_dtype)["o"].double()
    model = sglang_fp8_extend(x, unified=False, block_n=CPU_BLOCK_N)
    keys = case.params.keys
    bound = Rule().bound(
        float((twin - ref).abs().max()), case.torch_dtype, float(ref.abs().max()), math.sqrt(16 + keys)
    )
    assert float((model - ref).abs().max()) > 10 * bound
