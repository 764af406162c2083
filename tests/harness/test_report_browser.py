"""report.html and compare.html in headless Chromium at 1400 px: no console errors, the verdict and the
winners summary in the first viewport, nothing overflowing horizontally, working filters, sorting and
per-case view, under 2 MB. Pages: a synthetic GPU-like run, a real CPU run, and the committed GPU run
reports/examples/h200-timed-targets-2 (re-rendered).

Needs the Debian package `chromium` (/usr/bin/chromium; .ci/run installs it); skipped without it.
Screenshots land in the test's tmp dir (ATTNBENCH_SCREENSHOTS=DIR keeps them there instead).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app
from attnbench.report import render_all
from attnbench.report.compare import compare_runs
from attnbench.report.comparison import write_comparison
from cdp import CHROMIUM, Chromium

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)"
)

WIDTH, HEIGHT = 1400, 900
GPU_EXAMPLE = Path(__file__).resolve().parents[2] / "reports" / "examples" / "h200-timed-targets-2"
SECTIONS = ("verdict", "winners", "results", "plots", "capability", "measurement", "speedup", "environment")


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        b.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        yield b


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    d = synthetic.write_run(tmp_path_factory.mktemp("run"), synthetic.mixed_rows())
    render_all(d)
    return d


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu") / "run"
    res = CliRunner().invoke(
        app, ["sweep", "smoke", "--op", "merge_state", "-b", "torch", "--timing", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu") / GPU_EXAMPLE.name
    shutil.copytree(GPU_EXAMPLE, d)
    assert CliRunner().invoke(app, ["report", str(d)]).exit_code == 0
    return d


def _shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("ATTNBENCH_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _viewport_png(browser, path: Path) -> None:
    path.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"]))


def _overflowing(browser) -> list[str]:
    """Visible elements that reach past the window's right edge, or that scroll sideways."""
    return browser.evaluate("""(() => {
        const out = [], W = window.innerWidth;
        for (const el of document.querySelectorAll('body *')) {
            const r = el.getBoundingClientRect();
            if (!r.width || getComputedStyle(el).visibility === 'hidden') continue;
            if (r.right > W + 0.5 || el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible')
                out.push(el.tagName + (el.id ? '#' + el.id : '') + '.' + el.className + ' ' + Math.round(r.right));
        }
        if (document.documentElement.scrollWidth > W) out.push('document ' + document.documentElement.scrollWidth);
        return out.slice(0, 10);
    })()""")


def _in_first_viewport(browser, selector: str) -> bool:
    return browser.evaluate(f"""(() => {{
        const el = document.querySelector({selector!r});
        if (!el) return false;
        const r = el.getBoundingClientRect();
        return r.top >= 0 && r.top < window.innerHeight - 40 && r.height > 0;
    }})()""")


def _check_page(browser, html: Path, tmp_path: Path, name: str) -> str:
    """The checks every report must pass; returns the page text."""
    assert html.stat().st_size < 2_000_000, f"{html}: {html.stat().st_size} bytes"
    browser.open(html.as_uri())
    assert browser.errors == []
    for sid in SECTIONS:
        assert browser.evaluate(f"!!document.getElementById({sid!r})"), f"section #{sid} missing"
    assert _in_first_viewport(browser, ".verdict"), "the verdict is not in the first viewport"
    assert _in_first_viewport(browser, "#fastest-title"), "the fastest-per-class summary is not in the first viewport"
    assert _overflowing(browser) == []
    images = browser.evaluate("Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])")
    assert all(ok for _, ok in images), images
    _viewport_png(browser, _shots(tmp_path) / f"{name}-first-screen.png")
    return browser.evaluate("document.body.innerText")


def _drawn(browser, what: str = "getAttribute('data-key')") -> list:
    return browser.evaluate(f"Array.from(document.querySelectorAll('#t-results tbody tr')).map(tr => tr.{what})")


def _set(browser, selector: str, value: str) -> None:
    browser.evaluate(f"""(() => {{
        const el = document.querySelector({selector!r}); el.value = {value!r};
        el.dispatchEvent(new Event(el.tagName === 'INPUT' ? 'input' : 'change'));
    }})()""")


def test_detects_a_broken_page(browser, tmp_path):
    """The error collection works: a page with a script error and a console.error is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>console.error('bad thing'); notDefined();</script></body></html>")
    browser.open(page.as_uri())
    errors = browser.errors
    assert any("notDefined" in e for e in errors) and any("bad thing" in e for e in errors), errors


def test_overflow_check_catches_a_wide_table(browser, tmp_path):
    page = tmp_path / "wide.html"
    page.write_text(
        "<html><body><table><tr><td style='white-space:nowrap'>" + "x" * 400 + "</td></tr></table></body></html>"
    )
    browser.open(page.as_uri())
    assert _overflowing(browser)


def test_synthetic_gpu_run(browser, synthetic_run, tmp_path):
    text = _check_page(browser, synthetic_run / "report.html", tmp_path, "synthetic")
    assert "FAILED: 2 failing rows (1 fail, 1 error)" in text
    assert "What broke" in text and "attnbench sweep --case decode/b4-l2048-h32x8-d128-bf16 --backend broken" in text
    assert "Speedup over torch" in text and "Harness cost" in text and "Peaks (roofline)" in text
    # the winners view marks the failing cell and colours only passing ones
    bad = browser.evaluate(
        "Array.from(document.querySelectorAll('#t-winners td.w-bad')).map(td => [td.textContent, td.style.background])"
    )
    assert bad == [["✗ fail", ""], ["✗ error", ""]]


def test_results_table_filters_sorts_and_chooses_columns(browser, synthetic_run):
    browser.open((synthetic_run / "report.html").as_uri())
    assert "skip" not in _drawn(browser) and len(_drawn(browser)) == 32  # by default: every row that ran
    _set(browser, '#results-filter [data-f="status"]', "")
    assert len(_drawn(browser)) == 33
    _set(browser, '#results-filter [data-f="status"]', "fail")
    assert _drawn(browser) == ["fail"]
    _set(browser, '#results-filter [data-f="status"]', "")
    _set(browser, '#results-filter [data-f="backend"]', "flashinfer")
    assert len(_drawn(browser)) == 10  # 9 timed flashinfer rows and its skip row
    _set(browser, '#results-filter [data-f="backend"]', "")
    _set(browser, '#results-filter [data-f="feature"]', "swa")
    assert len(_drawn(browser)) == 2
    _set(browser, '#results-filter [data-f="feature"]', "")
    _set(browser, '#results-filter [data-f="op"]', "merge_state")
    assert len(_drawn(browser)) == 1
    _set(browser, '#results-filter [data-f="op"]', "")
    _set(browser, '#results-filter [data-f="text"]', "boom")
    assert _drawn(browser) == ["error"]
    _set(browser, '#results-filter [data-f="text"]', "")
    heads = "Array.from(document.querySelectorAll('#t-results thead th')).map(th => th.textContent)"
    assert "repro" not in browser.evaluate(heads)
    browser.evaluate("document.querySelector('#col-chooser input[data-col=\"repro\"]').click()")
    assert "repro" in browser.evaluate(heads)
    col = browser.evaluate(heads).index("median µs")
    browser.evaluate(f"document.querySelectorAll('#t-results thead th')[{col}].click()")
    medians = browser.evaluate(f"""Array.from(document.querySelectorAll('#t-results tbody tr'))
        .map(tr => parseFloat(tr.cells[{col}].textContent)).filter(x => !isNaN(x))""")
    assert len(medians) > 20 and medians == sorted(medians)
    assert browser.errors == []


def test_case_view(browser, synthetic_run):
    browser.open((synthetic_run / "report.html").as_uri())
    assert browser.evaluate("document.getElementById('case-view').hidden") is True
    browser.evaluate("document.querySelector('a[href=\"#case/decode/b4-l2048-h32x8-d128-bf16\"]').click()")
    assert browser.evaluate("document.getElementById('case-view').hidden") is False
    text = browser.evaluate("document.getElementById('case-body').innerText")
    for needle in ("broken", "triton", "max abs error 0.4", "attnbench sweep --case decode/b4-l2048-h32x8-d128-bf16"):
        assert needle in text, needle
    browser.evaluate("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))")
    assert browser.evaluate("document.getElementById('case-view').hidden") is True


def test_cpu_run(browser, cpu_run, tmp_path):
    text = _check_page(browser, cpu_run / "report.html", tmp_path, "cpu")
    assert "OK: nothing failing" in text
    assert "rows were timed with a host clock" in text and "not GPU timings" in text  # (under TRITON_INTERPRET=1 here)
    assert "No case has a passing GPU-timed row: nothing is ranked." in text
    timed = sum(1 for line in (cpu_run / "results.jsonl").read_text().splitlines() if '"status": "pass"' in line)
    assert timed > 0
    assert browser.evaluate("document.querySelectorAll('#t-results .kind').length") == timed  # every time says "host"


def test_committed_gpu_run(browser, gpu_run, tmp_path):
    text = _check_page(browser, gpu_run / "report.html", tmp_path, "h200-timed-targets-2")
    assert "FAILED: 5 failing rows (5 fail)" in text
    fastest = browser.evaluate(
        "Array.from(document.querySelectorAll('#t-fastest tbody td:nth-child(2)')).map(td => td.textContent)"
    )
    assert fastest and "flashinfer" not in fastest[:4]  # flashinfer fails every attention case: never ranked there
    browser.evaluate("document.getElementById('winners').scrollIntoView()")
    _viewport_png(browser, _shots(tmp_path) / "h200-timed-targets-2-winners.png")


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


def test_speed_verdicts_in_the_browser(browser, tmp_path):
    """#31: tied winners shown as ties, an LSE-only known finding ranked with its mark, a 6x outlier fully
    inside its latency panel, and "what changed" with sizes."""
    from urllib.parse import unquote

    rows = []
    for i, l in enumerate((1024, 2048, 4096, 8192)):
        cid = f"decode/b4-l{l}-h32x8-d128-bf16"
        rows += [synthetic.timed(cid, "triton", 100.0 + i), synthetic.timed(cid, "triton-det", (100.0 + i) * 1.002)]
        rows.append(synthetic.timed(cid, "fa4", (100.0 + i) * (6.0 if i == 1 else 1.5)))  # a 6x outlier at one length
        xid = f"decode/b32-l{l}-h32x8-d128-bf16"
        rows += [synthetic.lse_finding(xid, 50.0), synthetic.timed(xid, "torch", 80.0)]
    base = synthetic.write_run(tmp_path / "base", rows)
    new_rows = [
        synthetic.timed(r.case_id, r.backend, r.timing["median_us"] * 1.5)
        if r.backend == "fa4" and r.timing["median_us"] < 300
        else r
        for r in rows
    ]
    new = synthetic.write_run(tmp_path / "new", new_rows)
    render_all(new, against=base)
    text = _check_page(browser, new / "report.html", tmp_path, "speed-verdicts")
    fastest = browser.evaluate(
        "Array.from(document.querySelectorAll('#t-fastest td.fastest')).map(td => td.textContent)"
    )
    assert any("triton ≈ triton-det" in f or "triton-det ≈ triton" in f for f in fastest), fastest
    assert "flashinfer-fa2 (o ✓, lse known finding)" in fastest, fastest
    assert re.search(r"\[fa4\] [\d.]+ → [\d.]+ µs \(\+50\.\d%\)", text), text  # what changed, with sizes
    assert "same 13: median change" in text
    assert (
        "4 known-finding rows ranked on their passing outputs only" in text
        and "did not pass: shown, marked" not in text
    )
    src = browser.evaluate("document.querySelector('img[alt=\"decode latency\"]').src")
    svg = unquote(src)
    assert ">6×<" in svg and ">1×<" in svg and ">2×<" in svg  # the panel reaches past the 6x point, readable ticks
    assert browser.evaluate("document.querySelector('img[alt=\"decode latency\"]').naturalHeight") > 0
