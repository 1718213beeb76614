"""The committed H200 stores replayed in the dashboard, in Debian Chromium, as a user opens them.

`rlkit dashboard STRICT NATIVE` over copies of lab/runs/h200-validation-2026-11-29 (the 200-step strict
validation and the native run beside it, stopped after 6 steps, written before runs stored their state),
and `rlkit dashboard NATIVE STRICT` over copies of issue 17's learning arms (lab/runs/h200-learning-2026-12-03:
300 steps each under Ray from the same warm start, per-token records of one step in 16):
- each run's status says what it is: the strict runs finished, the stopped native validation run is not running
  and its store does not say why (never "so far", as if it were live);
- the charts overlay both runs, every stored step of each;
- the drill-down opens on a step that has per-token records: the validation's strict run on step 198 (the copy
  keeps every second step), the native learning arm on its worst-mismatch step of those kept (192); switching
  the run keeps the step; a step without per-token records says why;
- the learning arms' held-out rewards are charted at their 30 evaluations each;
- no traceback in the dashboard's log and no JS error on the page (the `page` fixture).
"""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import REPO
from tests.dashboards.conftest import TOKEN, serve_finished_runs

pytestmark = pytest.mark.browser

RUNS = REPO / "lab" / "runs"


def serve_copies(tmp_path, stores, names):
    """The committed runs STORES/NAMES, copied (reading leaves nothing beside the committed files), served
    by `rlkit dashboard`; stopped after the page (requested after the fixture) is closed."""
    dirs = []
    for name in names:
        shutil.copytree(stores / name, tmp_path / name)
        dirs.append(tmp_path / name)
    return serve_finished_runs(dirs, tmp_path / "dashboard.log")


def drill_down_opens_on(page, run, step, samples, positions, differ, bare_step=None, kept_every=None):
    """The drill-down shows `run`'s `step` with its samples x positions heatmap and `differ` differing tokens;
    then `bare_step` (if given), which kept no per-token records, says why."""
    page.get_by_text(f"{run} step {step}: {samples} samples × {positions} positions, {differ} tokens "
                     "differ").first.wait_for()
    heatmap = page.locator(".js-plotly-plot").nth(2)
    assert heatmap.evaluate("gd => gd.data[0].type") == "heatmap"
    assert heatmap.evaluate("gd => gd.data[0].z.length") == samples
    if bare_step is not None:
        page.locator("select").nth(1).select_option(str(bare_step))
        page.get_by_text("no per-token records for this step (this copy of the run keeps those of one step "
                         f"in {kept_every})").first.wait_for()


@pytest.fixture
def replay(tmp_path):
    with serve_copies(tmp_path, RUNS / "h200-validation-2026-11-29", ("strict", "native")) as base:
        yield base


@pytest.fixture
def learning_replay(tmp_path):
    with serve_copies(tmp_path, RUNS / "h200-learning-2026-12-03", ("native", "strict")) as base:
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

    drill_down_opens_on(page, "strict", step=198, samples=16, positions=512, differ=0, bare_step=199, kept_every=2)


def test_the_committed_learning_arms_replay_overlaid_with_their_held_out_curves(learning_replay, page):
    page.goto(f"{learning_replay}/?token={TOKEN}")
    for run in ("native", "strict"):
        page.get_by_text(f"{run}: steps 0–299 (finished)").first.wait_for()
    assert page.get_by_text("so far").count() == 0, "a finished run reads as live"

    chart = page.locator(".js-plotly-plot").first
    points = chart.evaluate("gd => gd.data.map(t => [String(t.name), t.x.length, Array.from(t.y)"
                            ".filter(v => v === v && v !== null).length])")  # v === v leaves out NaN
    assert all(n == 300 for _, n, _ in points), f"the first chart's traces (name, steps, finite values): {points}"
    assert {name for name, _, _ in points} == {"native", "strict"}, points
    held_out = [(name, finite) for name, _, finite in points if finite == 30]
    assert sorted(held_out) == [("native", 30), ("strict", 30)], f"the held-out traces: {points}"

    # the native arm (first) opens on its worst-mismatch step of those with per-token records
    drill_down_opens_on(page, "native", step=192, samples=256, positions=192, differ=40464)
    page.locator("select").nth(0).select_option("strict")  # the same step of the other arm
    drill_down_opens_on(page, "strict", step=192, samples=256, positions=192, differ=0, bare_step=193,
                        kept_every=16)
