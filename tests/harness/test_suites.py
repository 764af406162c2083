"""Suite loading: expansion (sweep, zip, ranges, presets) and the catalogue of malformed suites."""

from __future__ import annotations

import textwrap

import pytest

from attnbench.errors import SuiteError
from attnbench.plan.suite import builtin_names, load


def write(tmp_path, text: str, name: str = "s.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(p)


def test_every_builtin_suite_loads():
    for name in builtin_names():
        assert load(name, "cuda").cases, name


def test_sweep_zip_ranges_presets_and_dedup(tmp_path):
    path = write(
        tmp_path,
        """
        dtypes: [bf16, fp16]
        cases:
          - op: decode
            model: llama3-8b
            params: {page_size: 1}
            sweep:
              batch: {range: [1, 3]}
              kv_len: {pow2: [4, 5]}
            zip:
              window: [-1, 7]
              sinks: [false, true]
          - op: decode
            model: llama3-8b
            params: {page_size: 1, batch: 1, kv_len: 16}
            dtypes: [bf16]
    """,
    )
    s = load(path)
    assert len(s.cases) == 3 * 2 * 2 * 2  # the second entry repeats a case of the first
    first = s.cases[0]
    assert (first.params.heads_q, first.params.heads_kv, first.params.head_dim) == (32, 8, 128)
    assert first.id == "decode/b1-l16-h32x8-d128-p1-bf16"
    assert {c.params.kv_len for c in s.cases} == {16, 32}
    assert {(c.params.window, c.params.sinks) for c in s.cases} == {(-1, False), (7, True)}


def test_tolerance_override_is_carried_with_its_why(tmp_path):
    path = write(
        tmp_path,
        """
        cases:
          - op: merge_state
            tolerance: {factor: 3, why: "a reason a reviewer can check"}
    """,
    )
    (c,) = load(path).cases
    assert c.tolerance.factor == 3 and c.tolerance.why == "a reason a reviewer can check"


BAD = {
    "yaml syntax": ("cases:\n  - op: decode\n    params: {batch: 1\n", 4, "YAML syntax"),
    "unknown top-level key": ("cases:\n  - op: decode\nbackend: [torch]\n", 3, "unknown key"),
    "unknown entry key": ("cases:\n  - op: decode\n    parms: {batch: 1}\n", 3, "unknown key"),
    "unknown parameter": ("cases:\n  - op: decode\n    sweep:\n      batchsize: [1]\n", 4, "no parameter 'batchsize'"),
    "wrong type": ("cases:\n  - op: decode\n    params:\n      batch: many\n", 4, "batch"),
    "heads not a multiple": (
        "cases:\n  - op: decode\n    params: {heads_q: 12, heads_kv: 8}\n",
        3,
        "multiple of heads_kv",
    ),
    "page size zero": ("cases:\n  - op: decode\n    sweep:\n      page_size: [16, 0]\n", 4, "page_size"),
    "window below -1": ("cases:\n  - op: decode\n    params:\n      window: -2\n", 4, "window"),
    "unknown op": ("cases:\n  - op: prefill\n", 2, "unknown op 'prefill'"),
    "unknown dtype": ("dtypes: [bf8]\ncases:\n  - op: decode\n", 1, "unknown dtype"),
    "unknown model": ("cases:\n  - op: decode\n    model: llama5\n", 3, "unknown model"),
    "zip lengths differ": (
        "cases:\n  - op: decode\n    zip:\n      batch: [1, 2]\n      kv_len: [3]\n",
        3,
        "differ in length",
    ),
    "duplicate key": ("cases:\n  - op: decode\n    op: extend\n", 3, "duplicate key"),
    "empty file": ("", 1, "empty"),
    "not a mapping": ("- op: decode\n", 1, "mapping"),
    "no cases": ("cases: []\n", 1, "cases"),
    "tolerance without why": ("cases:\n  - op: decode\n    tolerance: {factor: 3}\n", 3, "why"),
    "mla with wrong dims": ("cases:\n  - op: decode\n    params: {mla: true}\n", 3, "mla needs"),
    "unknown backend": ("backends: [torch, flashinfr]\ncases:\n  - op: decode\n", 1, "unknown backend 'flashinfr'"),
    "gpu suite on cpu": ("device: cuda\ncases:\n  - op: decode\n", 1, "sized for a GPU"),
    "bad range": ("cases:\n  - op: decode\n    sweep:\n      batch: {range: [1]}\n", 4, "range takes"),
    "bad axis": ("cases:\n  - op: decode\n    sweep:\n      batch: 4\n", 4, "an axis is a list"),
    "empty axis": ("cases:\n  - op: decode\n    sweep:\n      batch: []\n", 4, "at least one value"),
    "empty range": ("cases:\n  - op: decode\n    sweep:\n      batch: {range: [5, 2]}\n", 4, "at least one value"),
    "empty zip axis": ("cases:\n  - op: decode\n    zip:\n      batch: []\n", 4, "at least one value"),
}


@pytest.mark.parametrize("name", BAD)
def test_malformed_suite_names_file_line_and_problem(tmp_path, name):
    text, line, words = BAD[name]
    path = write(tmp_path, text)
    with pytest.raises(SuiteError) as e:
        load(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    assert words in msg, msg


def test_missing_suite_lists_builtins():
    with pytest.raises(SuiteError, match="built-in suites: .*smoke"):
        load("no-such-suite")


def test_a_directory_named_like_a_suite_does_not_shadow_it(tmp_path, monkeypatch):
    (tmp_path / "smoke").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load("smoke").cases
