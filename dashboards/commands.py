"""`rlkit dashboard` and `rlkit lab`: the lab's two commands, registered into the `rlkit` parser by
`add_commands(sub)` (rlkit/cli.py calls it when it builds the parser; nothing here imports the CLI).

    rlkit dashboard runs/a runs/b [--port 5006] [--address 127.0.0.1] [--token T]
    rlkit lab [--steps 50] [--dtype fp32] [--port 5006] [--exit-when-done]

Panel and the run machinery are imported only when a command runs, so `rlkit --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlkit.cli_args import UsageError, nonneg_int, positive_int

DASHBOARD_HELP = """\
Serve the dashboard of one or more runs (live or finished): per-step divergence charts with the runs
overlaid, the weight-version timeline, step -> sample -> token heatmaps, the first divergence (layer, op),
and per-op kernel-path toggles that the live run applies at its next step boundary.

Loopback only by default. Another --address needs --token T: open the page as http://HOST:PORT/?token=T;
a page or a toggle request without the token is refused. Every request must name a served address in its
Host header (the loopback names, or --address), so a DNS-rebinding page is refused. JSON endpoints:
GET /api/status, POST /api/toggle {"run", "op", "path"[, "source"]} (strings; header X-Rlkit-Token when a
token is set; 409 for a run that has finished)."""

LAB_HELP = """\
Start a strict and a native run of the lab preset side by side (two `rlkit run` subprocesses writing
RUNS_DIR/lab-<timestamp>/strict and .../native, logs beside them) and serve the dashboard on both; prints
the URL and opens no browser (works headless). Ctrl-C stops everything: each run finishes its current step
and stops, so its store ends at a complete step (`rlkit run --resume DIR` continues it).

Both runs use fp32 by default. On this CPU the native path mismatched, per step: without warm start
(256 tokens) 1-4 in bf16 vs 40-49 in fp32; after the preset's warm start (~128 tokens) 0-1 in bf16 (mostly
0) vs 1-2 in fp32 (every step); the strict path 0 in all cases. bf16 rounding hides most of the native
kernels' last-bit differences here; fp32 for both runs keeps the kernel path the only difference."""


def add_commands(sub) -> None:
    p = sub.add_parser("dashboard", help="serve the Panel dashboard of one or more runs (live or finished)",
                       description=DASHBOARD_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    _add_serving(p)
    p.add_argument("--wait", action="store_true",
                   help="accept run directories that do not exist yet (followed once their run starts)")
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("lab", help="a strict and a native run side by side, with the dashboard on both",
                       description=LAB_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=None, help="RL steps per run (lab preset: 50)")
    p.add_argument("--warm-start", type=nonneg_int, default=None,
                   help="supervised steps before RL (lab preset: 100; 0 starts RL at once)")
    p.add_argument("--prompts", type=positive_int, default=None, help="prompts per step (lab preset: 8)")
    p.add_argument("--samples", type=positive_int, default=None, help="samples per prompt (lab preset: 8)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="model dtype of both runs (default fp32: see above)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--runs-dir", default="runs", help="where the lab-<timestamp> folder goes (default runs/)")
    _add_serving(p)
    p.add_argument("--exit-when-done", action="store_true",
                   help="stop serving once both runs have ended (default: serve until Ctrl-C, for replay)")
    p.set_defaults(func=cmd_lab)


def _add_serving(p) -> None:
    from .access import DEFAULT_PORT

    p.add_argument("--port", type=positive_int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs --token)")
    p.add_argument("--token", default=None,
                   help="required by the page (?token=T) and by every toggle request; at least 8 characters")
    p.add_argument("--period-ms", type=positive_int, default=1000, help="how often the page polls the runs")


def _announce(url: str) -> None:
    print(f"rlkit dashboard: serving at {url}  (Ctrl-C stops)", file=sys.stderr, flush=True)


def cmd_dashboard(args) -> int:
    from rlkit.timeline.store import DB_NAME, RunStore

    from .access import AccessError, check_serve_policy
    from .server import serve

    try:
        check_serve_policy(args.address, args.token)
    except AccessError as e:
        raise UsageError(str(e)) from None
    for d in args.run_dirs:
        if not (Path(d) / DB_NAME).is_file():  # a new run makes its store once its model is built
            if args.wait:
                continue
            if not Path(d).exists():
                raise UsageError(f"no run directory at {d} (give --wait to follow a run that has not started yet)")
        RunStore.open(d, readonly=True).close()  # a clear StoreError for a directory that is not a run
    try:
        serve(args.run_dirs, port=args.port, address=args.address, token=args.token, period_ms=args.period_ms,
              on_start=_announce)
    except OSError as e:
        raise UsageError(f"cannot serve on {args.address}:{args.port}: {e.strerror or e}") from None
    return 0


def cmd_lab(args) -> int:
    from .access import AccessError
    from .lab import default_root, run_lab

    run_args = ["--dtype", args.dtype, "--seed", str(args.seed)]
    for flag, value in (("--steps", args.steps), ("--warm-start", args.warm_start), ("--prompts", args.prompts),
                        ("--samples", args.samples)):
        if value is not None:
            run_args += [flag, str(value)]
    try:
        return run_lab(default_root(args.runs_dir), run_args, args.port, args.address, args.token,
                       exit_when_done=args.exit_when_done, period_ms=args.period_ms)
    except AccessError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(str(e)) from None
