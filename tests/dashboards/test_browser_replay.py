"""The committed H200 stores replayed in the dashboard, in Debian Chromium, as a user opens them.

`rlkit dashboard STRICT NATIVE` over copies of lab/runs/h200-validation-2026-11-29 (the 200-step strict
validation and the native run beside it, stopped after 6 steps, written before runs stored their state):
- each run's status says what it is: the strict run finished, the native one is not running and its store
  does not say why (never "so far", as if it were live);
- the charts overlay both runs, every stored step of each;
- the drill-down opens on a step that has per-token records (step 198: the copy keeps every second step),
  with its heatmap and 0 differing tokens, and a step without them says why;
- no traceback in the dashboard's log and no JS error on the page (the `page` fixture).
The learning arms of issue 17 get the same test when their stores are committed.
"""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import REPO
from tests.dashboards.conftest import TOKEN, serve_finished_runs

pytestmark = pytest.mark.browser

STORES = REPO / "lab" / "runs" / "h200-validation-2026-11-29"


@pytest.fixture
def replay(tmp_path):
    """Both committed runs, copied (reading leaves nothing beside the committed files), served by
    `rlkit dashboard`; stopped after the page (requested after this fixture) is closed."""
    dirs = []
    for name in ("strict", "native"):
        shutil.copytree(STORES / name, tmp_path / name)
        dirs.append(tmp_path / name)
    with serve_finished_runs(dirs, tmp_path / "dashboard.log") as base:
        yield base


def test_the_committed_h200_runs_replay_as_what_they_are(replay, page):
    page.goto(f"{replay}/?token={TOKEN}")
    page.get_by_text("strict: steps 0–199 (finished)").first.wait_for()
    page.get_by_text("native: steps 0–5 (not running: 6 of 200 steps; the store does not say why it "
                     "stopped)").first.wait_for()
    assert page.get_by_text("so far").count() == 0, "a stopped or finished run reads as live"

    chart = page.locator(".js-plotly-plot").first
    traces = chart.evaluate("gd => gd.data.map(t => [String(t.name), t.x.length])")
    lengths = sorted(n for _, n in traces)
    assert 200 in lengths and 6 in lengths, f"the first chart's traces (name, points): {traces}"

    page.get_by_text("strict step 198: 16 samples × 512 positions, 0 tokens differ").first.wait_for()
    heatmap = page.locator(".js-plotly-plot").nth(2)
    assert heatmap.evaluate("gd => gd.data[0].type") == "heatmap"
    assert heatmap.evaluate("gd => gd.data[0].z.length") == 16

    page.locator("select").nth(1).select_option("199")
    page.get_by_text("no per-token records for this step (this copy of the run keeps those of one step "
                     "in 2)").first.wait_for()
