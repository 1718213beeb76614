"""`rlkit ...`: one thin command layer over the library.

    rlkit parity --preset tiny --path strict --json
    rlkit run --preset tiny --task arith --steps 50 --path strict --run-dir runs/a
    rlkit report runs/a [--json]
    rlkit dashboard runs/a runs/b
    rlkit lab
    rlkit bench kernels

Bad arguments and unusable inputs end with one clear line on stderr and exit code 2 (never a traceback);
`--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (and `--help` still prints the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


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


def _int_at_least(low: int):
    """An argparse type: an integer >= low, refused in one line otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _add_parity(sub) -> None:
    from rlkit.model.config import MODEL_PRESETS

    p = sub.add_parser("parity", help="run the parity chain and the trainer-vs-decode comparison")
    p.add_argument("--preset", default="tiny", choices=sorted(MODEL_PRESETS))
    p.add_argument("--path", default="strict", choices=["strict", "native"])
    p.add_argument("--ops", default="", help="per-op overrides, e.g. attention=native,linear=strict")
    p.add_argument("--rollout", default="embedded", choices=["embedded", "vllm"])
    p.add_argument("--prompts", type=_positive_int, default=16)
    p.add_argument("--max-tokens", type=_positive_int, default=128)
    p.add_argument("--temperature", type=_float, default=1.0)
    p.add_argument("--top-k", type=_nonneg_int, default=0)
    p.add_argument("--top-p", type=_float, default=1.0)
    p.add_argument("--seed", type=_nonneg_int, default=0)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--threads", type=_nonneg_int, default=1,
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlkit", description="bitwise train-rollout consistency lab")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_parity(sub)
    from rlkit import commands

    commands.add_run(sub)
    commands.add_report(sub)
    commands.add_bench(sub)
    try:  # the lab's commands (dashboard, lab) live with the dashboard
        from rlkit.dashboards.commands import add_commands
    except ImportError:
        add_commands = None
    if add_commands is not None:
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
        print(f"rlkit {args.command}: error: {kind}{exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
