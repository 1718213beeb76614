"""What every `rlkit` subcommand parser shares: the one-line error, argument types, and UsageError.

Low in the house (it imports nothing of rlkit), so the CLI (rlkit/cli.py) and the subcommands the
dashboards register (rlkit/dashboards/commands.py) both use it without importing each other.
"""

from __future__ import annotations

import argparse
import math


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (and `--help` still prints the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def int_at_least(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high], refused in one line otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"expected an integer <= {high}, got {value}")
        return value

    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)
MAX_INT = 2**31 - 1
"""Counts beyond this are refused by the parser (no run, step or token count comes near it)."""
bounded_positive_int = int_at_least(1, MAX_INT)
bounded_nonneg_int = int_at_least(0, MAX_INT)


def finite_float(text: str) -> float:
    """An argparse type: a finite number (inf and nan refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value
