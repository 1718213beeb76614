"""`rlkit ...`: one thin command layer over the library.

    rlkit parity --preset tiny --path strict --json
    rlkit run --preset tiny --task arith --steps 50 --path strict --run-dir runs/a
    rlkit run --resume runs/a
    rlkit warmstart --preset tiny --task add2 --max-steps 200 --out ckpt/warm
    rlkit run --preset tiny --task add2 --init-from ckpt/warm --heldout-every 10 --run-dir runs/b
    rlkit report runs/a [--json] [--check]
    rlkit import slime dumps/run --run-dir runs/slime-run
    rlkit export runs/a --to rlkit|tensorboard|wandb [--out PATH]
    rlkit dashboard runs/a runs/b
    rlkit lab
    rlkit bench kernels

Bad arguments and unusable inputs end with one clear line on stderr and exit code 2 (never a traceback),
and are refused before anything is created; `--debug` shows the traceback. The dashboards register their
own subcommands (`dashboard`, `lab`) through `rlkit.dashboards.commands.add_commands`, imported here only
when the parser is built, so the library never imports the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading

from rlkit.cli_args import (Parser, UsageError, bounded_nonneg_int, bounded_positive_int, finite_float,
                            nonneg_int, positive_float)

__all__ = ["main", "build_parser", "UsageError", "run_config_from_args", "resume_conflicts"]


@contextlib.contextmanager
def _stdout_to_stderr():
    """Everything written to stdout inside (a library's logging, C-level prints) goes to stderr, at the
    file-descriptor level, so `--json` leaves stdout holding the JSON alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# -- rlkit parity ------------------------------------------------------------------------------------
def _add_parity(sub) -> None:
    from rlkit.contract import DEFAULT_NAME, NAMES
    from rlkit.model.config import MODEL_PRESETS

    p = sub.add_parser("parity", help="run the parity chain and the trainer-vs-decode comparison")
    p.add_argument("--preset", default="tiny", choices=sorted(MODEL_PRESETS))
    p.add_argument("--contract", default=DEFAULT_NAME, choices=list(NAMES), help="the numerics contract")
    p.add_argument("--path", default="strict", choices=["strict", "native"])
    p.add_argument("--ops", default="", help="per-op overrides, e.g. attention=native,linear=strict")
    p.add_argument("--rollout", default="embedded", choices=["embedded", "vllm"])
    p.add_argument("--prompts", type=bounded_positive_int, default=16)
    p.add_argument("--max-tokens", type=bounded_positive_int, default=128)
    p.add_argument("--temperature", type=positive_float, default=1.0)
    p.add_argument("--top-k", type=bounded_nonneg_int, default=0)
    p.add_argument("--top-p", type=finite_float, default=1.0)
    p.add_argument("--seed", type=bounded_nonneg_int, default=0)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch threads (default 1: the strict CPU references run many small ops, which "
                        "extra threads slow down; 0 leaves torch's default)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=_cmd_parity)


def _cmd_parity(args) -> int:
    from rlkit.parity import report_json, run_parity, settings_from_args

    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.json:
        with _stdout_to_stderr():
            report = run_parity(settings)
        print(report_json(report))
    else:
        print(run_parity(settings).table())
    return 0


# -- rlkit run ---------------------------------------------------------------------------------------
# (flag, RunConfig field, default): the run's settings. A new run takes them from the flags (defaults
# below); a resumed run takes them from its store, and a flag that differs from the stored value is
# refused (one line naming each), so a resumed run is always the run that was stored.
RUN_SETTINGS = (
    ("preset", "model", "tiny"), ("task", "task", "arith"), ("steps", "steps", 50), ("contract", "contract_name", None),
    ("path", "path", "strict"),
    ("ops", "ops", ""), ("runner", "runner", "local"), ("trainer", "trainer", "embedded"),
    ("engines", "engines", 1), ("rollout_tp", "rollout_tp", 1), ("trainer_tp", "trainer_tp", 1),
    ("trainer_pp", "trainer_pp", 1), ("trainer_cp", "trainer_cp", 1), ("seed", "seed", 0),
    ("prompts", "prompts_per_step", None),
    ("samples", "samples_per_prompt", None), ("max_tokens", "max_tokens", None),
    ("temperature", "temperature", None), ("dtype", "dtype", None), ("device", "device", None),
    ("warm_start", "warm_start_steps", None), ("threads", "threads", None),
    ("init_from", "init_checkpoint", None), ("heldout_every", "heldout_every", None),
    ("heldout_prompts", "heldout_prompts", None), ("checkpoint_every", "checkpoint_every", None),
)
RUN_HELP = """\
A new run: --run-dir DIR (a new or empty directory). Every value is checked before anything is created
(the device exists, the data files load, max-tokens fits the model, a finite temperature); a refused
command leaves nothing behind.

--resume DIR continues a killed or stopped run from its last checkpoint with the settings stored in
DIR: a flag that differs from the stored value is refused (one line naming each), and a store made under
another contract is never continued. The checkpoint is taken from DIR's own checkpoints/ folder and must
hold the weights whose checksum the store recorded; steps committed after it are recomputed and must come
out bit for bit as stored. One writer per run directory: a second `rlkit run` on a directory in use is
refused and writes nothing."""


def _add_run(sub) -> None:
    from rlkit.contract import DEFAULT_NAME, NAMES
    from rlkit.data.tasks import TASKS
    from rlkit.model.config import MODEL_PRESETS

    p = sub.add_parser("run", help="run RL (rollout, reward, recompute, divergence, update, sync)",
                       description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", help="a new (empty) directory for the run store")
    p.add_argument("--resume", metavar="DIR", help="continue a killed or stopped run from its last checkpoint")
    p.add_argument("--preset", choices=sorted(MODEL_PRESETS), help="model preset (default tiny)")
    p.add_argument("--task", choices=list(TASKS),
                   help="default arith (add2 / add3: multi-digit addition; add8w: eight-digit addition answered "
                        "with its column-by-column working, ~152-token responses; add9c: nine-digit addition "
                        "worked from labelled column pairs, ~157-token responses)")
    p.add_argument("--steps", type=bounded_positive_int, help="default 50")
    p.add_argument("--contract", choices=list(NAMES),
                   help=f"the numerics contract (default {DEFAULT_NAME}; older versions stay selectable)")
    p.add_argument("--path", choices=["strict", "native"], help="every op's kernel path (default strict)")
    p.add_argument("--ops", help="per-op overrides, e.g. attention=native")
    p.add_argument("--runner", choices=["local", "ray"], help="default local")
    p.add_argument("--trainer", choices=["embedded", "megatron"], help="default embedded")
    p.add_argument("--engines", type=bounded_positive_int, help="rollout engines (default 1)")
    p.add_argument("--rollout-tp", type=bounded_positive_int,
                   help="tensor-parallel ranks of each rollout engine (needs --runner ray; default 1)")
    p.add_argument("--trainer-tp", type=bounded_positive_int,
                   help="Megatron trainer's tensor-parallel ranks (needs --trainer megatron --runner ray)")
    p.add_argument("--trainer-pp", type=bounded_positive_int, help="Megatron trainer's pipeline stages (as above)")
    p.add_argument("--trainer-cp", type=bounded_positive_int,
                   help="Megatron trainer's context-parallel ranks: each packed batch split over them (as above)")
    p.add_argument("--seed", type=bounded_nonneg_int, help="default 0")
    p.add_argument("--prompts", type=bounded_positive_int, help="prompts per step")
    p.add_argument("--samples", type=bounded_positive_int, help="samples per prompt")
    p.add_argument("--max-tokens", type=bounded_positive_int,
                   help="new tokens per sample (at most the model's sequence length, prompt included)")
    p.add_argument("--temperature", type=positive_float, help="a finite number > 0")
    p.add_argument("--dtype", choices=["bf16", "fp32"])
    p.add_argument("--device", help="cpu | cuda | cuda:N (must exist here)")
    p.add_argument("--warm-start", type=bounded_nonneg_int, help="supervised arithmetic steps first")
    p.add_argument("--init-from", metavar="DIR",
                   help="start from an init checkpoint (`rlkit warmstart --out DIR`) instead of the seeded init: "
                        "its checksum goes into the store; a missing or changed folder is refused")
    p.add_argument("--heldout-every", type=bounded_nonneg_int,
                   help="measure the reward on the task's fixed held-out set every N steps (default 0: never)")
    p.add_argument("--heldout-prompts", type=bounded_positive_int, help="held-out prompts (default 64)")
    p.add_argument("--checkpoint-every", type=bounded_nonneg_int,
                   help="save the trainer's state every N steps, at the last step and at a stop (default 1; "
                        "0: never, and such a run cannot be resumed)")
    p.add_argument("--threads", type=bounded_nonneg_int,
                   help="torch threads (the lab preset uses 1: the strict CPU references run many small ops)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--log-to", choices=["tensorboard", "wandb"], action="append",
                   help="also log each step's metrics to TensorBoard or W&B (offline), as the run commits it "
                        "(give it twice for both)")
    p.add_argument("--log-dir", help="where --log-to writes: TensorBoard's event files in it, W&B's wandb/ "
                                     "folder under it (default: RUN_DIR/tensorboard, and RUN_DIR/wandb/)")
    p.set_defaults(func=_cmd_run)


def _given(args) -> dict:
    return {flag: getattr(args, flag) for flag, _, _ in RUN_SETTINGS if getattr(args, flag) is not None}


def _field_value(flag: str, value):
    """A flag's value as the RunConfig field holds it."""
    if flag == "ops":
        from rlkit.contract import NumericsContract

        return NumericsContract.parse_ops(value) if value else {}
    if flag == "dtype":
        from rlkit.model.config import DTYPE_ALIASES

        return DTYPE_ALIASES[value]
    return value


def run_config_from_args(args):
    """The RunConfig of a new run: the lab preset's values for the tiny arithmetic run, else RunConfig's,
    with every given flag on top."""
    from rlkit.config import RunConfig, lab_default

    values = {flag: default for flag, _, default in RUN_SETTINGS if default is not None}
    values.update(_given(args))
    base = lab_default() if values["task"] == "arith" and values["preset"] == "tiny" else RunConfig()
    overrides = {field: _field_value(flag, values[flag]) for flag, field, _ in RUN_SETTINGS if flag in values}
    if (values["task"] != "arith" or "init_from" in values) and "warm_start" not in values:
        overrides["warm_start_steps"] = 0
    return base.replace(**overrides)


def resume_conflicts(args, stored: dict) -> list[str]:
    """The given flags whose value differs from the stored run config's, as '--flag VALUE (stored: X)'."""
    out = []
    for flag, field, _ in RUN_SETTINGS:
        value = getattr(args, flag)
        if value is not None and _field_value(flag, value) != stored.get(field):
            shown = flag.replace("_", "-")
            out.append(f"--{shown} {value} (stored: {stored.get(field)!r})")
    return out


def _cmd_run(args) -> int:
    from rlkit.loop import run

    if bool(args.run_dir) == bool(args.resume):
        raise UsageError("give either --run-dir DIR (a new run) or --resume DIR")
    stop = threading.Event()

    def _graceful(signum, _frame):  # SIGTERM: finish the current step, then stop with complete records
        stop.set()

    if args.resume:
        from rlkit.config import RunConfig
        from rlkit.timeline.lock import check_free
        from rlkit.timeline.store import RunStore

        check_free(args.resume)  # a run still starting has its lock before its store
        with RunStore.open(args.resume, readonly=True, untouched=True) as peek:  # lock-free, creates nothing
            stored = RunConfig.from_dict(peek.config()).to_dict()  # older stores' field names too
        conflicts = resume_conflicts(args, stored)
        if conflicts:
            raise UsageError(f"--resume continues the run with the settings stored in {args.resume}; these flags "
                             f"differ from them: {', '.join(conflicts)} (drop them, or start a new run)")
        cfg = None
    else:
        try:
            cfg = run_config_from_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    from rlkit.train.warm_start import WarmStartStopped

    loggers = _live_loggers(args)
    previous = signal.signal(signal.SIGTERM, _graceful)
    try:
        store = run(args.resume or args.run_dir, cfg, resume=bool(args.resume), progress=not args.no_progress,
                    stop=stop)
    except WarmStartStopped as e:  # a stop request before step 0: the store holds no step
        print(f"rlkit run: {e}; no step was written", file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_all(loggers)
    last = store.last_step()
    print(f"run {store.run_dir}: {0 if last is None else last + 1} complete steps", file=sys.stderr)
    return 0


def _live_loggers(args) -> list:
    """`--log-to`: per target, a thread that follows the run's store and logs each new step."""
    if args.log_dir and not args.log_to:
        raise UsageError("--log-dir needs --log-to tensorboard|wandb")
    if not args.log_to:
        return []
    from rlkit.interop.step_log import LiveLogger, StepWriter
    from rlkit.timeline.store import RunStore

    run_dir = args.resume or args.run_dir
    after = None
    if args.resume:  # the steps already committed were logged by the command that ran them
        with RunStore.open(run_dir, readonly=True, untouched=True) as peek:
            after = peek.last_step()
    else:  # never follow (and log) a run this command is about to refuse
        RunStore.check_new(run_dir)
    targets = list(dict.fromkeys(args.log_to))
    for target in targets:  # refused before the run starts, not at its first step
        StepWriter.check_available(target)
    return [LiveLogger(run_dir, target, args.log_dir, after_step=after).start() for target in targets]


def _stop_all(loggers: list) -> None:
    """Stop every live logger (each logs what is left), then raise the first one's failure."""
    errors = []
    for logger in loggers:
        try:
            logger.stop()
        except Exception as e:  # noqa: BLE001 - the others still stop
            errors.append(e)
    if errors:
        raise RuntimeError(f"--log-to: {type(errors[0]).__name__}: {errors[0]}")


# -- rlkit warmstart ---------------------------------------------------------------------------------
WARMSTART_HELP = """\
The supervised phase before RL: train the seeded model (or --init-from an earlier phase's checkpoint) on a
synthetic task's training split, measure the mean reward on its held-out split every --eval-every steps
(--decode sample at --temperature, like the RL rollouts, or greedy), and stop as soon as it lies in
--target LOW HIGH, or at --max-steps / --max-minutes. The weights go to --out (a new or empty folder) as an
init checkpoint: the Hugging Face layout plus init_checkpoint.json (weights checksum, SHA-256, the
evaluation history, why it stopped). `rlkit run --init-from DIR` starts RL from it. --preset-run 0.6b
takes the learning runs' settings (qwen3-0.6b, bf16, cuda, add9c); flags given on top override them.
The warm start trains on each problem's demonstration: the bare sum for arith / add2 / add3, the whole
working for add8w and add9c. It trains under torch's deterministic algorithms, so a rerun with the same
settings and steps gives the same weights bit for bit."""


def _add_warmstart(sub) -> None:
    from rlkit.data.tasks import TASKS
    from rlkit.heldout import DECODES
    from rlkit.model.config import MODEL_PRESETS

    p = sub.add_parser("warmstart", help="supervised phase until a held-out reward band; saves an init checkpoint",
                       description=WARMSTART_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="a new or empty folder for the init checkpoint")
    p.add_argument("--preset-run", choices=["0.6b"], help="the learning runs' settings (rlkit.warmstart.warmstart_0_6b)")
    p.add_argument("--preset", choices=sorted(MODEL_PRESETS), help="model preset (default tiny)")
    p.add_argument("--task", choices=[n for n, t in TASKS.items() if t.generate], help="default add2")
    p.add_argument("--dtype", choices=["bf16", "fp32"])
    p.add_argument("--device", help="cpu | cuda | cuda:N (must exist here)")
    p.add_argument("--seed", type=bounded_nonneg_int)
    p.add_argument("--batch-size", type=bounded_positive_int)
    p.add_argument("--lr", type=positive_float)
    p.add_argument("--warmup", type=bounded_nonneg_int, help="steps of linear learning-rate warmup")
    p.add_argument("--backend", choices=["rlkit", "transformers"],
                   help="which forward trains (default rlkit; transformers: padded batches, bf16 autocast on CUDA)")
    p.add_argument("--tf32", choices=["on", "off"], help="TF32 GEMMs in the training step (default: on for CUDA)")
    p.add_argument("--max-steps", type=bounded_positive_int)
    p.add_argument("--max-minutes", type=positive_float)
    p.add_argument("--eval-every", type=bounded_positive_int)
    p.add_argument("--eval-prompts", type=bounded_positive_int)
    p.add_argument("--decode", choices=list(DECODES))
    p.add_argument("--temperature", type=positive_float)
    p.add_argument("--target", nargs=2, type=finite_float, metavar=("LOW", "HIGH"),
                   help="held-out reward band that ends the phase (default 0.2 0.6)")
    p.add_argument("--init-from", metavar="DIR", help="continue from an init checkpoint (the optimizer starts fresh)")
    p.add_argument("--threads", type=bounded_nonneg_int)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true", help="print the checkpoint's manifest as JSON on stdout")
    p.set_defaults(func=_cmd_warmstart)


# flag -> WarmStartConfig field
WARMSTART_FIELDS = (("preset", "model"), ("task", "task"), ("dtype", "dtype"), ("device", "device"), ("seed", "seed"),
                    ("batch_size", "batch_size"), ("lr", "lr"), ("backend", "backend"), ("warmup", "warmup_steps"),
                    ("max_steps", "max_steps"), ("max_minutes", "max_minutes"), ("eval_every", "eval_every"),
                    ("eval_prompts", "eval_prompts"), ("decode", "decode"), ("temperature", "temperature"),
                    ("init_from", "init_from"), ("threads", "threads"))


def warmstart_config_from_args(args):
    from rlkit.model.config import DTYPE_ALIASES
    from rlkit.warmstart import WarmStartConfig, warmstart_0_6b

    values = {field: getattr(args, flag) for flag, field in WARMSTART_FIELDS if getattr(args, flag) is not None}
    if "dtype" in values:
        values["dtype"] = DTYPE_ALIASES[values["dtype"]]
    if args.tf32 is not None:
        values["tf32"] = args.tf32 == "on"
    if args.target is not None:
        values["target_low"], values["target_high"] = args.target
    return warmstart_0_6b(**values) if args.preset_run == "0.6b" else WarmStartConfig(**values)


def _cmd_warmstart(args) -> int:
    from rlkit.warmstart import supervised_phase

    try:
        cfg = warmstart_config_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def show(row: dict) -> None:
        print(f"warmstart: step {row['step']}: held-out reward {row['reward']:.3f} over {row['n']} prompts "
              f"({row['elapsed_s']:.0f} s)", file=sys.stderr)

    from rlkit.train.warm_start import WarmStartStopped

    try:
        with _stdout_to_stderr() if args.json else contextlib.nullcontext():
            manifest = supervised_phase(cfg, args.out, progress=not args.no_progress, stop=stop, log=show)
    except WarmStartStopped as e:
        print(f"rlkit warmstart: {e}; no checkpoint was written", file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    made = manifest["made_by"]
    print(f"warmstart: wrote {args.out} after {made['steps']} steps ({made['stopped_because']}): held-out reward "
          f"{made['heldout']['reward']:.3f} ({'in' if made['in_band'] else 'NOT in'} the band "
          f"{cfg.target_low}-{cfg.target_high}), weights checksum {manifest['weights_checksum']}", file=sys.stderr)
    if args.json:
        print(json.dumps(manifest))
    return 0


# -- rlkit import / export -----------------------------------------------------------------------------
def _add_import(sub) -> None:
    from rlkit.interop.frameworks import FORMATS

    p = sub.add_parser("import", help="open another framework's rollout/trainer dump as an rlkit run",
                       description="Read a dump (FORMAT: rlkit = the exchange schema, a .parquet or .jsonl "
                                   "file; slime = a --dump-details folder; verl = a trainer.rollout_data_dir "
                                   "folder of <step>.jsonl) and write it as a new run in --run-dir, with "
                                   "rlkit's divergence metrics and the framework's own. All or nothing: bad "
                                   "input is one line naming the record, and no run directory is left. "
                                   "docs/IMPORT.md describes the schema and each layout.")
    p.add_argument("format", choices=FORMATS)
    p.add_argument("src", help="the dump: a file (rlkit) or a folder (slime, verl)")
    p.add_argument("--run-dir", required=True, help="a new (empty) directory for the run store")
    p.add_argument("--logprob-semantics", choices=["raw", "processed"], default="raw",
                   help="what the dump's logprobs are (slime and verl do not record it; default raw)")
    p.set_defaults(func=_cmd_import)


def _cmd_import(args) -> int:
    from rlkit.interop.importer import import_run

    with import_run(args.format, args.src, args.run_dir, args.logprob_semantics) as store:
        source = store.info("import")
        steps = store.steps()
    compared = sum(s.compared_tokens for s in steps)
    mismatched = sum(s.mismatch_count for s in steps)
    print(f"imported {source['records']} records of {len(steps)} steps from {args.format} into {store.run_dir}: "
          f"{mismatched} of {compared} compared tokens differ; not recorded: "
          f"{', '.join(source['not_recorded']) or 'nothing'}", file=sys.stderr)
    return 0


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="a run's records in the exchange schema, or its metrics to TensorBoard/W&B",
                       description="--to rlkit writes every record (both sides' logprobs) as the exchange "
                                   "schema to --out (.parquet or .jsonl). --to tensorboard|wandb writes the "
                                   "per-step metrics (W&B in offline mode) to --out (default: RUN/tensorboard, "
                                   "or RUN/wandb/).")
    p.add_argument("run_dir")
    p.add_argument("--to", required=True, choices=["rlkit", "tensorboard", "wandb"])
    p.add_argument("--out", help="the file (--to rlkit) or folder to write")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args) -> int:
    if args.to == "rlkit":
        from rlkit.interop.importer import export_rows
        from rlkit.interop.schema import write_rows

        if not args.out:
            raise UsageError("--to rlkit needs --out FILE (.parquet or .jsonl)")
        rows = export_rows(args.run_dir)
        print(f"wrote {len(rows)} records to {write_rows(rows, args.out)}", file=sys.stderr)
        return 0
    from rlkit.interop.step_log import export_run

    with _stdout_to_stderr():  # the libraries' chatter
        where = export_run(args.run_dir, args.to, args.out)
    print(f"wrote the per-step metrics of {args.run_dir} to {where}", file=sys.stderr)
    return 0


# -- rlkit report ------------------------------------------------------------------------------------
REPORT_KEYS = ("step", "weight_version", "compared_tokens", "mismatch_count", "max_abs_diff", "reward_mean")


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="one row per step of a run: divergence and reward",
                       description="One row per step. The store's integrity is checked first (SQLite's "
                                   "integrity_check and every step row); a damaged store is an error. "
                                   "--check prints only the verdict: 'ok', or each problem (exit 1).")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true", help="check the store's integrity only")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args) -> int:
    from rlkit.timeline.store import RunStore, StoreError

    with RunStore.open(args.run_dir, readonly=True) as store:  # a reader: never takes the writer's lock
        problems = store.integrity_problems()
        if args.check:
            for line in problems or ["ok"]:
                print(f"{store.run_dir}: {line}" if problems else line)
            return 1 if problems else 0
        if problems:
            raise StoreError(f"{store.run_dir} is damaged: {problems[0]} ({len(problems)} problem(s); "
                             f"rlkit report --check lists them)")
        rows = [{k: getattr(s, k) for k in REPORT_KEYS} for s in store.steps()]
        source = store.info("import")
    own = (source or {}).get("metrics", {})
    for r in rows:  # an imported run: its framework's own metrics, to hold against that framework's logs
        if str(r["step"]) in own:
            r["framework_metrics"] = own[str(r["step"])]
    if args.json:
        print(json.dumps(rows))
        return 0
    if source is not None:  # say where the run came from and what its source did not record
        print(f"imported from {source['format']} ({source['layout']}); logprobs {source['logprob_semantics']}"
              f"{' (as given)' if source.get('semantics_given') else ''}; not recorded: "
              f"{', '.join(source['not_recorded']) or 'nothing'}")
    print(f"{'step':>5} {'version':>7} {'compared':>9} {'mismatch':>9} {'max_abs_diff':>13} {'reward':>7}")
    for r in rows:
        print(f"{r['step']:5d} {r['weight_version']:7d} {r['compared_tokens']:9d} {r['mismatch_count']:9d} "
              f"{r['max_abs_diff']:13.6g} {r['reward_mean']:7.3f}")
    if own:
        print(f"{source['format']}'s own metrics, from the same records (docs/IMPORT.md):")
        for r in rows:
            if "framework_metrics" in r:
                print(f"  step {r['step']}: " + ", ".join(f"{k}={v:.6g}" for k, v in r["framework_metrics"].items()))
    return 0


# -- rlkit bench -------------------------------------------------------------------------------------
def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (write long-format rows, render BENCHMARKS.md)")
    p.add_argument("what", choices=["kernels", "targets"],
                   help="kernels: time the kernels (a GPU) or --render rows; targets: judge rows against the "
                        "speed targets (exit 0 when all are met)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark (its --help lists them)")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args) -> int:
    if args.what == "targets":
        from rlkit.bench.targets import main as bench_targets

        return int(bench_targets(args.rest) or 0)
    from rlkit.bench.kernels import main as bench_kernels

    return int(bench_kernels(args.rest) or 0)


# -- the parser and main -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rlkit", description="bitwise train-rollout consistency lab")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_parity(sub)
    _add_run(sub)
    _add_warmstart(sub)
    _add_report(sub)
    _add_import(sub)
    _add_export(sub)
    _add_bench(sub)
    from rlkit.dashboards.commands import add_commands  # the lab's commands live with the dashboard

    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("rlkit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's contract: one clear line
        if args.debug:
            raise
        from rlkit.contract import ContractError
        from rlkit.timeline.store import StoreError

        known = (UsageError, ContractError, FileNotFoundError, ValueError, RuntimeError, StoreError)
        kind = "" if isinstance(exc, known) else f"{type(exc).__name__}: "
        message = " ".join(str(exc).split())
        print(f"rlkit {args.command}: error: {kind}{message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
