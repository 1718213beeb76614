"""The thin view without a browser: figures are updated in place as steps arrive (the same figure and
trace objects, longer arrays), the drill-down redraws the heatmap from the state, toggle buttons send
requests, and a session without the token gets only a refusal.
"""

from __future__ import annotations

import numpy as np
import panel as pn

from rlkit.dashboards.server import REFUSED_TITLE, make_app
from rlkit.dashboards.state import DashboardState, TokenText
from rlkit.dashboards.views import Dashboard
from tests.dashboards.conftest import FakeRun, labelled_text
from tests.timeline.fakes import make_step


def dashboard(*runs: FakeRun, **params) -> Dashboard:
    return Dashboard(DashboardState.from_run_dirs([r.run_dir for r in runs], token_text=TokenText(labelled_text),
                                                  **params))


def test_figures_grow_in_place_as_steps_arrive(tmp_path):
    strict, native = FakeRun(tmp_path / "strict"), FakeRun(tmp_path / "native")
    strict.commit(1)
    dash = dashboard(strict, native)
    assert len(dash.step_charts.trace("native", "mismatch_count").x) == 0
    native.commit(1)
    dash.refresh()
    figs = (dash.step_charts.fig, dash.timeline_chart.fig, dash.heatmap_chart.fig)
    traces = [tuple(f.data) for f in figs]
    mism = dash.step_charts.trace("strict", "mismatch_count")
    assert len(mism.x) == 1 and len(dash.step_charts.trace("native", "mismatch_count").x) == 1
    for n in (2, 3):
        strict.commit()
        native.commit()
        dash.refresh()
        assert (dash.step_charts.fig, dash.timeline_chart.fig, dash.heatmap_chart.fig) == figs
        assert [tuple(f.data) for f in figs] == traces, "a refresh replaced traces instead of updating them"
        assert dash.charts_pane.object is figs[0] and dash.heatmap_pane.object is figs[2]
        for label in ("strict", "native"):
            t = dash.step_charts.trace(label, "mismatch_count")
            assert list(t.x) == list(range(n))
            assert list(t.y) == [make_step(s).summary.mismatch_count for s in range(n)]
    held = dash.step_charts.trace("strict", "heldout_reward")  # measured on even steps: a line over the gaps
    assert held.connectgaps and list(held.x) == [0, 1, 2]
    assert held.y[0] == 0.25 and np.isnan(held.y[1]) and held.y[2] == 0.27, list(held.y)
    assert not dash.step_charts.trace("strict", "mismatch_count").connectgaps
    # the timeline: one bar per step, one marker per version, one per sync
    bar, ver, syn, _tog, _pen = dash.timeline_chart.fig.data
    assert len(bar.x) == 3 and len(ver.x) == 4 and len(syn.x) == 8
    assert dash.step_select.options == [0, 1, 2] and dash.step_select.value == 2
    dash.state.close()
    strict.close()
    native.close()


def test_a_run_that_starts_later_renders_first_as_waiting(tmp_path):
    dash = Dashboard.from_run_dirs([tmp_path / "later"])
    dash.__panel__().get_root()  # the whole layout builds with nothing to show
    assert "waiting for the run to start" in dash.status.object and "waiting" in repr(dash)
    assert all(b.disabled for b in dash.controls[0]._buttons.values())
    assert dash.state.heatmap is None and len(dash.tokens_table.value) == 0
    run = FakeRun(tmp_path / "later")
    run.commit(2)
    dash.refresh()
    assert list(dash.step_charts.trace("later", "mismatch_count").x) == [0, 1]
    assert dash.state.step == 1 and dash.state.heatmap.step == 1
    assert not dash.controls[0]._buttons["linear"].disabled
    dash.__panel__().get_root()
    dash.state.close()
    run.close()


def test_drill_down_redraws_the_heatmap_and_token_table(fake_run):
    fake_run.commit(2)
    dash = dashboard(fake_run)
    hm_trace = dash.heatmap_chart.fig.data[0]
    dash.step_select.value = 0
    assert dash.state.step == 0 and not dash.state.follow_latest
    hm = dash.state.heatmap
    assert hm.step == 0 and hm_trace is dash.heatmap_chart.fig.data[0]
    np.testing.assert_array_equal(np.asarray(hm_trace.z, dtype=float), hm.z)
    assert list(dash.heatmap_chart.fig.layout.yaxis.ticktext) == hm.labels
    dash.state.record_id = hm.record_ids[2]
    outline = dash.heatmap_chart.fig.layout.shapes[0]
    assert (outline.y0, outline.y1) == (1.5, 2.5)
    assert len(dash.tokens_table.value) == make_step(0).records[2].n_tokens
    assert list(dash.records_table.value["record_id"]) == [r.record_id for r in make_step(0).records]
    assert set(dash.records_table.value["weight_version"]) == {0} == set(dash.records_table.value["recompute_version"])
    assert "First divergence — fake, step 0" in dash.first_div.object and "op `linear`" in dash.first_div.object
    dash.state.close()


def test_toggle_buttons_send_requests_and_show_them_pending(fake_run):
    fake_run.commit(1)
    dash = dashboard(fake_run)
    controls = dash.controls[0]
    button = controls._buttons["attention"]
    assert button.label == "attention: strict → native" and not button.disabled
    button.clicks += 1
    assert [(r.op, r.path, r.source) for r in fake_run.store.pending_toggles()] == [("attention", "native", "dashboard")]
    assert button.label == "attention: native requested" and button.disabled
    fake_run.commit()
    dash.refresh()
    assert button.label == "attention: native → strict" and not button.disabled
    assert "**attention → native** from step 1" in dash.events.object
    assert len(dash.timeline_chart.fig.data[3].x) == 1  # the applied toggle on the timeline
    dash.state.close()


def test_buttons_are_disabled_without_the_token(fake_run):
    fake_run.commit(1)
    dash = dashboard(fake_run, required_token="the-right-token", session_token=None)
    assert all(b.disabled for b in dash.controls[0]._buttons.values())
    dash.controls[0]._clicked("rope")  # as if a crafted message reached the server
    assert "refused" in dash.state.message and fake_run.store.pending_toggles() == []
    dash.state.close()


def test_a_session_without_the_token_gets_only_a_refusal(fake_run):
    fake_run.commit(1)
    page = make_app([fake_run.run_dir], token="the-right-token")()
    assert isinstance(page, pn.pane.Markdown) and REFUSED_TITLE in page.object
    page = make_app([fake_run.run_dir])()
    assert isinstance(page, Dashboard)
    page.stop()
    page.state.close()
