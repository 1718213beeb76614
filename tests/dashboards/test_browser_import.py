"""An imported run (slime's dump layout, tests/interop/dumps.py) in the dashboard, in Debian Chromium.

`rlkit import slime` writes an ordinary run store; `rlkit dashboard` opens it like any finished run: the
status line says where it came from and what the dump did not record, the charts have its steps, and the
heatmap of its last step shows the known mismatching tokens (6 of them at step 1). No traceback and no JS
error on the page (the `page` fixture), none in the dashboard's log.
"""

from __future__ import annotations

import pytest

from rlkit.interop import import_run
from tests.dashboards.conftest import TOKEN, serve_finished_runs
from tests.interop.dumps import write_slime

pytestmark = pytest.mark.browser


@pytest.fixture
def imported_dashboard(tmp_path):
    """An imported slime run served by `rlkit dashboard`; stopped after the page (requested after this
    fixture) is closed, so the page never sees its server go away."""
    write_slime(tmp_path / "dump")
    run_dir = tmp_path / "slime-run"
    import_run("slime", tmp_path / "dump", run_dir).close()
    with serve_finished_runs([run_dir], tmp_path / "dashboard.log") as base:
        yield base


def test_an_imported_slime_run_opens_in_the_dashboard(imported_dashboard, page):
    page.goto(f"{imported_dashboard}/?token={TOKEN}")
    page.get_by_text("imported from slime; not recorded: sampling parameters").first.wait_for()
    page.get_by_text("slime-run: steps 0–1 (finished)").first.wait_for()
    page.get_by_text("kernel paths — imported from slime: not recorded").first.wait_for()
    assert page.get_by_role("button", name="attention: not recorded").is_disabled()
    page.get_by_text("slime-run step 1: 4 samples × 6 positions, 6 tokens differ").first.wait_for()
    heatmap = page.locator(".js-plotly-plot").nth(2)
    assert heatmap.evaluate("gd => gd.data[0].type") == "heatmap"
    assert heatmap.evaluate("gd => gd.data[0].z.length") == 4
    points = page.locator(".js-plotly-plot").first.evaluate("gd => gd.data[0].x.length")
    assert points == 2  # the mismatch chart has both imported steps
