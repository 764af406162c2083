"""Variants of our chunked GDN prefill (gdn_chunk.py) on the CPU (TRITON_INTERPRET=1): the T kernel's
`TriConfig.kk` / `TriConfig.diag` / `TriConfig.wu` and the output fused into the state pass (`fuse_out`) each pass the
harness's float64 checks, and agree with the default kernels to within bf16 rounding of the output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from attnbench.backend import get_backend  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.check.prepared import call_untimed  # noqa: E402
from attnbench.kernels.triton import gdn_backend, gdn_chunk  # noqa: E402
from attnbench.kernels.triton.limits import interpreting  # noqa: E402
from helpers import KERNEL, run_one  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreting(), reason="runs our Triton kernels under TRITON_INTERPRET=1")

# two requests of mixed length (a partial last chunk, one without an initial state), grouped v-heads
CASE = "gdn_extend/b2-t70-h1x2-d32x16-initmixed-bf16"
VARIANTS = {
    "blocks": (gdn_chunk.TriConfig(kk="blocks"), ""),
    "subst": (gdn_chunk.TriConfig(diag="subst"), ""),
    "fused": (gdn_chunk.TRI, "tri"),
    "blocks-subst-fused": (gdn_chunk.TriConfig(kk="blocks", diag="subst"), "tri"),
    "fused-loop": (gdn_chunk.TRI, "loop"),
    "fused-wu": (gdn_chunk.TRI, "wu"),
    "tri-wu": (gdn_chunk.TriConfig(wu=True), ""),
    "tri-wu-subst-fused-loop": (gdn_chunk.TriConfig(diag="subst", wu=True), "loop"),
}


def _run(tri, fuse_out):
    case = Case.from_id(CASE)
    x = case.make_inputs()
    gdn_backend.prepare_gdn_extend(case, x, tri, fuse_out)()
    return x.o.float(), x.state_pool.clone()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_agrees_with_the_default(name):
    o0, s0 = _run(gdn_chunk.TRI, "")
    o1, s1 = _run(*VARIANTS[name])
    assert o0.abs().max() > 0 and torch.isfinite(o1).all()
    # the same math rounded at the same points: differences come from float32 summation order only,
    # so at most a bf16 ulp or two of the output and float32-level differences of the state
    torch.testing.assert_close(o1, o0, rtol=2**-7, atol=1e-5)
    torch.testing.assert_close(s1, s0, rtol=1e-4, atol=1e-6)


def test_fused_plans_have_no_chunk_state_workspace():
    p = gdn_chunk.plan([70, 3], 1, 2, 32, 16, torch.bfloat16, "cpu", fuse_out="tri")
    assert p.h is None and p.vnew is None and p.qhat.shape == (73, 1, 32) and p.amat.shape == (73, 2, 64)
    loop = gdn_chunk.plan([70, 3], 1, 2, 32, 16, torch.bfloat16, "cpu", fuse_out="loop")
    assert loop.h is None and loop.vnew is None and loop.qhat is None and loop.amat is None and loop.w is not None
    wu = gdn_chunk.plan([70, 3], 1, 2, 32, 16, torch.bfloat16, "cpu", fuse_out="wu")
    assert wu.w is None and wu.u is None and wu.h is None and wu.qhat is None
    q = gdn_chunk.plan([70, 3], 1, 2, 32, 16, torch.bfloat16, "cpu")
    assert q.h.shape == (3, 2, 32, 16) and q.qhat is None
    with pytest.raises(ValueError, match="fuse_out"):
        gdn_chunk.plan([70], 1, 2, 32, 16, torch.bfloat16, "cpu", fuse_out=True)
    tw = gdn_chunk.plan([70, 3], 1, 2, 32, 16, torch.bfloat16, "cpu", tri=gdn_chunk.TriConfig(wu=True))
    assert tw.tmat is None and tw.w.shape == (73, 2, 32) and tw.u.shape == (73, 2, 16)
    with pytest.raises(ValueError, match="wu"):
        gdn_chunk.plan([70], 1, 2, 32, 16, torch.bfloat16, "cpu", "wu", gdn_chunk.TriConfig(wu=True))


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_the_state_pass_on_the_transposed_state_agrees_with_the_default(layout):
    """`gdn_state_regs`: the same recurrence rounded at the same points, the state held as S^T (its
    products summed in another order), so the default's output to a bf16 ulp or two and its final states
    to float32 accuracy, on either pool layout; the full chunks and the partial last one both run."""
    case = Case.from_id(GROUPED)
    runs = []
    for regs in (False, True):
        x = case.make_inputs()
        run = gdn_backend.prepare_gdn_extend(case, x, gdn_chunk.TRI, "", 1, layout, regs)
        call_untimed(run)
        runs.append((x.o.float(), x.state_pool.clone(), run.info["state_regs"]))
    (o0, s0, r0), (o1, s1, r1) = runs
    assert (r0, r1) == (False, True) and o0.abs().max() > 0 and torch.isfinite(o1).all()
    torch.testing.assert_close(o1, o0, rtol=2**-7, atol=1e-5)
    torch.testing.assert_close(s1, s0, rtol=1e-4, atol=1e-6)


def test_the_output_kernel_computes_its_columns_in_blocks_as_in_one(monkeypatch):
    """The tuner's split-column configs: a program's BV columns BVI at a time give the one-block output (the
    interpreter runs only a tuner's first config, so the split one is forced on the default tuner here: 32
    columns in two blocks of 16, against `gdn_out=narrow`'s one block)."""
    case = Case.from_id("gdn_extend/b2-t70-h1x2-d32x32-initmixed-bf16")
    split = gdn_chunk.OUT_TUNED[""]
    monkeypatch.setattr(split, "configs", [triton.Config({"BV": 32, "BVI": 16}, num_warps=4, num_stages=2)])
    runs = []
    for out in ("narrow", ""):
        x = case.make_inputs()
        run = gdn_backend.prepare_gdn_extend(case, x, gdn_chunk.TRI, "", 1, "kv", False, out)
        call_untimed(run)
        runs.append((x.o.float(), run.info["out_tune"]))
    (o0, t0), (o1, t1) = runs
    assert (t0, t1) == ("narrow", "") and o0.abs().max() > 0
    torch.testing.assert_close(o1, o0, rtol=2**-7, atol=1e-5)


def test_the_output_kernel_is_tuned_per_size_of_its_launch(monkeypatch):
    """The output kernel's tuner key holds the launch's size bucket (`rows_key`), not the head dims alone: on an
    H200 a config tuned on a T = 1024 request served T = 32768 (h200-session28). Every name in the key must be
    an argument of the launch (Triton's tuner drops unknown names from its key without a word)."""
    tuner = gdn_chunk.OUT_TUNED[""]
    keys: list[dict] = []
    real = tuner.run

    def spy(*args, **kwargs):
        given = {**dict(zip(tuner.arg_names, args)), **kwargs}
        assert set(tuner.keys) <= set(given), f"tuner keys {tuner.keys} not all passed: {sorted(given)}"
        keys.append({k: given[k] for k in tuner.keys})
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner, "run", spy)
    for t in (70, 700):  # 2 and 11 chunks of one request over two v-heads
        case = Case.from_id(f"gdn_extend/b1-t{t}-h1x2-d32x16-bf16")
        call_untimed(gdn_backend.prepare_gdn_extend(case, case.make_inputs(), gdn_chunk.TRI, ""))
    assert [k["ROWS_KEY"] for k in keys] == [gdn_chunk.rows_key(2, 2), gdn_chunk.rows_key(11, 2)] == [4, 32]
    assert [gdn_chunk.rows_key(n, 32) for n in (16, 17, 512)] == [512, 1024, 16384]


def test_float32_inputs_tune_the_output_kernel_over_its_one_block_configs():
    """The split-column configs are timed on 16-bit inputs only; float32 (IEEE dots) keeps `gdn_out=narrow`."""
    for dtype, want in (("fp32", "narrow"), ("bf16", "")):
        case = Case.from_id(f"gdn_extend/b2-t70-h1x2-d32x16-{dtype}")
        assert gdn_backend.prepare_gdn_extend(case, case.make_inputs()).info["out_tune"] == want


def test_every_tuner_key_names_an_argument_of_its_kernel():
    """A key name that is not an argument of the kernel is dropped from the tuner's key without a word (Triton
    3.6 `Autotuner.run`), so one config would serve every size: every autotuned kernel of our Triton package."""
    import importlib
    import pkgutil

    from triton.runtime.autotuner import Autotuner

    import attnbench.kernels.triton as pkg

    tuners = {}
    for m in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
        for name, obj in vars(mod).items():
            for i, t in enumerate(obj.values() if isinstance(obj, dict) else [obj]):
                if isinstance(t, Autotuner):
                    tuners[f"{m.name}.{name}[{i}]"] = t
    assert "gdn_chunk.OUT_TUNED[0]" in tuners and len(tuners) >= 5
    bad = {n: sorted(set(t.keys) - set(t.arg_names)) for n, t in tuners.items() if not set(t.keys) <= set(t.arg_names)}
    assert not bad


@pytest.mark.parametrize("field", ["kk", "diag"])
def test_tri_config_rejects_unknown_values(field):
    with pytest.raises(ValueError, match=field):
        gdn_chunk.TriConfig(**{field: "bogus"})


# four v-heads over two q/k heads: head groups of 2 and of 4 heads keep each q/k head's v-heads together
GROUPED = "gdn_extend/b2-t70-h2x4-d32x16-initmixed-bf16"


@pytest.mark.parametrize("groups", [2, 4])
def test_head_groups_compute_what_one_launch_does(groups):
    """Each group's kernels address its heads through pointers moved to its first head; every head's
    arithmetic is the ungrouped kernels', so the output and the pool agree bit for bit."""
    case = Case.from_id(GROUPED)
    runs = []
    for g in (1, groups):
        x = case.make_inputs()
        run = gdn_backend.prepare_gdn_extend(case, x, gdn_chunk.TRI, "", g)
        run()
        runs.append((x.o.clone(), x.state_pool.clone(), run.info["head_groups"]))
    (o0, s0, g0), (o1, s1, g1) = runs
    assert (g0, g1) == (1, 2) and o0.abs().max() > 0  # H=2, HV=4: at most 2 groups of whole GQA groups
    assert torch.equal(o1, o0) and torch.equal(s1, s0)


def test_head_groups_keep_gqa_groups_whole():
    assert gdn_chunk.head_groups(32, 32, 4) == 4
    assert gdn_chunk.head_groups(16, 32, 16) == 16  # 2 v-heads per q/k head: 16 groups of 2
    assert gdn_chunk.head_groups(16, 32, 32) == 16
    assert gdn_chunk.head_groups(1, 2, 2) == 1
    assert gdn_chunk.head_groups(4, 12, 8) == 4  # 12 v-heads: 4 groups of 3 (one q/k head each)
    with pytest.raises(ValueError, match="head groups"):
        gdn_chunk.plan([70], 1, 2, 32, 16, torch.bfloat16, "cpu", fuse_out="tri", groups=2)


def test_float32_inputs_keep_gamma_in_float64():
    """Float32 inputs: gamma (the in-chunk cumulative log decay) is float64 and exact to float64 whatever
    the order of the sum; a float32 gamma of |gamma| ~ 100 is off by ~4e-6 relative, which put a float32
    smoke case 3.4x over its state bound on an H200 (`gdn_chunk.gamma_dtype`). Here the gates decay hard
    (gamma down to about -190 per chunk), so a float32 sum could not match the float64 one to 1e-12."""
    case = Case.from_id("gdn_extend/b2-t70-h1x2-d32x16-fp32")
    x = case.make_inputs()
    x.g = -3.0 * torch.rand_like(x.g) - 1.0
    lens = list(x.lens_host)
    p = gdn_chunk.plan(lens, 1, 2, 32, 16, torch.float32, "cpu")
    assert p.gcum.dtype == torch.float64
    assert gdn_chunk.plan(lens, 1, 2, 32, 16, torch.bfloat16, "cpu").gcum.dtype == torch.float32
    gdn_chunk._chunk_cumsum_kernel[(p.chunks.shape[0], 2)](x.g, p.gcum, p.chunks, x.cu_seqlens, HV=2, C=gdn_chunk.CHUNK)
    want = torch.cat(
        [x.g[s : s + c].double().cumsum(0) for s0, n in zip(x.cu_seqlens[:-1].tolist(), lens)
         for s in range(s0, s0 + n, gdn_chunk.CHUNK) for c in [min(gdn_chunk.CHUNK, s0 + n - s)]]
    )  # fmt: skip
    assert want.abs().max() > 100
    torch.testing.assert_close(p.gcum, want, rtol=1e-12, atol=0)


def _tree_cumsum(a, axis):
    """An inclusive scan in the order of a GPU's parallel one (Hillis-Steele: log2(n) rounds of adding the
    value 2^r places back), in the input's dtype."""
    x = np.array(a, copy=True)
    n, s = x.shape[axis], 1
    while s < n:
        back = np.zeros_like(x)
        src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        src[axis], dst[axis] = slice(0, n - s), slice(s, n)
        back[tuple(dst)] = x[tuple(src)]
        x, s = x + back, 2 * s
    return x


@pytest.mark.parametrize(
    "case_id",
    ["gdn_extend/b1-t64-h2x6-d16x16-initnone-scale0.4-fp32", "gdn_extend/b1-t300-h1x4-d16x16-initnone-scale0.4-fp32"],
)
def test_float32_inputs_pass_under_a_gpu_order_of_the_gamma_sum(monkeypatch, case_id):
    """The interpreter sums gamma in order, a GPU by a parallel scan: with a float32 gamma the first case passed
    here (state 8.7e-7) and was 3.4x over its bound on an H200 (8.1e-6; reports/examples/h200-session29). Both
    must pass under the interpreter with a GPU's scan order; with a float32 gamma they fail it (state 1.99e-6
    against 1.13e-6; o 1.29e-6 against 1.22e-6)."""
    from triton.runtime import interpreter

    def cumsum(self, input):
        return [self.to_tensor(_tree_cumsum(input.handle.data, self.axis), dtype=input.dtype)]

    monkeypatch.setattr(interpreter.ScanOps, "cumsum", cumsum)
    row = run_one(case_id, get_backend("triton"), **KERNEL)
    assert row.status == "pass", row.reason
