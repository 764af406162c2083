"""The float64 model of SGLang's MHA decode with one key (docs/findings/repro/sglang_decode_one_key.py:
`one_key_as_compiled`, the sm_90 code's lane-wise scores) against the H100 run of that reproducer
(reports/examples/h100-session17/findings-diag/one_key.txt): the model must predict each variant's printed
max |o - v|, where it is and both values, from the committed inputs alone (CPU; no SGLang needed)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "docs" / "findings" / "repro" / "sglang_decode_one_key.py"
GPU_OUT = ROOT / "reports" / "examples" / "h100-session17" / "findings-diag" / "one_key.txt"


@pytest.fixture(scope="module")
def repro():
    spec = importlib.util.spec_from_file_location("repro_one_key", REPRO)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gpu_lines():
    """{variant: the text after 'max |o - v| = '} of the H100 run."""
    out = {}
    for line in GPU_OUT.read_text().splitlines():
        m = re.match(r"(\S+)(?: \(x\d+\))?\s+max \|o - v\| = (.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def variants(d):
    q, k, v = d["q"], d["k_buf"][d["kv_indices"]], d["v_buf"][d["kv_indices"]]
    return {
        "adapter": (q, k, v),
        "small-q": ((q.float() / 16).to(q.dtype), k, v),
        "fp16": (q.half(), k.half(), v.half()),
        "fp32": (q.float(), k.float(), v.float()),
    }


@pytest.mark.parametrize("name", ["adapter", "small-q", "fp16", "fp32"])
def test_model_predicts_the_h100_run(repro, name):
    d = repro.load(repro.DEFAULT_INPUTS)
    q, k, v = variants(d)[name]
    o = repro.predicted_o(q, k, v, d["sm_scale"])
    worst, where = repro.worst_diff(o, v)
    assert f"{worst:.4g}{where}" == gpu_lines()[name]


def test_model_is_v_where_lanes_agree(repro):
    """A 16-aligned head dim (pad-d16) and the grouped kernel: every lane holds one score, o == v (H100: 0)."""
    d = repro.load(repro.DEFAULT_INPUTS)
    q, k, v = variants(d)["adapter"]
    pad = lambda t: torch.nn.functional.pad(t, (0, 3))  # noqa: E731
    assert torch.equal(repro.predicted_o(pad(q), pad(k), pad(v), d["sm_scale"]), pad(v).double())
    assert gpu_lines()["pad-d16"] == "0" and gpu_lines()["grouped"] == "0"


def test_lanes_disagree_only_through_the_contracted_first_step(repro):
    """The adapter's worst head: lanes 0-7 and 8-15 round the fma differently; with the first step a plain
    add (each product rounded first, as with enable_fp_fusion=False) every lane agrees."""
    d = repro.load(repro.DEFAULT_INPUTS)
    q, k, _ = variants(d)["adapter"]
    s = repro.lane_scores(q[0, 3], k[0, 3])
    assert s[:8].unique().tolist() == [-17.5] and s[8:].unique().tolist() == [-17.75]
    prod = torch.zeros(16, dtype=torch.float64)
    prod[:13] = repro.rnd(q[0, 3].double() * k[0, 3].double(), torch.bfloat16)
    lane = torch.arange(16)
    for m in (8, 4, 2, 1):
        prod = repro.rnd(prod + prod[lane ^ m], torch.bfloat16)
    assert prod.unique().numel() == 1


def test_rnd_rounds_once(repro):
    """1 + 2^-8 + 2^-30 is above the bf16 midpoint: once-rounded 1 + 2^-7; float32 first would tie to 1."""
    x = torch.tensor([1 + 2**-8 + 2**-30], dtype=torch.float64)
    assert repro.rnd(x, torch.bfloat16).item() == 1 + 2**-7
    assert x.to(torch.bfloat16).double().item() == 1.0  # torch's conversion rounds twice


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rnd_matches_torch_on_float32_values(repro, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, generator=g, dtype=torch.float32) * torch.logspace(-10, 6, 20000).float()
    x = torch.cat([x, torch.tensor([65504.0, 65519.0, 65520.0, 1e-7, -3e-6, 0.0])])  # fp16 overflow, subnormals
    assert torch.equal(repro.rnd(x.double(), dtype), x.to(dtype).double())
