"""`attnbench trace import`: FlashInfer-Bench workload traces -> attnbench's trace format (docs/trace.md).

FlashInfer-Bench (flashinfer-ai/flashinfer-bench, `docs/flashinfer_trace/workload.md`) stores the
workloads of one kernel definition as JSONL, one object a line: `{"definition": NAME, "workload":
{"uuid", "axes", "inputs"}, "solution": null, "evaluation": null}` (a bare workload object is read too;
its definition is then the file's stem). The definition name carries the constants
(`gqa_paged_decode_h32_kv8_d128_ps1`, `gqa_paged_prefill_causal_h32_kv8_d128_ps1`,
`mla_paged_decode_h16_ckv512_kpe64_ps1`, `mla_paged_prefill_causal_h16_ckv512_kpe64_ps1`); the
per-request lengths are tensors (`kv_indptr`, `qo_indptr`, `kv_last_page_len`) stored in safetensors
files whose paths are relative to the dataset's root. We read those files ourselves (an 8-byte
header length, a JSON header, raw little-endian data), driving no library.

Keys per request: pages × page size, the last page holding `kv_last_page_len` (all pages full
without it, exact at page size 1); a paged prefill's keys include its new tokens, so extend lines
carry `kv_lens` with `new_kv: shared` (the cache already holds every token). Workloads of other
definitions (GEMM, norms, MoE, ragged prefill, ...) are counted and left out.
"""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.errors import SuiteError
from attnbench.plan import trace

_GQA = re.compile(r"^gqa_paged_(decode|prefill_causal)_h(\d+)_kv(\d+)_d(\d+)_ps(\d+)$")
_MLA = re.compile(r"^mla_paged_(decode|prefill_causal)_h(\d+)_ckv512_kpe64_ps(\d+)$")
_DTYPES = {"I32": ("<i", 4), "I64": ("<q", 8), "U32": ("<I", 4), "U64": ("<Q", 8)}


@dataclass
class Imported:
    """What an import produced: trace lines (dicts) and the workloads left out, by definition."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)


def definition_params(name: str) -> tuple[str, dict[str, Any]] | None:
    """(op, parameters) of a FlashInfer-Bench definition name, or None when attnbench has no op for it.

    A numbered prefix (`014_gqa_...`, as benchmark collections name them) is ignored.
    """
    name = re.sub(r"^\d+_", "", name)
    if m := _GQA.match(name):
        kind, hq, hkv, d, ps = m.groups()
        params = {"heads_q": int(hq), "heads_kv": int(hkv), "head_dim": int(d), "page_size": int(ps)}
    elif m := _MLA.match(name):
        kind, hq, ps = m.groups()
        params = {"mla": True, "heads_q": int(hq), "heads_kv": 1, "head_dim": 576, "head_dim_v": 512}
        params["page_size"] = int(ps)
    else:
        return None
    if kind == "decode":
        return "decode", params
    return "extend", params | {"new_kv": "shared"}  # FlashInfer's paged prefill: the cache holds the new tokens


def read_safetensors(path: Path, key: str) -> list[int]:
    """One 1-D integer tensor of a .safetensors file, as a list (ValueError saying what is wrong)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100 * 2**20:
                raise ValueError(f"{path}: a safetensors header of {size} bytes")
            header = json.loads(f.read(size))
            if key not in header:
                raise ValueError(
                    f"{path} holds no tensor {key!r} (it has {', '.join(k for k in header if k[:2] != '__')})"
                )
            meta = header[key]
            fmt, width = _DTYPES.get(meta.get("dtype"), (None, 0))
            if fmt is None:
                raise ValueError(f"{path}: tensor {key!r} is {meta.get('dtype')}, expected an integer dtype")
            start, end = meta["data_offsets"]
            f.seek(8 + size + start)
            raw = f.read(end - start)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except (struct.error, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
    if len(raw) != end - start or len(raw) % width:
        raise ValueError(f"{path}: tensor {key!r} is truncated")
    return [v for (v,) in struct.iter_unpack(fmt, raw)]


def _tensor(inputs: dict, name: str, roots: list[Path]) -> list[int] | None:
    """An index tensor of the workload: None when absent or not stored (random)."""
    desc = inputs.get(name)
    if not isinstance(desc, dict) or desc.get("type") != "safetensors":
        return None
    rel = Path(str(desc.get("path", "")))
    candidates = [rel] if rel.is_absolute() else [r / rel for r in roots]
    for c in candidates:
        if c.is_file():
            return read_safetensors(c, desc.get("tensor_key", name))
    raise ValueError(f"{name}: {rel} not found (looked under {', '.join(str(r) for r in roots)}; give --blobs DIR)")


def _diffs(indptr: list[int], name: str) -> list[int]:
    if len(indptr) < 2 or indptr[0] != 0 or any(b < a for a, b in zip(indptr, indptr[1:])):
        raise ValueError(f"{name} is not an index pointer (starts at 0, never decreases, at least 2 entries)")
    return [b - a for a, b in zip(indptr, indptr[1:])]


def _keys(pages: list[int], last: list[int] | None, page_size: int) -> list[int]:
    if last is None:
        return [n * page_size for n in pages]
    if len(last) != len(pages):
        raise ValueError(f"kv_last_page_len has {len(last)} entries for {len(pages)} requests")
    return [(n - 1) * page_size + lp if n else 0 for n, lp in zip(pages, last)]


def convert(record: dict, default_definition: str, roots: list[Path], dtype: str) -> dict[str, Any] | None:
    """One workload -> one trace line (None: a definition attnbench has no op for)."""
    work = record.get("workload", record)
    name = record.get("definition") or default_definition
    if not isinstance(work, dict) or not isinstance(name, str):
        raise ValueError("not a FlashInfer-Bench workload (expected `definition` and `workload` or a bare workload)")
    found = definition_params(name)
    if found is None:
        return None
    op, params = found
    inputs = work.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise ValueError("workload.inputs is not an object")
    kv_indptr = _tensor(inputs, "kv_indptr", roots)
    if kv_indptr is None:
        raise ValueError("kv_indptr is not stored (type random): the per-request lengths are unknown")
    page_size = params["page_size"]
    kv = _keys(_diffs(kv_indptr, "kv_indptr"), _tensor(inputs, "kv_last_page_len", roots), page_size)
    line: dict[str, Any] = {"op": op, **params, "dtype": dtype}
    if op == "decode":
        line["kv_lens"] = kv
    else:
        qo = _tensor(inputs, "qo_indptr", roots)
        if qo is None:
            raise ValueError("qo_indptr is not stored (type random): the per-request query counts are unknown")
        q = _diffs(qo, "qo_indptr")
        if len(q) != len(kv):
            raise ValueError(f"qo_indptr has {len(q)} requests, kv_indptr {len(kv)}")
        line |= {"q_lens": q, "kv_lens": kv}
    scale = inputs.get("sm_scale")
    if isinstance(scale, dict) and isinstance(scale.get("value"), int | float):
        line["sm_scale"] = float(scale["value"])
    line["source"] = f"flashinfer-bench {name} {work.get('uuid', '')}".strip()
    return line


def import_files(files: list[Path], blobs: Path | None = None, dtype: str = "bf16") -> Imported:
    """Every workload of `files`; SuiteError `file:line: ...` at the first one that cannot be converted.

    Blob paths resolve against `blobs`, then the file's folder and each folder above it (the dataset
    root holds `workloads/` and `blob/`).
    """
    from attnbench.plan.presets import presets

    known = presets()
    out = Imported()
    for path in files:
        path = Path(path)
        roots = ([blobs] if blobs else []) + [path.parent, *path.resolve().parents]
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SuiteError(path, None, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
        for number, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                if not isinstance(record, dict):
                    raise ValueError("a workload line is a JSON object")
                line = convert(record, path.stem, roots, dtype)
            except json.JSONDecodeError as e:
                raise SuiteError(path, number, f"not JSON: {e.msg} (column {e.colno})") from None
            except ValueError as e:
                raise SuiteError(path, number, str(e)) from None
            if line is None:
                out.skipped[str(record.get("definition") or path.stem)] += 1
                continue
            try:  # what we write must read back: the same checks as `sweep --trace`
                trace.parse_line(json.dumps(line), known)
            except ValueError as e:
                raise SuiteError(path, number, f"converted to {line['op']} but: {e}") from None
            out.lines.append(line)
    return out
