"""report.html and compare.html in headless Chromium: no console errors, every section, working tables.

Needs the Debian package `chromium` (/usr/bin/chromium; .ci/run installs it); skipped without it.
Screenshots land in the test's tmp dir (ATTNBENCH_SCREENSHOTS=DIR keeps them there instead).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import synthetic
from attnbench.compare import compare_runs, write_comparison
from attnbench.report import render_all
from cdp import CHROMIUM, Chromium

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)"
)

SECTIONS = (
    "overview",
    "measurement",
    "capability",
    "op-decode",
    "op-merge_state",
    "speedup",
    "environment",
    "conventions",
)


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        yield b


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = synthetic.write_run(tmp_path_factory.mktemp("run"), synthetic.mixed_rows())
    render_all(d)
    return d


def _shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("ATTNBENCH_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_detects_a_broken_page(browser, tmp_path):
    """The error collection works: a page with a script error and a console.error is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>console.error('bad thing'); notDefined();</script></body></html>")
    browser.open(page.as_uri())
    errors = browser.errors
    assert any("notDefined" in e for e in errors) and any("bad thing" in e for e in errors), errors


def test_report_renders_every_section_without_errors(browser, run_dir, tmp_path):
    browser.open((run_dir / "report.html").as_uri())
    assert browser.errors == []
    for sid in SECTIONS:
        assert browser.evaluate(f"!!document.getElementById({sid!r})"), f"section #{sid} missing"
    images = browser.evaluate("Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])")
    assert len(images) >= 5 and all(ok for _, ok in images), images
    assert any("heatmap" in alt for alt, _ in images)
    text = browser.evaluate("document.body.innerText")
    for needle in (
        "Harness cost",
        "Peaks (roofline)",
        "GPU state while timing (NVML)",
        "Error heatmaps of failing outputs",
        "Speedup over torch",
        "attnbench sweep --case",
        "Correctness",
    ):
        assert needle in text, needle
    browser.screenshot(str(_shots(tmp_path) / "report.png"))
    assert (_shots(tmp_path) / "report.png").stat().st_size > 50_000


def test_report_tables_sort_and_filter(browser, run_dir):
    browser.open((run_dir / "report.html").as_uri())
    col = browser.evaluate("""(() => {
        const ths = Array.from(document.querySelectorAll('#t-decode thead th'));
        return ths.findIndex(th => th.textContent.trim() === 'median µs');
    })()""")
    assert col > 0
    medians = f"""Array.from(document.querySelectorAll('#t-decode tbody tr'))
        .map(tr => tr.cells[{col}].getAttribute('data-sort')).filter(v => v !== '').map(Number)"""
    browser.evaluate(f"document.querySelectorAll('#t-decode thead th')[{col}].click()")
    up = browser.evaluate(medians)
    assert up == sorted(up) and len(up) > 20
    browser.evaluate(f"document.querySelectorAll('#t-decode thead th')[{col}].click()")
    assert browser.evaluate(medians) == sorted(up, reverse=True)
    shown = browser.evaluate("""(() => {
        const sel = document.querySelector('select[data-table="t-decode"]');
        sel.value = 'fail'; sel.dispatchEvent(new Event('change'));
        return Array.from(document.querySelectorAll('#t-decode tbody tr'))
            .filter(tr => tr.style.display !== 'none').map(tr => tr.getAttribute('data-key'));
    })()""")
    assert shown == ["fail"]
    shown = browser.evaluate("""(() => {
        const sel = document.querySelector('select[data-table="t-decode"]');
        sel.value = ''; sel.dispatchEvent(new Event('change'));
        const box = document.querySelector('input[data-table="t-decode"]');
        box.value = 'flashinfer'; box.dispatchEvent(new Event('input'));
        return Array.from(document.querySelectorAll('#t-decode tbody tr'))
            .filter(tr => tr.style.display !== 'none').length;
    })()""")
    assert shown == 10  # 9 timed flashinfer rows and its skip row
    assert browser.errors == []


def test_compare_report_renders(browser, tmp_path):
    rows = synthetic.mixed_rows()
    base = synthetic.write_run(tmp_path / "base", rows)
    slower = [
        synthetic.row(r.case_id, r.backend, median_us=r.timing["median_us"] * 1.1)
        if r.backend == "triton" and r.timing
        else r
        for r in rows
    ]
    new = synthetic.write_run(tmp_path / "new", slower)
    cmp = compare_runs(base, new)
    assert cmp.regressions
    write_comparison(cmp, tmp_path / "cmp")
    browser.open((tmp_path / "cmp" / "compare.html").as_uri())
    assert browser.errors == []
    text = browser.evaluate("document.body.innerText")
    assert "regression" in text and "Regressions" in text and "All rows" in text
    browser.screenshot(str(_shots(tmp_path) / "compare.png"))
