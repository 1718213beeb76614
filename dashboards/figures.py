"""Plotly figures of the dashboard, built once and then updated in place from the param state.

Each class owns one `go.Figure` and an `update(...)` that assigns new arrays to its existing traces (and
new shapes to its layout); the view then triggers its Plotly pane, which sends only the arrays that
changed. Replacing figure objects on every poll caused intermittent JS errors in a real browser
(seen in the dashboard's browser tests), so no method here ever builds a second figure.

- `StepCharts`     mismatch_count, max_abs_diff, K3 KL, importance-ratio spread, reward and held-out reward
                   per step (the held-out reward's line joins the steps that measured it); one trace
                   per run and metric (runs overlaid); applied toggles as dotted lines; the chosen step.
- `TimelineChart`  weight versions (trainer lane), each engine's syncs with checksums, each step's span and
                   the records it used, applied and pending toggles, over wall-clock seconds of one run.
- `HeatmapChart`   samples x positions of one step: EQUAL_Z where rollout and trainer agree bit for bit,
                   log10|diff| where they do not; hover shows token text, both logprobs and the difference.

No Panel here: the figures are testable (and usable in a notebook) on their own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .state import EQUAL_Z, MAX_Z, METRICS, HeatmapData, RunState

RUN_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
EMPTY = np.array([], dtype=float)


def run_color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


class StepCharts:
    """One row per metric, one trace per (run, metric); x is the step."""

    def __init__(self, labels: list[str], metrics: list[str] | None = None):
        """`metrics`: the rows to draw, keys of METRICS in the order given (None: all of them)."""
        self.labels = list(labels)
        self.metrics = list(METRICS) if metrics is None else list(metrics)
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown or not self.metrics:
            raise ValueError(f"unknown step metrics {unknown}; choose from {', '.join(METRICS)}")
        self.fig = make_subplots(rows=len(self.metrics), cols=1, shared_xaxes=True, vertical_spacing=0.045,
                                 subplot_titles=[METRICS[m] for m in self.metrics])
        for i, label in enumerate(self.labels):
            for j, metric in enumerate(self.metrics):
                self.fig.add_trace(go.Scatter(
                    x=EMPTY, y=EMPTY, mode="lines+markers", name=label, legendgroup=label, showlegend=j == 0,
                    line=dict(color=run_color(i), width=1.5), marker=dict(size=5),
                    connectgaps=metric == "heldout_reward",
                    hovertemplate=f"{label} · step %{{x}}<br>{METRICS[metric]} %{{y:.6g}}<extra></extra>"),
                    row=j + 1, col=1)
        if self.metrics[0] == "mismatch_count":
            self.fig.update_yaxes(rangemode="tozero", row=1, col=1)
        self.fig.update_xaxes(tickformat="d")
        self.fig.update_xaxes(title_text="step", row=len(self.metrics), col=1)
        self.fig.update_layout(height=150 * len(self.metrics) + 60, margin=dict(l=60, r=20, t=40, b=40),
                               legend=dict(orientation="h", y=1.06, x=0), template="plotly_white",
                               hovermode="closest", uirevision="steps")
        self._titles = tuple(self.fig.layout.annotations)

    def trace(self, label: str, metric: str) -> go.Scatter:
        return self.fig.data[self.labels.index(label) * len(self.metrics) + self.metrics.index(metric)]

    def update(self, runs: list[RunState], selected: tuple[str, int | None] | None = None) -> None:
        shapes, notes = [], list(self._titles)
        for i, run in enumerate(runs):
            df = run.steps
            x = df["step"].to_numpy(dtype=float)
            for metric in self.metrics:
                t = self.trace(run.label, metric)
                t.x, t.y = x, df[metric].to_numpy(dtype=float)
            for _, tg in run.toggles.iterrows():
                s = float(tg["step"]) - 0.5
                shapes.append(dict(type="line", xref="x", yref="paper", x0=s, x1=s, y0=0, y1=1,
                                   line=dict(color=run_color(i), width=1, dash="dot")))
                notes.append(dict(x=s, y=1.0, xref="x", yref="paper", showarrow=False, xanchor="left",
                                  yanchor="bottom", font=dict(size=9, color=run_color(i)),
                                  text=f"{run.label}: {tg['op']}→{tg['path']}"))
        if selected is not None and selected[1] is not None:
            s = float(selected[1])
            shapes.append(dict(type="rect", xref="x", yref="paper", x0=s - 0.4, x1=s + 0.4, y0=0, y1=1,
                               fillcolor="rgba(120,120,120,0.12)", line=dict(width=0), layer="below"))
        with self.fig.batch_update():
            self.fig.layout.shapes = shapes
            self.fig.layout.annotations = notes


class TimelineChart:
    """Weight versions, syncs, step spans and toggles of one run, against seconds since version 0."""

    LANES = ("steps", "trainer")

    def __init__(self):
        self.fig = go.Figure()
        self.fig.add_trace(go.Bar(orientation="h", x=EMPTY, base=EMPTY, y=[], name="step",
                                  marker=dict(color=[]), hovertemplate="%{text}<extra></extra>", text=[],
                                  textposition="none", showlegend=False))
        self.fig.add_trace(go.Scatter(x=EMPTY, y=[], mode="markers+text", name="weight version", text=[],
                                      textposition="top center", marker=dict(symbol="diamond", size=9,
                                                                             color="#444"),
                                      hovertext=[], hovertemplate="%{hovertext}<extra></extra>"))
        self.fig.add_trace(go.Scatter(x=EMPTY, y=[], mode="markers", name="sync (checksum acknowledged)",
                                      marker=dict(symbol="circle", size=8, color=[]), hovertext=[],
                                      hovertemplate="%{hovertext}<extra></extra>"))
        self.fig.add_trace(go.Scatter(x=EMPTY, y=[], mode="markers+text", name="toggle applied", text=[],
                                      textposition="top center", marker=dict(symbol="star", size=11,
                                                                             color="#ff7f0e"),
                                      hovertext=[], hovertemplate="%{hovertext}<extra></extra>"))
        self.fig.add_trace(go.Scatter(x=EMPTY, y=[], mode="markers+text", name="toggle requested", text=[],
                                      textposition="bottom center",
                                      marker=dict(symbol="star-open", size=11, color="#ff7f0e"),
                                      hovertext=[], hovertemplate="%{hovertext}<extra></extra>"))
        self.fig.update_layout(height=300, margin=dict(l=90, r=20, t=30, b=40), template="plotly_white",
                               barmode="overlay", legend=dict(orientation="h", y=1.12, x=0), uirevision="timeline",
                               xaxis_title="seconds since weight version 0",
                               yaxis=dict(type="category", categoryorder="array", categoryarray=list(self.LANES)))

    def update(self, run: RunState) -> None:
        versions, syncs, toggles, pending = run.versions, run.syncs, run.toggles, run.pending
        t0 = float(versions["created_at"].min()) if len(versions) else 0.0
        created = dict(zip(versions["version"].astype(int), versions["created_at"].astype(float)))
        steps, records = run.steps, run.records
        bars_x, bars_base, bars_text, bars_color = [], [], [], []
        for _, s in steps.iterrows():
            v = int(s["weight_version"])
            start, end = created.get(v), created.get(v + 1)
            if start is None or end is None:
                continue
            recs = records[records["step"] == s["step"]]
            used = ", ".join(f"{n} of version {ver}" for ver, n in recs.groupby("weight_version").size().items())
            rec_v = sorted(set(recs["recompute_version"].dropna().astype(int)))
            bars_base.append(start - t0)
            bars_x.append(max(end - start, 1e-3))
            bars_color.append("#d62728" if s["mismatch_count"] else "#2ca02c")
            bars_text.append(f"step {int(s['step'])}: rollouts at version {v}, records used {used or 'none'}, "
                             f"recomputed at version {', '.join(map(str, rec_v)) or '—'}<br>"
                             f"{int(s['mismatch_count'])} of {int(s['compared_tokens'])} tokens differ")
        engines = sorted(set(syncs["engine_id"])) if len(syncs) else []
        lanes = list(self.LANES) + engines + ["toggles"]
        bar, ver, syn, tog, pen = self.fig.data
        with self.fig.batch_update():
            bar.x, bar.base, bar.text = np.asarray(bars_x, float), np.asarray(bars_base, float), bars_text
            bar.y, bar.marker.color = ["steps"] * len(bars_x), bars_color
            ver.x = versions["created_at"].to_numpy(float) - t0
            ver.y = ["trainer"] * len(versions)
            every = 1 if len(versions) <= 16 else 10  # label every version while they fit
            ver.text = [f"v{int(v)}" if int(v) % every == 0 else "" for v in versions["version"]]
            ver.hovertext = [f"version {int(r.version)} (after step {int(r.step)})<br>checksum {r.checksum}<br>"
                             f"contract {r.contract_fingerprint}" for r in versions.itertuples()]
            syn.x = syncs["finished_at"].to_numpy(float) - t0
            syn.y = list(syncs["engine_id"])
            syn.marker.color = ["#2ca02c" if ok else "#d62728" for ok in syncs["ok"]]
            syn.hovertext = [f"{r.engine_id} loaded version {int(r.version)} in {r.duration:.2f} s<br>"
                             f"checksum sent {r.checksum_sent}<br>acknowledged {r.checksum_acknowledged} "
                             f"{'(match)' if r.ok else '(MISMATCH)'}" for r in syncs.itertuples()]
            tog.x = toggles["applied_at"].to_numpy(float) - t0
            tog.y = ["toggles"] * len(toggles)
            tog.text = [f"{r.op}→{r.path}" for r in toggles.itertuples()]
            tog.hovertext = [f"{r.op} → {r.path} from step {int(r.step)}<br>asked by {r.source}, applied "
                             f"{r.applied_at - r.requested_at:.1f} s later<br>new contract {r.new_fingerprint}"
                             for r in toggles.itertuples()]
            pen.x = pending["requested_at"].to_numpy(float) - t0
            pen.y = ["toggles"] * len(pending)
            pen.text = [f"{r.op}→{r.path}?" for r in pending.itertuples()]
            pen.hovertext = [f"request #{int(r.request_id)}: {r.op} → {r.path} (asked by {r.source}); "
                             f"applies at the next step boundary" for r in pending.itertuples()]
            self.fig.layout.yaxis.categoryarray = lanes
            self.fig.layout.title = dict(text=f"timeline of {run.label}", font=dict(size=13), x=0.01, y=0.98)
            self.fig.layout.height = 140 + 40 * len(lanes)


HEATMAP_COLORSCALE = [
    [0.0, "#e8e8e8"], [0.08, "#e8e8e8"],           # EQUAL_Z: bitwise equal
    [0.0834, "#fff5eb"], [0.35, "#fdae6b"], [0.6, "#e6550d"], [1.0, "#7f2704"],   # log10|diff| -9 .. 2
]


class HeatmapChart:
    """The per-token divergence heatmap of one step; the chosen sample (and token) outlined."""

    def __init__(self):
        ticks = [EQUAL_Z, -8, -6, -4, -2, 0, MAX_Z]
        self.fig = go.Figure(go.Heatmap(
            z=np.zeros((0, 0)), x=EMPTY, y=EMPTY, text=[], hovertemplate="%{text}<extra></extra>",
            colorscale=HEATMAP_COLORSCALE, zmin=EQUAL_Z, zmax=MAX_Z, xgap=1, ygap=1, hoverongaps=False,
            colorbar=dict(title=dict(text="|trainer − rollout|", side="right"), tickvals=ticks,
                          ticktext=["equal"] + [f"1e{int(t):+d}" for t in ticks[1:]])))
        self.fig.update_layout(height=300, margin=dict(l=150, r=20, t=40, b=40), template="plotly_white",
                               xaxis=dict(title="token position", dtick=1), uirevision="heatmap",
                               yaxis=dict(autorange="reversed", tickmode="array", tickvals=[], ticktext=[]))

    def update(self, hm: HeatmapData | None, run_label: str = "", record_id: str | None = None,
               position: int | None = None) -> None:
        trace = self.fig.data[0]
        with self.fig.batch_update():
            if hm is None:
                trace.z, trace.x, trace.y, trace.text = np.zeros((0, 0)), EMPTY, EMPTY, []
                self.fig.layout.title = dict(text="no step chosen", font=dict(size=13))
                self.fig.layout.shapes = []
                return
            n, width = hm.shape
            rows = np.arange(n, dtype=float)
            trace.z, trace.x, trace.y, trace.text = hm.z, np.arange(width, dtype=float), rows, hm.hover
            # layout values go to the browser as JSON, not as data sources: plain lists
            self.fig.layout.yaxis.tickvals = rows.tolist()
            self.fig.layout.yaxis.ticktext = list(hm.labels)
            self.fig.layout.height = int(max(220, 90 + min(22, max(12, 1200 // max(n, 1))) * n))
            # every position while they fit; none on a step without rows (the last step's range is kept)
            self.fig.layout.xaxis.dtick = 1 if 0 < width <= 40 else None
            self.fig.layout.xaxis.showticklabels = n > 0
            title = (f"{run_label} step {hm.step}: {hm.note}" if hm.note else
                     f"{run_label} step {hm.step}: {n} samples × {width} positions, {int(hm.mismatch.sum())} tokens differ")
            self.fig.layout.title = dict(text=title, font=dict(size=13))
            shapes = []
            if record_id in hm.record_ids:
                r = hm.row(record_id)
                shapes.append(dict(type="rect", x0=-0.5, x1=width - 0.5, y0=r - 0.5, y1=r + 0.5,
                                   line=dict(color="#1f77b4", width=2)))
                if position is not None:
                    shapes.append(dict(type="rect", x0=position - 0.5, x1=position + 0.5, y0=r - 0.5, y1=r + 0.5,
                                       line=dict(color="#000", width=2)))
            self.fig.layout.shapes = shapes


def first_divergence_markdown(run: str, step: int | None, fd: dict | None, located: pd.DataFrame) -> str:
    """The first-divergence view of one step, and where the locator found it on other steps."""
    if step is None:
        return "### First divergence\nNo step yet."
    lines = [f"### First divergence — {run}, step {step}"]
    if fd is None:
        lines.append("The locator did not run on this step or found no differing op (it runs on steps with "
                     "mismatching tokens, every `locate_every` steps).")
    else:
        lines.append(f"**layer {fd.get('layer')} · op `{fd.get('op')}`** ({fd.get('site', '')}, module "
                     f"`{fd.get('module', '')}`): {fd.get('differing_rows', '?')} of {fd.get('compared_rows', '?')} "
                     f"rows differ, {fd.get('differing_elements', '?')} elements, max |diff| "
                     f"{float(fd.get('max_abs_diff', float('nan'))):.3g}; first at {fd.get('first_key')}")
    if len(located):
        seen = ", ".join(f"step {int(r.step)}: layer {r.layer} {r.op}" for r in located.tail(8).itertuples())
        lines.append(f"\nLocated in this run: {seen}")
    return "\n".join(lines)
