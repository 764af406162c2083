"""The reference cache: a second identical run computes no reference, a change to the reference code or
the input generation recomputes, a bad entry is never trusted, the cap holds, and off means off."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import attnbench.ops
from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.cli.app import app
from attnbench.run.runner import RunOptions, run_case
from attnbench.store import refcache
from attnbench.store.results import read_results

MERGE = "merge_state/t33-h4-d64-fp32"


def _case(case_id: str = MERGE) -> Case:
    return Case.from_id(case_id)


def _run(case: Case, root) -> list:
    return run_case(case, [get_backend("torch")], RunOptions(timing=False, ref_cache=str(root)))


def _sweep(out, *more):
    args = ["sweep", "smoke", "--op", "merge_state", "-b", "torch", "--device", "cpu", "--out", str(out), *more]
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_a_second_sweep_computes_no_reference(tmp_path):
    cache = tmp_path / "refs"
    first = _sweep(tmp_path / "a", "--ref-cache", str(cache))
    assert first.exit_code == 0, first.output
    second = _sweep(tmp_path / "b", "--ref-cache", str(cache))
    assert second.exit_code == 0, second.output
    runs = [json.loads((tmp_path / d / "run.json").read_text())["references"] for d in "ab"]
    n = len(read_results(tmp_path / "a" / "results.jsonl"))
    assert runs[0] == {"computed": n, "from_cache": 0, "cache": str(cache), "problems": 0}
    assert runs[1] == {"computed": 0, "from_cache": n, "cache": str(cache), "problems": 0}
    assert f"References: 0 computed, {n} loaded from the reference cache" in (tmp_path / "b" / "summary.md").read_text()
    # the same verdicts and the same errors, to the bit: the cached reference is the computed one
    a, b = (read_results(tmp_path / d / "results.jsonl") for d in "ab")
    assert [(r.case_id, r.status, r.metrics) for r in a] == [(r.case_id, r.status, r.metrics) for r in b]
    assert {r.reference_from for r in b} == {"cache"}


def test_the_cached_reference_is_bitwise_the_computed_one(tmp_path):
    case = _case("decode/b2-l45-h4x2-d64-p16-bf16")
    inputs = case.make_inputs()
    expected = case.op.expected(case.params, inputs, torch.float64)
    twin = case.op.expected(case.params, inputs, case.torch_dtype)
    cache = refcache.RefCache(tmp_path)
    assert cache.put(case, expected, twin) == ""
    (got_expected, got_twin), problem = cache.get(case)
    assert problem == ""
    for want, got in ((expected, got_expected), (twin, got_twin)):
        assert want.keys() == got.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def test_the_key_covers_references_ops_and_input_helpers():
    names = {(p.parent.name, p.name) for p in refcache.source_files(_case().op)}
    assert {("references", "attention.py"), ("references", "gdn.py"), ("references", "spec.py")} <= names
    assert {("ops", "rng.py"), ("ops", "distributions.py"), ("ops", "base.py")} <= names
    assert {("harness", "buffers.py"), ("harness", "case.py")} <= names


def test_the_key_covers_every_module_of_the_op_packages():
    """An op split into a package (ops/attention/, ops/gdn/): a change to any of its modules is a new key."""
    ops = Path(attnbench.ops.__file__).parent
    every = {p.resolve() for p in ops.rglob("*.py")}
    assert {p.parent.name for p in every} >= {"ops", "attention", "gdn"}
    assert every <= set(refcache.source_files(_case().op))


def test_modules_named_alike_in_two_packages_are_told_apart(tmp_path):
    ops = Path(attnbench.ops.__file__).parent
    a, b = ops / "attention" / "params.py", ops / "gdn" / "params.py"
    assert refcache._source_name(a.resolve()) != refcache._source_name(b.resolve())
    assert refcache._source_name(a.resolve()).endswith("ops/attention/params.py")


def test_a_changed_reference_source_recomputes(tmp_path, monkeypatch):
    extra = tmp_path / "reference_under_edit.py"
    extra.write_text("def reference(): return 1\n")
    real = refcache.source_files
    monkeypatch.setattr(refcache, "source_files", lambda op=None: [*real(op), extra])
    case, root = _case(), tmp_path / "refs"
    assert {r.reference_from for r in _run(case, root)} == {"computed"}
    assert {r.reference_from for r in _run(case, root)} == {"cache"}
    extra.write_text("def reference(): return 2\n")  # same size: the digest reads the bytes, not the stat
    os.utime(extra, ns=(time.time_ns(), time.time_ns() + 1))
    assert {r.reference_from for r in _run(case, root)} == {"computed"}
    assert {r.reference_from for r in _run(case, root)} == {"cache"}


def test_other_parameters_dtype_or_seed_are_other_entries(tmp_path):
    root = tmp_path / "refs"
    ids = (MERGE, "merge_state/t33-h4-d64-bf16", "merge_state/t33-h4-d64-fp32-s1", "merge_state/t34-h4-d64-fp32")
    for cid in ids:
        assert {r.reference_from for r in _run(_case(cid), root)} == {"computed"}, cid
    cache = refcache.RefCache(root)
    own = {cache.path(refcache.key_of(refcache.key_material(_case(cid)))) for cid in ids}
    assert len(own) == 4 and own <= {p for p, _ in cache.entries()}  # beside them: the stale check's


def _entry(root, case: Case | None = None):
    """The entry of `case`'s own reference (default `_case()`), not those its checks keep beside it."""
    path = refcache.RefCache(root).path(refcache.key_of(refcache.key_material(case or _case())))
    assert path in {p for p, _ in refcache.RefCache(root).entries()}
    return path


def _flip_last_byte(b: bytes) -> bytes:
    return b[:-1] + bytes([b[-1] ^ 1])


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_flip_last_byte, id="one-bit-flipped"),
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b"not an entry at all\n" + b[100:], id="garbage-header"),
    ],
)
def test_a_corrupt_entry_is_recomputed_and_replaced(tmp_path, damage):
    case, root = _case(), tmp_path / "refs"
    good = _run(case, root)
    path = _entry(root)
    path.write_bytes(damage(path.read_bytes()))
    rows = _run(case, root)
    assert {r.reference_from for r in rows} == {"computed"}
    assert all("is corrupt" in r.reference_note and path.name in r.reference_note for r in rows)
    assert [r.metrics for r in rows] == [r.metrics for r in good]
    assert {r.reference_from for r in _run(case, root)} == {"cache"}  # replaced by a good one


def test_an_entry_of_another_case_under_this_key_is_not_trusted(tmp_path):
    root = tmp_path / "refs"
    a, b = _case(), _case("merge_state/t34-h4-d64-fp32")
    _run(a, root)
    entry_a = _entry(root, a)
    key_b = refcache.key_of(refcache.key_material(b))
    refcache.RefCache(root).path(key_b).write_bytes(entry_a.read_bytes())  # a consistent file, the wrong case
    rows = _run(b, root)
    assert {r.reference_from for r in rows} == {"computed"} and "another case" in rows[0].reference_note
    assert {r.status for r in rows} == {"pass"}


def test_a_write_that_fails_leaves_no_entry_and_no_temporary_file(tmp_path, monkeypatch):
    case, root = _case(), tmp_path / "refs"

    def fail(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(refcache.os, "replace", fail)
    rows = _run(case, root)
    assert {r.reference_from for r in rows} == {"computed"} and "No space left" in rows[0].reference_note
    assert list(root.iterdir()) == []


def test_eviction_keeps_the_cache_under_its_cap_least_recently_used_first(tmp_path):
    cases = [_case(f"merge_state/t{t}-h4-d64-fp32") for t in (30, 31, 32, 33)]
    probe = refcache.RefCache(tmp_path / "probe")
    sizes = []
    for c in cases:
        x = c.make_inputs()
        probe.put(c, c.op.expected(c.params, x, torch.float64), c.op.expected(c.params, x, c.torch_dtype))
    sizes = {p.name: st.st_size for p, st in probe.entries()}
    cap = sum(sorted(sizes.values())[-3:])  # room for any three entries, never four
    cache = refcache.RefCache(tmp_path / "refs", max_bytes=cap)
    for i, c in enumerate(cases[:3]):
        x = c.make_inputs()
        assert cache.put(c, c.op.expected(c.params, x, torch.float64), c.op.expected(c.params, x, c.torch_dtype)) == ""
        os.utime(cache.path(refcache.key_of(refcache.key_material(c))), (1000 + i, 1000 + i))  # 0 oldest
    assert cache.get(cases[0])[0] is not None  # a hit makes case 0 the most recently used
    x = cases[3].make_inputs()
    c3 = cases[3]
    cache.put(c3, c3.op.expected(c3.params, x, torch.float64), c3.op.expected(c3.params, x, c3.torch_dtype))
    assert cache.size() <= cap
    held = [c for c in cases if cache.get(c)[0] is not None]
    assert held == [cases[0], cases[2], cases[3]]  # case 1 was the least recently used


def test_an_entry_larger_than_the_cap_is_not_stored(tmp_path):
    case = _case()
    rows = run_case(case, [get_backend("torch")], RunOptions(timing=False, ref_cache=str(tmp_path), ref_cache_max=100))
    assert {r.reference_from for r in rows} == {"computed"} and "larger than the cache's cap" in rows[0].reference_note
    assert refcache.RefCache(tmp_path).entries() == []


def test_off_means_off(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ATTNBENCH_REF_CACHE")
    res = _sweep(tmp_path / "a", "--ref-cache", "off")
    assert res.exit_code == 0, res.output
    refs = json.loads((tmp_path / "a" / "run.json").read_text())["references"]
    assert refs["cache"] == "off" and refs["from_cache"] == 0 and refs["computed"] > 0
    monkeypatch.setenv("ATTNBENCH_REF_CACHE", "off")
    assert _sweep(tmp_path / "b").exit_code == 0
    assert json.loads((tmp_path / "b" / "run.json").read_text())["references"]["cache"] == "off"
    assert not any(p.is_file() for p in tmp_path.rglob("*.ref"))
    # nothing of ours anywhere (matplotlib, imported first by this process, keeps its font list in XDG's)
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "xdg" / "attnbench").exists() and not (tmp_path / "home" / ".cache" / "attnbench").exists()


def test_the_default_directory_follows_the_environment(tmp_path, monkeypatch):
    for var in ("ATTNBENCH_REF_CACHE", "ATTNBENCH_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert refcache.default_dir() == tmp_path / ".cache" / "attnbench" / "refs"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert refcache.default_dir() == tmp_path / "xdg" / "attnbench" / "refs"
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "ab"))
    assert refcache.default_dir() == tmp_path / "ab" / "refs"
    monkeypatch.setenv("ATTNBENCH_REF_CACHE", str(tmp_path / "mine"))
    assert refcache.default_dir() == tmp_path / "mine"
    monkeypatch.setenv("ATTNBENCH_REF_CACHE", "OFF")
    assert refcache.default_dir() is None
    # the default run uses it: a sweep without --ref-cache fills $ATTNBENCH_REF_CACHE
    monkeypatch.setenv("ATTNBENCH_REF_CACHE", str(tmp_path / "mine"))
    assert _sweep(tmp_path / "run").exit_code == 0
    assert len(refcache.RefCache(tmp_path / "mine").entries()) > 0


def test_cache_clear_deletes_entries_and_nothing_else(tmp_path):
    root = tmp_path / "refs"
    _run(_case(), root)
    (root / "notes.txt").write_text("mine")
    n = len(refcache.RefCache(root).entries())  # the case's own, and its stale check's
    res = CliRunner().invoke(app, ["cache", "info", "--ref-cache", str(root)])
    assert res.exit_code == 0 and f"{n} references" in res.output
    res = CliRunner().invoke(app, ["cache", "clear", "--ref-cache", str(root)])
    assert res.exit_code == 0 and f"{n} references deleted" in res.output
    assert [p.name for p in root.iterdir()] == ["notes.txt"]
    assert {r.reference_from for r in _run(_case(), root)} == {"computed"}


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["sweep", "--op", "merge_state", "--ref-cache", "FILE"], {}, "not a directory"),
        (["sweep", "--op", "merge_state"], {"ATTNBENCH_REF_CACHE_MAX": "lots"}, "ATTNBENCH_REF_CACHE_MAX: 'lots'"),
        (["cache", "info"], {"ATTNBENCH_REF_CACHE_MAX": "-1"}, "is not a size"),
    ],
)
def test_bad_cache_settings_are_one_line_exit_2(tmp_path, monkeypatch, args, env, words):
    (tmp_path / "FILE").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNBENCH_REF_CACHE", str(tmp_path / "refs"))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output
    assert not (tmp_path / "reports").exists()


def test_readers_beside_writers_never_see_a_torn_entry(tmp_path):
    """Workers share the directory: a reader sees the old entry, the new one or none, never part of one."""
    import threading

    case = _case()
    x = case.make_inputs()
    expected, twin = case.op.expected(case.params, x, torch.float64), case.op.expected(case.params, x, case.torch_dtype)
    cache = refcache.RefCache(tmp_path)
    problems, hits, stop = [], [], threading.Event()

    def write():
        while not stop.is_set():
            cache.put(case, expected, twin)

    def read():
        while not stop.is_set():
            got, problem = cache.get(case)
            hits.append(got is not None)
            if problem:
                problems.append(problem)

    threads = [threading.Thread(target=f) for f in (write, write, read, read)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    assert problems == [] and sum(hits) > 10
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".ref"]  # no temporary file left behind


def _store(cache, c):
    x = c.make_inputs()
    return cache.put(c, c.op.expected(c.params, x, torch.float64), c.op.expected(c.params, x, c.torch_dtype), x)


def test_a_suite_larger_than_the_cap_keeps_its_first_entries_run_after_run(tmp_path, monkeypatch):
    """A plain LRU evicts each entry just before the next run reads it (a cyclic suite over a small
    cache hits nothing); entries used in the last KEEP_S are never evicted, so the first ones stay."""
    cases = [_case(f"merge_state/t{t}-h4-d64-fp32") for t in (30, 31, 32, 33)]
    probe = refcache.RefCache(tmp_path / "probe")
    for c in cases:
        _store(probe, c)
    cap = sum(sorted(st.st_size for _, st in probe.entries())[-2:])  # room for two entries, never three
    cache = refcache.RefCache(tmp_path / "refs", max_bytes=cap)
    for run in range(3):
        hits = [cache.get(c, c.make_inputs())[0] is not None for c in cases]
        for c, hit in zip(cases, hits):
            if not hit:
                note = _store(cache, c)
                assert note == "" or "not kept" in note
        assert cache.size() <= cap
        assert hits == ([False] * 4 if run == 0 else [True, True, False, False])
        for p, _ in cache.entries():  # the next run starts an hour later
            os.utime(p, (time.time() - 3600, time.time() - 3600))
    for p, _ in cache.entries():  # unused for two days: the next store may evict them
        os.utime(p, (time.time() - 2 * 86400, time.time() - 2 * 86400))
    assert _store(cache, cases[2]) == "" and cache.get(cases[2], cases[2].make_inputs())[0] is not None


def test_an_output_written_in_place_is_stored_as_its_changes(tmp_path):
    """A KV cache the op writes is stored as the slots that differ from the pristine input, and comes
    back bit for bit."""
    case = Case.from_id("extend/b2-q6-pre17-h4x2-d64-p16-bf16")
    x = case.make_inputs()
    expected = case.op.expected(case.params, x, torch.float64)
    twin = case.op.expected(case.params, x, case.torch_dtype)
    assert "k_cache" in expected  # the extend tokens' keys are written into the cache
    cache = refcache.RefCache(tmp_path)
    assert cache.put(case, expected, twin, x) == ""
    whole = refcache.RefCache(tmp_path / "whole")
    assert whole.put(case, expected, twin) == ""  # no inputs: every tensor stored whole
    ((_, st),), ((_, st_whole),) = cache.entries(), whole.entries()
    assert st.st_size < 0.8 * st_whole.st_size
    (got, got_twin), why = cache.get(case, case.make_inputs())
    assert why == ""
    for want, have in ((expected, got), (twin, got_twin)):
        assert want.keys() == have.keys()
        for k in want:
            assert torch.equal(want[k].nan_to_num(7.0), have[k].nan_to_num(7.0)) and want[k].dtype == have[k].dtype
    assert cache.get(case, None)[0] is None  # without the inputs the entry cannot be rebuilt: recomputed


def test_a_state_pool_is_stored_as_the_slots_written():
    """A GDN step writes a few slots of its state pool: the delta holds those slots, whole, with one
    index per slot (not per element), and rebuilds the pool bit for bit; a NaN left in place is no change."""
    import types

    pool = torch.randn(64, 2, 8, 8)
    pool[7, 0, 0, 0] = float("nan")
    new = pool.clone()
    new[[3, 40, 41]] = torch.randn(3, 2, 8, 8)
    x = types.SimpleNamespace(state_pool=pool)
    whole, delta = refcache._delta({"state_pool": new, "o": torch.ones(4)}, x)
    assert set(whole) == {"o"} and delta["state_pool"]["rows"].tolist() == [3, 40, 41]
    assert delta["state_pool"]["val"].shape == (3, 2, 8, 8)
    back = refcache._undelta(whole, delta, x)
    assert torch.equal(back["state_pool"].nan_to_num(7.0), new.nan_to_num(7.0))
    new[: len(pool) // 2 + 1] += 1  # most slots written: stored whole
    assert "state_pool" in refcache._delta({"state_pool": new}, x)[0]


def test_the_digest_of_a_large_entry_covers_every_piece(tmp_path, monkeypatch):
    """Large payloads are hashed piece by piece on a thread pool: a byte flipped in any piece, not only
    the last, makes the entry corrupt."""
    monkeypatch.setattr(refcache, "DIGEST_CHUNK", 512)
    case, root = _case(), tmp_path / "refs"
    _run(case, root)
    path = _entry(root)
    blob = path.read_bytes()
    assert len(blob) > 4 * 512
    mid = len(blob) // 2
    path.write_bytes(blob[:mid] + bytes([blob[mid] ^ 1]) + blob[mid + 1 :])
    rows = _run(case, root)
    assert {r.reference_from for r in rows} == {"computed"} and "digest" in rows[0].reference_note


def _odd_tensors() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "f64": torch.randn(3, 5, 7, dtype=torch.float64, generator=g),
        "bf16": torch.randn(4, 9, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(33, generator=g).to(torch.float8_e4m3fn),
        "i64": torch.arange(-5, 6),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4, dtype=torch.float32),
        "strided": torch.randn(6, 8, dtype=torch.float64, generator=g)[:, ::2],  # not contiguous
    }


def test_every_dtype_and_shape_comes_back_bit_for_bit(tmp_path):
    case, odd = _case(), _odd_tensors()
    cache = refcache.RefCache(tmp_path)
    assert cache.put(case, odd, {"o": odd["bf16"]}) == ""
    (got, twin), why = cache.get(case)
    assert why == "" and got.keys() == odd.keys() and torch.equal(twin["o"], odd["bf16"])
    for k, want in odd.items():
        have = got[k]
        assert have.dtype == want.dtype and have.shape == want.shape, k
        assert torch.equal(
            have.contiguous().reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8)
        ), k


def test_a_load_reads_the_payload_into_tensors_without_unpickling_or_copying_it_through_python(tmp_path, monkeypatch):
    """An entry is JSON and raw bytes read straight into one tensor: no torch.load (a pickle, and the
    copies a load from memory makes: 1.3 s of a 2.6 s load of a 870 MiB GDN entry on a 2-core CPU), and
    no Python bytes object the size of the payload."""
    import tracemalloc

    monkeypatch.setattr(refcache, "DIGEST_CHUNK", 1 << 20)  # several pieces, hashed while the next is read
    case = _case()
    big = {"state_pool": torch.randn(64, 4, 64, 64, dtype=torch.float64)}  # 8 MiB
    cache = refcache.RefCache(tmp_path)
    assert cache.put(case, big, {"o": big["state_pool"].float()}) == ""

    def no_load(*a, **k):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_load)
    tracemalloc.start()
    hit, why = cache.get(case)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert why == "" and hit is not None and torch.equal(hit[0]["state_pool"], big["state_pool"])
    assert peak < 2 << 20  # the payload (12 MiB) was never a Python object


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda ix: ix["expected"]["o"].update(offset=1 << 40), id="beyond-the-payload"),
        pytest.param(lambda ix: ix["expected"]["o"].update(dtype="load"), id="not-a-dtype"),
        pytest.param(lambda ix: ix["expected"]["o"].update(shape=[10**6]), id="shape-larger-than-bytes"),
        pytest.param(lambda ix: ix["expected"]["o"].update(offset=3), id="misaligned"),
        pytest.param(lambda ix: ix.update(expected=[1]), id="not-a-dict"),
    ],
)
def test_an_index_that_does_not_fit_its_bytes_is_corrupt_even_with_a_good_digest(tmp_path, edit):
    """The digest only proves the bytes are the ones written; a bad index (a writer's bug, a foreign
    file) is still never trusted."""
    import json

    case = _case()
    cache = refcache.RefCache(tmp_path)
    assert cache.put(case, {"o": torch.ones(8, dtype=torch.float64)}, {"o": torch.ones(8)}) == ""
    path = _entry(tmp_path)
    blob = path.read_bytes()
    payload = blob[blob.index(b"\n") + 1 :]
    line, data = payload.split(b"\n", 1)
    index = json.loads(line)
    edit(index)
    line = json.dumps(index).encode()
    line += b" " * (-(-(len(line) + 1) // refcache.ALIGN) * refcache.ALIGN - len(line) - 1)
    payload = line + b"\n" + data
    path.write_bytes(b"attnbench-ref %d %s\n" % (refcache.FORMAT, refcache.digest(payload).encode()) + payload)
    got, why = cache.get(case)
    assert got is None and "is corrupt" in why


def test_a_cache_problem_met_by_every_case_is_said_once_a_run(tmp_path, monkeypatch):
    """A full cache refuses every case's entry: the sweep says so once, not once per case (a GPU `large`
    run printed the same line fifteen times), and the line names the cap's setting."""
    import dataclasses

    from attnbench.run.executor import Execution
    from attnbench.run.runner import RunOptions
    from attnbench.run.sweep import Selection, execute, plan
    from attnbench.store import refcache

    note = "reference cache x full (1 GiB of entries used today): not kept (a larger cap: $ATTNBENCH_REF_CACHE_MAX)"
    monkeypatch.setattr(refcache.RefCache, "put", lambda self, *a, **k: note)
    p = plan(Selection(("smoke",), "cpu", ("torch",), ("merge_state",)))
    p = dataclasses.replace(p, cases=p.cases[:3])
    problems: list[str] = []
    opts = RunOptions(timing=False, ref_cache=str(tmp_path / "refs"))
    rows = execute(p, tmp_path / "run", opts, how=Execution(isolate=False), argv=[], on_problem=problems.append)
    assert len(rows) == 3 and all(r.reference_note == note for r in rows)
    assert problems.count(note) == 1, problems
