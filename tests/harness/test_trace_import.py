"""`attnbench trace import`: FlashInfer-Bench workloads (written here from its documented format) -> our trace."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.plan import trace
from attnbench.plan.trace_import import definition_params, read_safetensors

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def write_safetensors(path: Path, tensors: dict[str, list[int]], dtype: str = "I32") -> None:
    """The safetensors layout: u64 little-endian header size, a JSON header, raw little-endian data."""
    fmt = {"I32": "<i", "I64": "<q"}[dtype]
    header, data = {}, b""
    for name, values in tensors.items():
        raw = b"".join(struct.pack(fmt, v) for v in values)
        header[name] = {"dtype": dtype, "shape": [len(values)], "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def workload(definition: str, uuid: str, blob: str | None, sm_scale: float | None = None, stored=("kv_indptr",)) -> str:
    where = {"type": "safetensors", "path": blob} if blob else None
    inputs = {"q": {"type": "random"}, "k_cache": {"type": "random"}, "v_cache": {"type": "random"}}
    for name in stored:
        if where:
            inputs[name] = where | {"tensor_key": name}
    if sm_scale is not None:
        inputs["sm_scale"] = {"type": "scalar", "value": sm_scale}
    axes = {"len_indptr": 4, "num_kv_indices": 12}
    return json.dumps({"definition": definition, "workload": {"uuid": uuid, "axes": axes, "inputs": inputs},
                       "solution": None, "evaluation": None})  # fmt: skip


@pytest.fixture
def dataset(tmp_path):
    """A FlashInfer-Bench dataset root: workloads/<op_type>/<definition>.jsonl and blob/ beside them."""
    root = tmp_path / "flashinfer_trace"
    decode = "gqa_paged_decode_h32_kv8_d128_ps16"
    write_safetensors(root / "blob/workloads/gqa_paged" / f"{decode}_a.safetensors",
                      {"kv_indptr": [0, 1, 4, 12], "kv_indices": list(range(12)), "kv_last_page_len": [5, 16, 2]})  # fmt: skip
    prefill = "gqa_paged_prefill_causal_h32_kv8_d128_ps1"
    write_safetensors(root / "blob/workloads/gqa_paged" / f"{prefill}_b.safetensors",
                      {"qo_indptr": [0, 7, 8], "kv_indptr": [0, 7, 40], "kv_indices": list(range(40))}, "I64")  # fmt: skip
    mla = "mla_paged_decode_h16_ckv512_kpe64_ps1"
    write_safetensors(root / "blob/workloads/mla_paged" / f"{mla}_c.safetensors", {"kv_indptr": [0, 300, 301]})
    (root / "workloads/gqa_paged").mkdir(parents=True)
    (root / "workloads/mla_paged").mkdir(parents=True)
    gqa = root / "workloads/gqa_paged/gqa.jsonl"
    gqa.write_text("\n".join([
        workload(decode, "a", f"blob/workloads/gqa_paged/{decode}_a.safetensors", 0.08838834764831845,
                 ("kv_indptr", "kv_indices", "kv_last_page_len")),
        workload(prefill, "b", f"blob/workloads/gqa_paged/{prefill}_b.safetensors", None, ("qo_indptr", "kv_indptr")),
        json.dumps({"definition": "rmsnorm_h4096", "workload": {"uuid": "n", "axes": {}, "inputs": {}}}),
    ]) + "\n")  # fmt: skip
    (root / "workloads/mla_paged" / f"{mla}.jsonl").write_text(  # a bare workload: the file names its definition
        json.dumps(json.loads(workload(mla, "c", f"blob/workloads/mla_paged/{mla}_c.safetensors"))["workload"]) + "\n"
    )
    return root


def test_definition_names_map_onto_our_ops():
    assert definition_params("gqa_paged_decode_h32_kv8_d128_ps1") == (
        "decode", {"heads_q": 32, "heads_kv": 8, "head_dim": 128, "page_size": 1})  # fmt: skip
    op, p = definition_params("014_gqa_paged_prefill_causal_h32_kv4_d128_ps64")
    assert op == "extend" and p["new_kv"] == "shared" and p["page_size"] == 64
    op, p = definition_params("mla_paged_decode_h16_ckv512_kpe64_ps1")
    assert (op, p["mla"], p["head_dim"], p["head_dim_v"], p["heads_kv"]) == ("decode", True, 576, 512, 1)
    assert definition_params("gemm_n4096_k4096") is None
    assert definition_params("gqa_ragged_prefill_causal_h32_kv8_d128") is None


def test_import_reads_lengths_from_the_stored_index_tensors(dataset, tmp_path):
    out = tmp_path / "imported.jsonl"
    files = [dataset / "workloads/gqa_paged/gqa.jsonl", *(dataset / "workloads/mla_paged").glob("*.jsonl")]
    res = invoke("trace", "import", *files, "-o", out)
    assert res.exit_code == 0, res.output
    assert "wrote 3 batches (decode 2, extend 1)" in res.output and "rmsnorm_h4096 (1)" in res.output
    decode, prefill, mla = (json.loads(line) for line in out.read_text().splitlines())
    assert decode["kv_lens"] == [5, 2 * 16 + 16, 7 * 16 + 2]  # full pages of 16, then the last page's length
    assert decode["sm_scale"] == pytest.approx(128**-0.5) and decode["source"].endswith("ps16 a")
    assert (prefill["q_lens"], prefill["kv_lens"], prefill["new_kv"]) == ([7, 1], [7, 33], "shared")
    assert mla["kv_lens"] == [300, 1] and mla["mla"] is True
    batches = trace.read(out)  # what was written replays
    assert [b.case.op.request_lengths(b.case.params, 0)[0] for b in batches] == [[5, 48, 114], [7, 33], [300, 1]]
    assert batches[1].case.params.prefix_lens == (0, 32)


def test_a_workload_without_stored_lengths_names_its_line_and_writes_nothing(dataset, tmp_path):
    f = dataset / "workloads/gqa_paged/random.jsonl"
    f.write_text(workload("gqa_paged_decode_h32_kv8_d128_ps1", "r", "blob/workloads/gqa_paged/x.safetensors") + "\n"
                 + workload("gqa_paged_decode_h32_kv8_d128_ps1", "s", None) + "\n")  # fmt: skip
    out = tmp_path / "o.jsonl"
    res = invoke("trace", "import", f, "-o", out)
    assert res.exit_code == 2 and f"{f}:1: kv_indptr: blob/workloads/gqa_paged/x.safetensors not found" in res.output
    f.write_text(workload("gqa_paged_decode_h32_kv8_d128_ps1", "s", None) + "\n")
    res = invoke("trace", "import", f, "-o", out)
    assert res.exit_code == 2 and f"{f}:1: kv_indptr is not stored (type random)" in res.output
    f.write_text("{oops\n")
    res = invoke("trace", "import", f, "-o", out)
    assert res.exit_code == 2 and f"{f}:1: not JSON" in res.output
    assert not out.exists() and "Traceback" not in res.output


def test_a_broken_index_tensor_is_refused(tmp_path):
    blob = tmp_path / "b.safetensors"
    write_safetensors(blob, {"kv_indptr": [0, 5, 3]})
    f = tmp_path / "w.jsonl"
    f.write_text(workload("gqa_paged_decode_h32_kv8_d128_ps1", "x", "b.safetensors") + "\n")
    res = invoke("trace", "import", f, "-o", tmp_path / "o.jsonl")
    assert res.exit_code == 2 and "kv_indptr is not an index pointer" in res.output
    blob.write_bytes(blob.read_bytes()[:-2])
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors(blob, "kv_indptr")
