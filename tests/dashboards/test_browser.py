"""The dashboard in Debian Chromium (Playwright), on a live `rlkit run` subprocess.

One small live run (lab preset, no warm start, 2 prompts x 2 samples, strict) and one `rlkit dashboard`
subprocess with a token serve every test of this module; the tests follow the run as it writes:
- a page or an API request without the token is refused;
- the charts grow as steps arrive (points counted in the browser's Plotly figures);
- clicking a kernel-path toggle makes the run record a ToggleEvent, and the next step's summary has the
  new path; the page shows the event;
- the heatmap opens for a chosen step and sample, the hover shows the token and both logprobs;
- no traceback and no JS error on any page (the `page` fixture), none in the dashboard's log.
Screenshots: artifacts/dashboards/<test>.png (see conftest.py).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from rlkit.dashboards.server import REFUSED_TITLE
from rlkit.timeline import RunStore
from tests.dashboards.conftest import (TOKEN, WAIT_S, free_port, http, rlkit, small_run_args, steps_in, stop,
                                       wait_for)

pytestmark = pytest.mark.browser

RUN_STEPS = 400
"""More than the tests need: the run is stopped (SIGTERM) when the module ends, which is also checked."""


class Live:
    def __init__(self, root):
        self.run_dir = root / "strict"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/?token={TOKEN}"
        self.run_log, self.dash_log = root / "run.log", root / "dashboard.log"
        self.run = rlkit(*small_run_args(self.run_dir, RUN_STEPS), log=self.run_log)
        self.dash = rlkit("dashboard", str(self.run_dir), "--wait", "--port", str(self.port), "--token", TOKEN,
                          "--period-ms", "500", log=self.dash_log)

    def steps(self) -> int:
        return steps_in(self.run_dir)

    def wait_steps(self, n: int) -> int:
        return wait_for(f"{n} steps of the live run", lambda: self.steps() >= n and self.steps(), proc=self.run,
                        log=self.run_log)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    lv = Live(tmp_path_factory.mktemp("live"))
    try:
        wait_for("the dashboard server", lambda: http("GET", f"{lv.base}/api/status", token=TOKEN)[0] == 200,
                 proc=lv.dash, log=lv.dash_log)
        yield lv
    finally:
        dash_code = stop(lv.dash)
        run_code = stop(lv.run)  # SIGTERM: the loop finishes its step and stops
    assert run_code == 0, lv.run_log.read_text()[-2000:]
    assert dash_code == 0, lv.dash_log.read_text()[-2000:]
    assert "Traceback" not in lv.dash_log.read_text(), lv.dash_log.read_text()[-3000:]
    with RunStore.open(lv.run_dir, readonly=True) as store:  # stopped early, every step complete
        steps = store.steps()
        assert 0 < len(steps) < RUN_STEPS
        for s in steps:
            assert len(store.records(s.step)) == 4 and len(store.recomputes(s.step)) == 4


def plot_points(page, index: int = 0) -> int:
    """Points of the first trace of the index-th Plotly figure on the page, as the browser holds them."""
    return page.locator(".js-plotly-plot").nth(index).evaluate("gd => (gd.data && gd.data[0].x) ? gd.data[0].x.length : 0")


def test_page_and_api_refuse_requests_without_the_token(page, live):
    page.goto(live.base + "/")
    page.get_by_text(REFUSED_TITLE).wait_for()
    assert page.locator(".js-plotly-plot").count() == 0
    page.goto(live.base + "/?token=not-the-token")
    page.get_by_text(REFUSED_TITLE).wait_for()
    for token in (None, "not-the-token"):
        code, body = http("POST", f"{live.base}/api/toggle", {"run": "strict", "op": "rope", "path": "native"},
                          token=token)
        assert code == 403 and "refused" in body["error"], (code, body)
        code, body = http("GET", f"{live.base}/api/status", token=token)
        assert code == 403, (code, body)
    wait_for("the run's store", lambda: (live.run_dir / "run.sqlite").is_file(), proc=live.run, log=live.run_log)
    with RunStore.open(live.run_dir, readonly=True) as store:
        assert store.pending_toggles() == [] and store.toggles() == []
    code, body = http("GET", f"{live.base}/api/status", token=TOKEN)
    assert code == 200 and body["runs"][0]["label"] == "strict"


def test_charts_grow_as_steps_arrive(page, live):
    live.wait_steps(1)
    page.goto(live.url)
    page.locator(".js-plotly-plot").first.wait_for()
    first = wait_for("points in the mismatch chart", lambda: plot_points(page, 0))
    wait_for("a new step in the browser", lambda: plot_points(page, 0) > first, proc=live.run, log=live.run_log)
    grown = plot_points(page, 0)
    assert grown > first
    page.get_by_text(re.compile(rf"strict: steps 0–\d+ \(\d+ of {RUN_STEPS} steps so far")).first.wait_for()


def test_clicking_a_toggle_records_a_toggle_event_and_the_next_step_runs_the_new_path(page, live):
    live.wait_steps(1)
    page.goto(live.url)
    page.get_by_role("button", name="attention: strict → native").click()
    page.get_by_role("button", name="attention: native requested").wait_for()

    def applied():
        with RunStore.open(live.run_dir, readonly=True) as s:
            events = s.toggles()
            summaries = {x.step: x for x in s.steps()}
        return events and events[0].step in summaries and (events, summaries)

    events, summaries = wait_for("the run to apply the toggle", applied, proc=live.run, log=live.run_log)
    (ev,) = events
    assert (ev.op, ev.path, ev.source) == ("attention", "native", "dashboard") and ev.request_id is not None
    assert summaries[ev.step].ops_paths["attention"] == "native"
    assert ev.step == 0 or summaries[ev.step - 1].ops_paths["attention"] == "strict"
    assert summaries[ev.step].contract_fingerprint == ev.new_fingerprint
    # the page shows it: the event list and the button, now offering the way back
    page.get_by_text(f"attention → native").first.wait_for()
    page.get_by_text(f"from step {ev.step}").first.wait_for()
    page.get_by_role("button", name="attention: native → strict").wait_for()


def test_heatmap_opens_for_a_chosen_sample(page, live):
    live.wait_steps(2)
    page.goto(live.url)
    page.locator("select").nth(1).wait_for()
    # Stop following the newest step first: with a fast run, new steps re-render the step list every
    # poll, and a choice made while the list is being replaced can be lost in the browser.
    follow = page.get_by_text("follow newest step").first  # Bokeh's checkbox sits beside it in a shadow root
    follow.evaluate("e => { const box = e.getRootNode().querySelector('input[type=checkbox]');"
                    " if (box.checked) box.click(); }")
    wait_for("following switched off", lambda: follow.evaluate(
        "e => !e.getRootNode().querySelector('input[type=checkbox]').checked"))
    step_label = page.get_by_text(re.compile(r"strict step 1: 4 samples × \d+ positions"))
    for attempt in range(3):
        page.locator("select").nth(1).select_option("1")      # step 1
        try:
            step_label.wait_for(timeout=20_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    with RunStore.open(live.run_dir, readonly=True) as s:
        records = s.records(1)
    chosen = records[2]
    page.locator("select").nth(2).select_option(chosen.record_id)
    heatmap = page.locator(".js-plotly-plot").nth(2)
    wait_for("the chosen sample outlined", lambda: heatmap.evaluate(
        "gd => (gd.layout.shapes || []).length ? gd.layout.shapes[0].y0 : null") == 1.5)
    assert heatmap.evaluate("gd => gd.data[0].type") == "heatmap"
    assert heatmap.evaluate("gd => gd.data[0].z.length") == 4
    # the token table lists the chosen sample's tokens
    page.get_by_text(re.compile(r"Tokens of the chosen sample")).wait_for()
    tables = page.locator(".tabulator")  # the step's records, then the chosen sample's tokens
    wait_for("the records table", lambda: tables.nth(0).locator(".tabulator-row").count() == len(records))
    wait_for("the token table", lambda: tables.nth(1).locator(".tabulator-row").count() == chosen.n_tokens)
    # hover the chosen sample's first token: token text, both logprobs
    hover = heatmap.locator(".hoverlayer")

    def hovered() -> bool:
        # hover again on every try: a poll that re-renders the figure clears a hover label that the
        # mouse, standing still, would not bring back
        page.mouse.move(0, 0)
        drag = heatmap.locator(".nsewdrag").first
        box = drag.bounding_box()
        width = heatmap.evaluate("gd => gd.data[0].z[0].length")
        drag.hover(position={"x": box["width"] / (2 * width), "y": box["height"] * 2.5 / 4})  # row 2, position 0
        return "rollout logprob" in (hover.text_content() or "")

    wait_for("the heatmap hover", hovered, every=1.0)
    text = hover.text_content()
    assert f"{chosen.record_id} · position 0" in text and "trainer logprob" in text
