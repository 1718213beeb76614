"""Bring your own run: other frameworks' dumps into rlkit's run store, and rlkit's metrics out.

- `schema`            the exchange schema (Parquet / JSONL), one row per sampled response (docs/IMPORT.md);
- `frameworks`        readers of slime's and verl's dumps, giving schema rows;
- `framework_metrics` the frameworks' own train-vs-rollout metrics under their own names;
- `importer`          rows -> a new run store (all or nothing), and a run store -> rows;
- `step_log`          per-step metrics to TensorBoard and to W&B (offline), and reading them back.

    rlkit import slime dumps/run --run-dir runs/slime-run
    rlkit export runs/a --to rlkit --out a.parquet
    rlkit export runs/a --to tensorboard
    rlkit run ... --log-to wandb
"""

from rlkit.interop.frameworks import FORMATS
from rlkit.interop.importer import export_rows, import_run, read_source
from rlkit.interop.schema import ExchangeError, ExchangeRow, read_rows, write_rows

__all__ = ["FORMATS", "ExchangeError", "ExchangeRow", "export_rows", "import_run", "read_rows", "read_source",
           "write_rows"]
