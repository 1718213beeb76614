"""Dashboard figures to PNG in headless Chromium (rlkit/dashboards/export.py): the plots docs/VALIDATION.md
commits. Two fake runs overlaid; the PNG has the figure's size and is not blank, and the charts carry each
run's per-step values."""

import numpy as np
import pytest

from rlkit.dashboards import export
from tests.dashboards.conftest import FakeRun


def png_pixels(path):
    """(width, height, RGB pixels) of a PNG (Pillow comes with bokeh, the dashboard's plotting base)."""
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG", im.format
        return im.width, im.height, np.asarray(im.convert("RGB"))


@pytest.fixture
def two_runs(tmp_path):
    runs = [FakeRun(tmp_path / name, steps=5) for name in ("strict", "native")]
    for i, run in enumerate(runs):
        run.commit(3 + i)
    yield runs
    for run in runs:
        run.close()


def test_step_charts_overlay_the_runs_chosen_metrics(two_runs):
    fig = export.step_charts([r.run_dir for r in two_runs], metrics=["reward_mean", "mismatch_count"])
    names = [(t.name, len(t.x)) for t in fig.data]
    assert names == [("strict", 3), ("strict", 3), ("native", 4), ("native", 4)], names
    stored = [s.reward_mean for s in two_runs[1].store.steps()]
    assert list(fig.data[2].y) == stored, (list(fig.data[2].y), stored)
    with pytest.raises(ValueError, match="unknown step metrics"):
        export.step_charts([two_runs[0].run_dir], metrics=["reward"])


def test_png_has_the_figures_size_and_is_drawn(two_runs, tmp_path, browser):
    """Drawn in the dashboard tests' Chromium (Playwright's sync API runs one instance a thread, and the
    package's `browser` fixture holds it); `lab/plot_steps.py` starts its own."""
    out = export.step_charts_png([r.run_dir for r in two_runs], tmp_path / "img" / "steps.png",
                                 metrics=["reward_mean", "k3_kl"], width=800, browser=browser)
    w, h, px = png_pixels(out)
    assert w == 800 and h == 150 * 2 + 60, (w, h)
    colours = {tuple(c) for c in px[:, :, :3].reshape(-1, 3)[:: 97]}
    assert len(colours) > 20, f"{len(colours)} distinct colours: the PNG looks blank"
    # both run colours are drawn: the fake runs hold the same values, so native's lines (drawn last) cover
    # strict's, whose colour stays in the legend and at its own steps' markers' rims
    for hex_colour, least in (("#1f77b4", 20), ("#d62728", 400)):
        rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
        close = np.abs(px[:, :, :3].astype(int) - rgb).sum(-1) < 30
        assert close.sum() >= least, f"{hex_colour}: {int(close.sum())} pixels"


def test_a_missing_chromium_is_a_clear_error(two_runs, tmp_path):
    with pytest.raises(RuntimeError, match="no Chromium at /nonexistent/chromium"):
        export.step_charts_png([two_runs[0].run_dir], tmp_path / "x.png", chromium="/nonexistent/chromium")
