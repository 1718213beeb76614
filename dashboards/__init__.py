"""The lab's dashboard: a Panel app over run stores, served by `rlkit dashboard` and `rlkit lab`, and
embeddable in a notebook.

- state.py    param classes (RunState, DashboardState): runs, following, drill-down, toggle requests;
              no browser needed (tests/dashboards/test_state.py)
- figures.py  Plotly figures updated in place (step charts, weight-version timeline, token heatmap)
- views.py    the thin `pn.viewable.Viewer` (Dashboard) over the state
- access.py   loopback by default, a token for any other address, the Host names served
- server.py   `serve()`: one dashboard per browser session, plus /api/status and /api/toggle
- lab.py      `rlkit lab`: a strict and a native run side by side, with the dashboard on both
- commands.py the `dashboard` and `lab` subcommands: `add_commands(sub)` registers them in the `rlkit`
              parser (rlkit/cli.py calls it; nothing here imports the CLI)

    from rlkit.dashboards import Dashboard
    Dashboard.from_run_dirs(["runs/lab-.../strict", "runs/lab-.../native"])   # in a notebook cell
"""

from .state import DashboardState, RunState

__all__ = ["Dashboard", "DashboardState", "RunState"]


def __getattr__(name: str):
    # The view imports Panel (a second or so): only when asked for.
    if name == "Dashboard":
        from .views import Dashboard

        return Dashboard
    raise AttributeError(f"module 'rlkit.dashboards' has no attribute {name!r}")
