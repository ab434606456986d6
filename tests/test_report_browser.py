"""``--report FILE.html`` opened in a real browser (headless Chromium through selenium and the system
chromedriver): renders without console errors, loads nothing from the network, and the chart shows one
point per ranked plan in every panel. A screenshot is saved under the test's tmp dir.

.ci/run installs Debian's chromium and chromium-driver; locally the test skips when they are missing,
under CI it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app

ROOT = Path(__file__).resolve().parents[1]


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("CI: chromium and chromedriver must be installed (.ci/run installs Debian's packages)")
        pytest.skip("no chromium + chromedriver here (apt-get install chromium chromium-driver)")
    return chromium, driver


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = _browser_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)  # no selenium-manager download
    try:
        yield drv
    finally:
        drv.quit()


POINTS_PER_PANEL = """
const gd = document.getElementById('pareto');
return Array.from(gd.querySelectorAll('g.trace.scatter'))
  .filter(g => g.__data__ && g.__data__[0] && g.__data__[0].trace.name === 'ranked plans')
  .map(g => g.querySelectorAll('path.point').length);
"""


@pytest.mark.slow
def test_report_renders_in_chromium_with_one_point_per_plan(tmp_path: Path, browser) -> None:
    page = tmp_path / "plan.html"
    res = CliRunner().invoke(app, ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpus", "h100,l40s,a100",
                                   "--rate", "4", "--prompt-tokens", "2000", "--output-tokens", "200",
                                   "--slo", "tpot=40ms", "--slo", "ttft=1s", "--trials", "60", "--top", "4",
                                   "--seed", "1", "--format", "json", "--report", str(page)])
    assert res.exit_code == 0, res.output
    n_plans = len(json.loads(res.stdout)["plans"])
    assert n_plans >= 2
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link)[^>]+(src|href)=", text), "the page must be self-contained"

    browser.get(page.as_uri())
    browser.implicitly_wait(5)
    per_panel = browser.execute_script(POINTS_PER_PANEL)
    assert per_panel == [n_plans, n_plans], per_panel          # one panel per SLO metric (ttft, tpot)
    labels = browser.execute_script(
        "return Array.from(document.querySelectorAll('#pareto .annotation-text')).map(e => e.textContent)")
    for rank in range(1, n_plans + 1):
        assert labels.count(f"#{rank}") == 2, labels           # every plan labelled in both panels
    assert any(t.startswith(("SLO 40.00ms", "SLO 40.00 ms")) for t in labels), labels
    assert len(browser.find_elements("css selector", "details[id^=plan-]")) == n_plans
    assert len(browser.find_elements("css selector", "table.ranked tbody tr")) == n_plans
    # the cost axis is labelled in dollars as drawn (issue #27: plotly's log ticks read '1, 9 8 7 ... 2')
    ticks = browser.execute_script(
        "return Array.from(document.querySelectorAll('#pareto .ytick text')).map(e => e.textContent)")
    assert ticks and all(t.startswith("$") for t in ticks), ticks
    browser.save_screenshot(str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").stat().st_size > 10_000
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
