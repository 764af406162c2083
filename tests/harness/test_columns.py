"""The column registry (harness/store/columns.py): results.csv and summary.md's row tables come from it, and
every op's outputs get error columns."""

from __future__ import annotations

import csv
import dataclasses

from attnbench.check import checklist
from attnbench.ops import OPS
from attnbench.report.exports import write_csv
from attnbench.store.columns import csv_columns, md_table
from attnbench.store.results import Result


def _row(op, metrics, **kw):
    return Result(case_id=f"{op}/x", op=op, backend="torch", status="pass", metrics=metrics, **kw)


def test_every_op_output_has_error_columns():
    names = {c.name for c in csv_columns()}
    for op in OPS.values():
        for out, spec in op.outputs.items():
            wanted = {f"{out}_wrong"} if spec.exact else {f"{out}_max_abs", f"{out}_bound"}
            assert wanted <= names, (op.name, out)


def test_results_csv_carries_gdn_spec_and_written_input_errors(tmp_path):
    rows = [
        _row("gdn_gating", {"g": {"max_abs": 1e-7, "bound": 2e-7}, "beta": {"max_abs": 3e-7, "bound": 4e-7}}),
        _row("eagle_build_tree", {"retrive_index": {"exact": True, "wrong": 12}}),
        _row(
            "gdn_decode",
            {"o": {"max_abs": 5e-4, "bound": 1e-3}, "pool_only_here": {"max_abs": 0.5, "bound": 1.0}},
            deterministic=True,
        ),  # fmt: skip
    ]
    write_csv(rows, tmp_path / "results.csv")
    got = list(csv.DictReader(open(tmp_path / "results.csv", encoding="utf-8")))
    assert got[0]["beta_max_abs"] == "3e-07" and got[0]["g_bound"] == "2e-07" and got[0]["o_max_abs"] == ""
    assert got[1]["retrive_index_wrong"] == "12"
    assert got[2]["pool_only_here_max_abs"] == "0.5" and got[2]["o_bound"] == "0.001"  # a written input too
    assert got[2]["deterministic"] == "True" and got[0]["deterministic"] == ""


def test_a_registered_check_s_records_become_columns(monkeypatch):
    class Toy:
        name, needs, records = "toy", frozenset({"outputs"}), ("toy_ok",)

    monkeypatch.setattr(checklist, "_ACTIVE", [*checklist.CHECKS, Toy()])
    assert [c.name for c in csv_columns()][-6:] == [
        "deterministic", "batch_invariant", "stale_reruns", "stale_references", "replay", "toy_ok"
    ]  # fmt: skip


def test_markdown_row_tables_come_from_the_registry():
    rows = [_row("decode", {}, reason="o: abs error | 2")]
    lines = md_table(rows, [("case_id", "case"), "backend", "reason"], {"case_id": lambda v: f"`{v}`"})
    assert lines == ["| case | backend | reason |", "|---|---|---|", "| `decode/x` | torch | o: abs error | 2 |"]


def _page(rows):
    from attnbench.report import rowdata

    return rowdata.payload(rows, {})


def test_page_rows_hold_only_registry_fields_and_every_output_gets_a_page_column():
    from attnbench.store.columns import ERROR_DETAIL, PAGE_FIELDS, page_columns

    rows = [
        _row("gdn_gating", {"g": {"max_abs": 1e-7, "bound": 2e-7}, "beta": {"max_abs": 3e-7, "bound": 4e-7}}),
        _row("eagle_build_tree", {"retrive_index": {"exact": True, "wrong": 12}}),
        _row("decode", {"o": {"max_abs": 5e-4, "bound": 1e-3}}, timing={"median_us": 3.0, "n": 5}),
    ]
    page = _page(rows)
    assert set().union(*page["rows"]) <= {f.name for f in PAGE_FIELDS}
    assert page["columns"] == [dataclasses.asdict(c) for c in page_columns(rows)]
    assert page["detail"] == [c.name for c in ERROR_DETAIL]
    errs = {c["key"]: c for c in page["columns"] if c["key"].startswith("err:")}
    assert set(errs) == {"err:o", "err:g", "err:beta", "err:retrive_index"}  # the rows' outputs, o first
    assert errs["err:retrive_index"]["header"] == "retrive_index wrong" and errs["err:g"]["value"] == "e.g"
    g, tree, dec = page["rows"]
    assert g["e"] == {"g": 0.5, "beta": 0.75} and tree["e"] == {"retrive_index": 12} and dec["e"] == {"o": 0.5}
    assert dec["m"] == 3.0 and dec["n"] == 5 and "m" not in g  # timing fields on timed rows only
    assert tree["d"] == [["retrive_index", "bitwise", "12 wrong"]] and len(g["d"][0]) == len(ERROR_DETAIL)


def test_results_js_draws_every_column_the_registry_declares():
    """results.js holds no column list of its own: every renderer and derived value the registry's page
    columns name exists there, and it builds its table from the payload's columns."""
    import re
    from pathlib import Path

    from attnbench.store.columns import PAGE_COLUMNS

    js = (Path(__import__("attnbench.report", fromlist=["x"]).__file__).parent / "results.js").read_text()
    render = set(re.findall(r"^    (\w+): ", js[js.index("var RENDER") : js.index("var DERIVED")], re.M))
    derived = set(re.findall(r'"(@\w+)"', js[js.index("var DERIVED") : js.index("var reader")]))
    for c in PAGE_COLUMNS:
        assert c.render in render and (not c.case or c.case in render), c.key
        assert not c.value.startswith("@") or c.value in derived, c.key
    assert "D.columns.map" in js and "D.detail.map" in js
