"""Which commit a benchmark row was measured at: $RLKIT_COMMIT (set it where the tree was copied without
its .git, as on the lent GPU), else `git rev-parse --short HEAD`, else "unknown"."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


def commit(cwd: str | Path | None = None) -> str:
    if os.environ.get("RLKIT_COMMIT"):
        return os.environ["RLKIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 - no git where the tree was copied
        return "unknown"


def short(sha: str) -> str:
    """A commit as tables show it: a full 40-hex sha cut to git's 7 ("d48f567d90...+table" -> "d48f567+table");
    short shas and "unknown" unchanged."""
    return re.sub(r"^([0-9a-f]{7})[0-9a-f]{33}", r"\1", sha)
