"""Backend knobs as an axis: `-b NAME:k=v`, a suite's `backends:` variants, labels through every output."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attnbench.backend import get_backend, parse_backend
from attnbench.cli.app import app
from attnbench.errors import AttnbenchError
from attnbench.store.results import read_results

runner = CliRunner()
CASE = "decode/b2-l300-h4x2-d64-p16-bf16"
ENTRY = "  - op: decode\n    params: {batch: 2, kv_len: 300, heads_q: 4, heads_kv: 2, head_dim: 64, page_size: 16}\n"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _one_line_error(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    text = " ".join(res.output.split())
    for w in words:
        assert w in text, res.output


def test_spec_and_label_name_one_variant():
    assert parse_backend("triton:split_keys=64,block_n=32") == ("triton", {"split_keys": "64", "block_n": "32"})
    a, b = get_backend("triton:block_n=32,split_keys=64"), get_backend("triton[split_keys=64,block_n=32]")
    assert a is b and a.name == "triton[block_n=32,split_keys=64]" and a.settings == {"split_keys": 64, "block_n": 32}
    assert get_backend("triton").settings == {} and get_backend("triton").name == "triton"


@pytest.mark.parametrize(
    "spec, words",
    [
        ("triton:splits=8", ["no knob 'splits'", "split_keys (64, 128", "block_n (16, 32"]),
        ("triton:split_keys=100", ["split_keys='100' is not allowed", "64, 128, 256"]),
        ("triton:split_keys", ["k=v pairs"]),
        ("torch:split_keys=64", ["backend 'torch' has no knob 'split_keys'", "its knobs: none"]),
    ],
)
def test_bad_knobs_are_exit_2_naming_the_valid_ones(spec, words):
    with pytest.raises(AttnbenchError):
        get_backend(spec)
    _one_line_error(invoke("sweep", "--case", CASE, "-b", spec, "--device", "cpu", "--dry-run"), *words)


def test_a_bad_knob_in_a_suite_is_exit_2_at_its_line(tmp_path):
    suite = tmp_path / "k.yaml"
    suite.write_text(f"backends:\n  - torch\n  - 'triton:nope=1'\ndtypes: [bf16]\ncases:\n{ENTRY}")
    _one_line_error(invoke("sweep", suite, "--device", "cpu", "--dry-run"), f"{suite}:3:", "no knob 'nope'")


def test_knob_variants_run_side_by_side_and_reach_the_kernel(tmp_path):
    """A suite sweeping the Triton decode's split size (interpreter): each variant is a backend of its own
    in results, summary and report, passes the float64 check, and its value reaches the launch."""
    suite = tmp_path / "k.yaml"
    suite.write_text(
        "backends: [triton, 'triton:split_keys=64', 'triton:split_keys=128,block_n=32']\n"
        f"dtypes: [bf16]\ncases:\n{ENTRY}"
    )
    out = tmp_path / "run"
    res = invoke("sweep", suite, "--device", "cpu", "--no-timing", "--out", out)
    assert res.exit_code == 0, res.output
    rows = {r.backend: r for r in read_results(out / "results.jsonl")}
    assert set(rows) == {"triton", "triton[split_keys=64]", "triton[block_n=32,split_keys=128]"}
    assert all(r.status == "pass" for r in rows.values()), {b: r.reason for b, r in rows.items()}
    splits = {b: r.prepare_info["max_splits"] for b, r in rows.items()}
    assert splits == {"triton": 1, "triton[split_keys=64]": 5, "triton[block_n=32,split_keys=128]": 3}
    assert rows["triton[block_n=32,split_keys=128]"].prepare_info["config"]["block_n"] == 32
    assert "triton[split_keys=64]" in res.output  # the console keeps the label (no markup eaten)
    assert "triton[split_keys=64]" in (out / "summary.md").read_text()


def test_backend_patterns_expand_in_order_once_each():
    from attnbench.backend import select_backends
    from attnbench.errors import AttnbenchError

    names = [b.name for b in select_backends(["torch", "triton*", "triton", "triton:block_n=32"])]
    assert names == ["torch", "triton", "triton-det", "triton[block_n=32]"]
    with pytest.raises(AttnbenchError, match="no backend matches 'nope\\*'; available: .*torch"):
        select_backends(["nope*"])


def test_split_policy_knobs_reach_the_decode_plan(tmp_path):
    """decode.SplitPolicy's fields as knobs (interpreter): a shorter `min_split` cuts the 300-key requests
    that the default plan keeps whole, and both pass the float64 check; the policy object stays frozen."""
    import dataclasses

    from attnbench.kernels.triton.decode import SPLITS

    assert dataclasses.is_dataclass(SPLITS) and type(SPLITS).__dataclass_params__.frozen
    suite = tmp_path / "k.yaml"
    suite.write_text(
        f"backends: [triton, 'triton:min_split=64', 'triton:fill_keys=4096']\ndtypes: [bf16]\ncases:\n{ENTRY}"
    )
    out = tmp_path / "run"
    res = invoke("sweep", suite, "--device", "cpu", "--no-timing", "--out", out)
    assert res.exit_code == 0, res.output
    rows = {r.backend: r for r in read_results(out / "results.jsonl")}
    assert all(r.status == "pass" for r in rows.values()), {b: r.reason for b, r in rows.items()}
    splits = {b: r.prepare_info["max_splits"] for b, r in rows.items()}
    assert splits == {"triton": 1, "triton[min_split=64]": 2, "triton[fill_keys=4096]": 1}, splits
    _one_line_error(invoke("sweep", "smoke", "-b", "triton:fill_ctas=9"), "fill_ctas='9' is not allowed", "1, 2, 3, 4")
