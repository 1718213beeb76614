"""The dashboard's view: a thin `pn.viewable.Viewer` over `DashboardState` (dashboards/state.py).

It lays out the per-step charts (runs overlaid), the kernel-path toggles per run and op, the weight-version
timeline, and the step -> sample -> token drill-down (heatmap, token table, first divergence). It holds
no data of its own: `refresh()` polls the state and updates the figures in place (see figures.py); widget
events call the state's `select_*` and `request_toggle`.

In a notebook:

    import panel as pn
    from rlkit.dashboards import Dashboard
    pn.extension("plotly", "tabulator")
    dash = Dashboard.from_run_dirs(["runs/a"])
    dash.follow()            # poll every second (a periodic callback); dash.refresh() polls once
    dash                     # renders
"""

from __future__ import annotations

import pandas as pd
import panel as pn
import param

from rlkit.contract import OPS
from rlkit.timeline.store import StoreError

from .access import TokenRefused
from .figures import HeatmapChart, StepCharts, TimelineChart, first_divergence_markdown
from .state import DashboardState, RunState

EXTENSIONS = ("plotly", "tabulator")
TOKEN_COLUMNS = ["position", "token", "token_id", "rollout_lp", "trainer_lp", "diff", "mismatch"]
RECORD_VIEW = ["record_id", "prompt_id", "sample_index", "engine_id", "weight_version", "recompute_version",
               "reward", "n_tokens", "mismatch_count", "max_abs_diff"]


class ToggleControls(pn.viewable.Viewer):
    """One button per op for one run: shows the op's path and asks the run for the other one."""

    state = param.ClassSelector(class_=DashboardState)
    run = param.ClassSelector(class_=RunState)

    def __init__(self, **params):
        super().__init__(**params)
        self._buttons = {}
        for op in OPS:
            b = pn.widgets.Button(label=op, color="default", sizing_mode="stretch_width", margin=(2, 5))
            b.on_click(lambda _e, op=op: self._clicked(op))
            self._buttons[op] = b
        self._header = pn.pane.Markdown(margin=(0, 5))
        self.update()

    def _clicked(self, op: str) -> None:
        run = self.run
        target = "native" if run.paths.get(op, "strict") == "strict" else "strict"
        try:
            self.state.request_toggle(run.label, op, target)
        except (TokenRefused, StoreError) as e:
            self.state.message = f"refused: {e}"
        self.update()

    def update(self) -> None:
        run, allowed = self.run, self.state.can_control()
        if not run.exists:
            why = "waiting for the run to start"
        elif run.source:
            why = f"imported from {run.source.get('format')}: not recorded"
        elif run.finished:
            why = "run finished: replay only"
        elif not allowed:
            why = "this page has no valid token: toggles refused"
        else:
            why = "click to switch; applied at the run's next step boundary (a stopped run: when it resumes)"
        self._header.object = f"**{run.label}** kernel paths — {why}"
        for op, b in self._buttons.items():
            current = run.paths.get(op, "not recorded" if run.source else "?")
            asked = run.pending_path(op)
            if asked is not None and asked != current:
                b.label, b.disabled, b.color = f"{op}: {asked} requested", True, "warning"
            elif not run.exists or run.finished or not allowed:
                b.label, b.disabled, b.color = f"{op}: {current}", True, "default"
            else:
                other = "native" if current == "strict" else "strict"
                b.label, b.disabled = f"{op}: {current} → {other}", False
                b.color = "primary" if current == "native" else "default"

    def __panel__(self):
        return pn.Column(self._header, *self._buttons.values(), width=260)


class Dashboard(pn.viewable.Viewer):
    """Runs overlaid, followed live (or replayed), with drill-down and kernel-path toggles."""

    state = param.ClassSelector(class_=DashboardState)

    def __init__(self, state: DashboardState, **params):
        super().__init__(state=state, **params)
        self._seen_revision = -1
        self._syncing = False
        self._callback = None
        self.step_charts = StepCharts([r.label for r in state.runs])
        self.timeline_chart = TimelineChart()
        self.heatmap_chart = HeatmapChart()
        plotly = dict(link_figure=False, sizing_mode="stretch_width", config={"displaylogo": False})
        self.charts_pane = pn.pane.Plotly(self.step_charts.fig, **plotly)
        self.timeline_pane = pn.pane.Plotly(self.timeline_chart.fig, **plotly)
        self.heatmap_pane = pn.pane.Plotly(self.heatmap_chart.fig, **plotly)
        self.charts_pane.param.watch(self._chart_clicked, "click_data")
        self.heatmap_pane.param.watch(self._heatmap_clicked, "click_data")

        self.status = pn.pane.Markdown(sizing_mode="stretch_width")
        self.message = pn.pane.Markdown(sizing_mode="stretch_width", styles={"color": "#555"})
        self.controls = [ToggleControls(state=state, run=r) for r in state.runs]
        self.run_select = pn.widgets.Select.from_param(state.param.run, name="run", width=160)
        self.step_select = pn.widgets.Select(label="step", options=[], width=100)
        self.step_select.param.watch(self._step_chosen, "value")
        self.follow_box = pn.widgets.Checkbox.from_param(state.param.follow_latest, name="follow newest step")
        self.sample_select = pn.widgets.Select.from_param(state.param.record_id, name="sample", width=220)
        self.tokens_table = pn.widgets.Tabulator(pd.DataFrame(columns=TOKEN_COLUMNS), disabled=True,
                                                 show_index=False, height=220, sizing_mode="stretch_width",
                                                 selectable=False)
        self.records_table = pn.widgets.Tabulator(pd.DataFrame(columns=RECORD_VIEW), disabled=True, show_index=False,
                                                  height=180, sizing_mode="stretch_width", selectable=False)
        self.first_div = pn.pane.Markdown(sizing_mode="stretch_width")
        self.events = pn.pane.Markdown(sizing_mode="stretch_width")
        state.param.watch(self._drill_changed, ["heatmap", "record_id", "position"])
        state.param.watch(self._tokens_changed, "tokens")
        state.param.watch(self._records_changed, "step_records")
        state.param.watch(self._step_changed, ["step", "run"])
        state.param.watch(self._message_changed, "message")
        self.refresh(poll=False)
        self._drill_changed()
        self._tokens_changed()
        self._records_changed()

    @classmethod
    def from_run_dirs(cls, run_dirs, **state_params) -> "Dashboard":
        return cls(DashboardState.from_run_dirs(run_dirs, **state_params))

    def __repr__(self) -> str:  # the notebook's text/plain: one line per run, not every DataFrame
        return "Dashboard(" + "; ".join(r.status() for r in self.state.runs) + ")"

    # -- following ------------------------------------------------------------------------------
    def refresh(self, poll: bool = True) -> None:
        """Poll the runs (unless poll=False) and update whatever changed, in place."""
        if poll:
            self.state.poll()
        if self.state.revision == self._seen_revision:
            return
        self._seen_revision = self.state.revision
        runs = self.state.runs
        self.step_charts.update(runs, (self.state.run, self.state.step))
        self.charts_pane.param.trigger("object")
        self.timeline_chart.update(self.state.current)
        self.timeline_pane.param.trigger("object")
        for c in self.controls:
            c.update()
        self.status.object = "  \n".join(r.status() for r in runs)
        self.events.object = self._events_text()
        steps = [int(s) for s in self.state.current.steps["step"]]
        self._syncing = True  # the widget follows the state here; only a user's choice goes back
        try:
            self.step_select.param.update(options=steps, value=self.state.step if self.state.step in steps else None)
        finally:
            self._syncing = False

    def follow(self, period_ms: int = 1000):
        """Poll every `period_ms` (a Panel periodic callback, in a server session or a notebook)."""
        if self._callback is None:
            self._callback = pn.state.add_periodic_callback(self.refresh, period=period_ms)
        return self._callback

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None

    def _events_text(self) -> str:
        lines = []
        for r in self.state.runs:
            for t in r.toggles.itertuples():
                lines.append(f"- {r.label}: **{t.op} → {t.path}** from step {int(t.step)} (asked by {t.source}, "
                             f"applied {t.applied_at - t.requested_at:.1f} s later)")
            for p in r.pending.itertuples():
                lines.append(f"- {r.label}: {p.op} → {p.path} requested (#{int(p.request_id)}), pending")
        return "#### Toggle events\n" + ("\n".join(lines) if lines else "none yet")

    # -- drill-down -----------------------------------------------------------------------------
    def _step_chosen(self, event) -> None:
        if not self._syncing and event.new is not None and event.new != self.state.step:
            self.state.select_step(int(event.new))

    def _chart_clicked(self, event) -> None:
        points = (event.new or {}).get("points") or []
        if not points:
            return
        curve = int(points[0].get("curveNumber", 0))
        label = self.step_charts.labels[curve // len(self.step_charts.metrics)]
        self.state.select_step(int(points[0]["x"]), run=label)

    def _heatmap_clicked(self, event) -> None:
        points = (event.new or {}).get("points") or []
        if points:
            self.state.select_cell(int(points[0]["y"]), int(points[0]["x"]))

    def _step_changed(self, *_events) -> None:
        self._seen_revision = -1  # the charts' step marker and the timeline's run follow the selection
        self.refresh(poll=False)

    def _drill_changed(self, *_events) -> None:
        s = self.state
        self.heatmap_chart.update(s.heatmap, s.run, s.record_id, s.position)
        self.heatmap_pane.param.trigger("object")
        located = s.current.first_divergences() if s.current.exists else pd.DataFrame()
        self.first_div.object = first_divergence_markdown(s.run, s.step, s.first_divergence, located)

    def _tokens_changed(self, *_events) -> None:
        df = self.state.tokens
        self.tokens_table.value = df if df is not None and len(df.columns) else pd.DataFrame(columns=TOKEN_COLUMNS)

    def _records_changed(self, *_events) -> None:
        df = self.state.step_records
        self.records_table.value = (df[RECORD_VIEW] if df is not None and len(df)
                                    else pd.DataFrame(columns=RECORD_VIEW))

    def _message_changed(self, event) -> None:
        self.message.object = event.new

    def __panel__(self):
        drill = pn.Column(
            "## Step → sample → token",
            pn.Row(self.run_select, self.step_select, self.sample_select, self.follow_box),
            pn.pane.Markdown("#### Records the step used (weight version that generated them, version the trainer "
                             "recomputed them at)"),
            self.records_table,
            self.heatmap_pane,
            pn.pane.Markdown("#### Tokens of the chosen sample"),
            self.tokens_table,
            self.first_div,
            sizing_mode="stretch_width")
        return pn.Column(
            pn.pane.Markdown("# rlkit — train/rollout divergence"),
            self.status, self.message,
            pn.Row(self.charts_pane, pn.Column(*self.controls), sizing_mode="stretch_width"),
            "## Weight versions, syncs and toggles",
            self.timeline_pane, self.events,
            drill,
            sizing_mode="stretch_width")
