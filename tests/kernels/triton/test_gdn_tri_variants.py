"""tools/bench/gdn_tri_variants.py: each `triton-gdn-tri:<variant>` backend hands its frozen T-kernel
config through `prepare` to the kernel (no module global), and runs gdn_extend only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("triton")

from attnbench.backend import LOAD_PROBLEMS, all_backends, load_builtin, load_plugin  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.kernels.triton import gdn_chunk  # noqa: E402

PLUGIN = Path(__file__).resolve().parents[3] / "tools" / "bench" / "gdn_tri_variants.py"
CASE = "gdn_extend/b2-t70-h1x2-d32x16-initmixed-bf16"


def test_each_variant_passes_its_config_to_the_kernel(monkeypatch):
    load_builtin()
    load_plugin(str(PLUGIN))
    assert not [p for p in LOAD_PROBLEMS if "gdn_tri_variants" in p]
    seen = []
    monkeypatch.setattr(gdn_chunk, "chunk_gated_delta_rule", lambda *a, tri, **kw: seen.append(tri))
    variants = {n: b for n, b in all_backends().items() if n.startswith("triton-gdn-tri:")}
    assert "triton-gdn-tri:ieee" in variants
    case = Case.from_id(CASE)
    for name, b in variants.items():
        assert b.ops == {"gdn_extend"} and b.supports(case) is None, name
        b.prepare(case, case.make_inputs())()
        assert seen[-1] is type(b).tri and dataclasses.is_dataclass(seen[-1]), name
    all_backends()["triton"].prepare(case, case.make_inputs())()
    assert seen[-1] == gdn_chunk.TRI
    assert gdn_chunk.TriConfig.__dataclass_params__.frozen


def test_a_register_cap_reaches_the_compiled_launch_only(monkeypatch):
    """`TriConfig.maxnreg` is a compile option of the T kernel's launch on a GPU; the interpreter, which
    compiles nothing, is not handed it."""
    import torch

    launches = []

    class Kernel:  # records each launch's keyword arguments
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(kwargs)

    monkeypatch.setattr(gdn_chunk, "_chunk_tri_batched_kernel", Kernel())
    p = gdn_chunk.plan([70], 1, 2, 32, 16, torch.bfloat16, "cpu")
    k, beta, cu = torch.zeros(70, 1, 32, dtype=torch.bfloat16), torch.zeros(70, 2), torch.tensor([0, 70])
    for interpret in (False, True):
        monkeypatch.setattr(gdn_chunk, "INTERPRET", interpret)
        gdn_chunk.launch_tri(k, beta, cu, p, gdn_chunk.TRI)  # capped at 128 (session 28)
        gdn_chunk.launch_tri(k, beta, cu, p, gdn_chunk.TriConfig())
    assert [kw.get("maxnreg") for kw in launches] == [128, None, None, None]
