"""`rlkit run`, `rlkit report` and `rlkit bench`: the RL loop and its records from the command line."""

from __future__ import annotations

import json
import signal
import sys
import threading

from rlkit.cli import UsageError, _float, _nonneg_int, _positive_int


def add_run(sub) -> None:
    from rlkit.model.config import MODEL_PRESETS

    p = sub.add_parser("run", help="run RL (rollout, reward, recompute, divergence, update, sync)")
    p.add_argument("--preset", default="tiny", choices=sorted(MODEL_PRESETS))
    p.add_argument("--task", default="arith", choices=["arith", "gsm8k", "dapo"])
    p.add_argument("--steps", type=_positive_int, default=50)
    p.add_argument("--path", default="strict", choices=["strict", "native"])
    p.add_argument("--ops", default="", help="per-op overrides, e.g. attention=native")
    p.add_argument("--runner", default="local", choices=["local", "ray"])
    p.add_argument("--trainer", default="embedded", choices=["embedded", "megatron"])
    p.add_argument("--engines", type=_positive_int, default=1)
    p.add_argument("--rollout-tp", type=_positive_int, default=1,
                   help="tensor-parallel ranks of each rollout engine (needs --runner ray)")
    p.add_argument("--trainer-tp", type=_positive_int, default=1,
                   help="Megatron trainer's tensor-parallel ranks (needs --trainer megatron --runner ray)")
    p.add_argument("--trainer-pp", type=_positive_int, default=1, help="Megatron trainer's pipeline stages (as above)")
    p.add_argument("--run-dir", help="a new (empty) directory for the run store")
    p.add_argument("--resume", metavar="DIR", help="continue a killed or stopped run from its last complete step")
    p.add_argument("--seed", type=_nonneg_int, default=0)
    p.add_argument("--prompts", type=_positive_int, default=None, help="prompts per step")
    p.add_argument("--samples", type=_positive_int, default=None, help="samples per prompt")
    p.add_argument("--max-tokens", type=_positive_int, default=None)
    p.add_argument("--temperature", type=_float, default=None)
    p.add_argument("--dtype", default=None, choices=["bf16", "fp32"])
    p.add_argument("--device", default=None)
    p.add_argument("--warm-start", type=_nonneg_int, default=None, help="supervised arithmetic steps first")
    p.add_argument("--threads", type=_nonneg_int, default=None,
                   help="torch threads (the lab preset uses 1: the strict CPU references run many small ops)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_run)


def run_config_from_args(args):
    from rlkit.config import RunConfig, lab_default
    from rlkit.contract import NumericsContract

    ops = NumericsContract.parse_ops(args.ops) if args.ops else {}
    base = lab_default() if args.task == "arith" and args.preset == "tiny" else RunConfig()
    overrides = dict(model=args.preset, task=args.task, steps=args.steps, path=args.path, ops=ops,
                     runner=args.runner, trainer=args.trainer, engines=args.engines, rollout_tp=args.rollout_tp,
                     trainer_tp=args.trainer_tp, trainer_pp=args.trainer_pp, seed=args.seed)
    if args.task != "arith":
        overrides["warm_start_steps"] = 0
    for name, attr in (("prompts", "prompts_per_step"), ("samples", "samples_per_prompt"),
                       ("max_tokens", "max_tokens"), ("temperature", "temperature"), ("device", "device"),
                       ("warm_start", "warm_start_steps"), ("threads", "threads")):
        value = getattr(args, name)
        if value is not None:
            overrides[attr] = value
    if args.dtype:
        from rlkit.model.config import DTYPE_ALIASES

        overrides["dtype"] = DTYPE_ALIASES[args.dtype]
    return base.replace(**overrides)


def cmd_run(args) -> int:
    from rlkit.loop import run

    if bool(args.run_dir) == bool(args.resume):
        raise UsageError("give either --run-dir DIR (a new run) or --resume DIR")
    stop = threading.Event()

    def _graceful(signum, _frame):  # SIGTERM: finish the current step, then stop with complete records
        stop.set()

    signal.signal(signal.SIGTERM, _graceful)
    if args.resume:
        store = run(args.resume, resume=True, progress=not args.no_progress, stop=stop)
    else:
        try:
            cfg = run_config_from_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        store = run(args.run_dir, cfg, progress=not args.no_progress, stop=stop)
    last = store.last_step()
    print(f"run {store.run_dir}: {0 if last is None else last + 1} complete steps", file=sys.stderr)
    return 0


def add_report(sub) -> None:
    p = sub.add_parser("report", help="one row per step of a run: divergence and reward")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)


REPORT_KEYS = ("step", "weight_version", "compared_tokens", "mismatch_count", "max_abs_diff", "reward_mean")


def cmd_report(args) -> int:
    from rlkit.timeline.store import RunStore

    store = RunStore.open(args.run_dir, readonly=True)
    rows = [{k: getattr(s, k) for k in REPORT_KEYS} for s in store.steps()]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'step':>5} {'version':>7} {'compared':>9} {'mismatch':>9} {'max_abs_diff':>13} {'reward':>7}")
    for r in rows:
        print(f"{r['step']:5d} {r['weight_version']:7d} {r['compared_tokens']:9d} {r['mismatch_count']:9d} "
              f"{r['max_abs_diff']:13.6g} {r['reward_mean']:7.3f}")
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (write long-format rows, render BENCHMARKS.md)")
    p.add_argument("what", choices=["kernels"])
    p.add_argument("rest", nargs="*", help="arguments passed to the benchmark")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from rlkit.bench.kernels import main as bench_kernels

    return int(bench_kernels(args.rest) or 0)
