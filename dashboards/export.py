"""Dashboard figures as PNG files, drawn by the Plotly.js the dashboard itself runs, in headless Chromium:
the committed plots of docs/VALIDATION.md, made from the committed run stores.

    from rlkit.dashboards.export import step_charts_png
    step_charts_png(["lab/runs/learning/strict", "lab/runs/learning/native"], "docs/img/learning.png",
                    metrics=["reward_mean", "heldout_reward", "k3_kl", "mismatch_count"])

Needs Playwright (requirements-test.txt) and a Chromium binary (`make setup-test` installs Debian's); a
clear error says which is missing. kaleido, Plotly's own exporter, is not a dependency.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import plotly.graph_objects as go

from .figures import StepCharts
from .state import DashboardState

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium(path: str | None = None) -> str:
    """`path`, or the first of CHROMIUM_PATHS that exists; a RuntimeError that says how to get one."""
    for candidate in ([path] if path else CHROMIUM_PATHS):
        if Path(candidate).is_file():
            return candidate
    raise RuntimeError(f"no Chromium at {path or ', '.join(CHROMIUM_PATHS)}: `make setup-test` installs "
                       "Debian's chromium (or pass chromium=PATH)")


def figure_png(fig: go.Figure, path, width: int = 1000, chromium: str | None = None, browser=None) -> Path:
    """Write `fig` to `path` as a PNG of `width` CSS pixels (its height: the figure's own, else 600),
    rendered by Plotly.js in headless Chromium with the figure's data inlined (no network). `browser`: a
    Playwright Browser to draw in (one for many figures; Playwright's sync API runs one instance a
    thread); None starts Chromium for this figure."""
    height = int(fig.layout.height or 600)
    out = Path(path)
    html = fig.to_html(include_plotlyjs=True, full_html=True, config={"staticPlot": True},
                       default_width=f"{width}px", default_height=f"{height}px")
    if browser is None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise RuntimeError("figure_png needs Playwright: pip install -r requirements-test.txt") from None
        exe = find_chromium(chromium)
        with sync_playwright() as p:
            own = p.chromium.launch(executable_path=exe, args=CHROMIUM_FLAGS)
            try:
                return _draw(own, html, out, width, height)
            finally:
                own.close()
    return _draw(browser, html, out, width, height)


def _draw(browser, html: str, out: Path, width: int, height: int) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlkit-png-") as tmp:
        page_file = Path(tmp) / "figure.html"
        page_file.write_text(html)
        page = browser.new_page(viewport={"width": width, "height": height})
        try:
            page.goto(page_file.as_uri())
            page.wait_for_selector(".plotly-graph-div .main-svg")
            page.locator(".plotly-graph-div").first.screenshot(path=str(out))
        finally:
            page.close()
    return out


def step_charts(run_dirs, metrics: list[str] | None = None) -> go.Figure:
    """The dashboard's per-step charts of `run_dirs`, overlaid (one colour a run), as a figure."""
    state = DashboardState.from_run_dirs(run_dirs)
    charts = StepCharts([r.label for r in state.runs], metrics)
    charts.update(state.runs)
    return charts.fig


def step_charts_png(run_dirs, path, metrics: list[str] | None = None, width: int = 1000,
                    chromium: str | None = None, browser=None) -> Path:
    """`step_charts` of `run_dirs` written to `path` as a PNG (see `figure_png`)."""
    return figure_png(step_charts(run_dirs, metrics), path, width, chromium, browser)
