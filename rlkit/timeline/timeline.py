"""A read-only, notebook-friendly view of a run: pandas DataFrames over the run store.

    >>> from rlkit.timeline import Timeline
    >>> tl = Timeline("runs/strict-arith")
    >>> tl                                   # Timeline('runs/strict-arith': steps 0..49, 3200 records, ...)
    >>> tl.steps().plot(x="step", y=["mismatch_count", "reward_mean"])
    >>> tl.records(step=3).sort_values("mismatch_count")
    >>> tl.tokens(3, "s3/arith-17/0")        # per token: rollout vs trainer logprob, diff, mismatch

Every call reads the store afresh (one short read transaction), so a Timeline opened on a running run shows
each new complete step on the next call. It opens the store with SQLite's mode=ro and never writes.

Mismatch here is the rule of `rlkit.bitwise` and `rlkit.divergence`: two logprobs agree when they are equal
and have the same sign bit (so -0.0 vs 0.0 is a mismatch, and NaN vs NaN is not); computed with numpy so a
dashboard reading the store does not need torch.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pandas as pd

from rlkit.timeline.records import StepSummary, SyncEvent, ToggleEvent, WeightVersion
from rlkit.timeline.store import RunStore, StoreError

_RECORD_COLUMNS = ["record_id", "step", "prompt_id", "sample_index", "engine_id", "weight_version",
                   "recompute_version", "reward", "finish_reason", "n_tokens", "mismatch_count",
                   "max_abs_diff"]
_TOKEN_COLUMNS = ["position", "token_id", "rollout_lp", "trainer_lp", "diff", "mismatch"]


def mismatches(rollout: np.ndarray, trainer: np.ndarray) -> np.ndarray:
    """Boolean mask of positions whose fp32 values differ as rlkit.bitwise counts it."""
    same = (rollout == trainer) & (np.signbit(rollout) == np.signbit(trainer))
    same |= np.isnan(rollout) & np.isnan(trainer)
    return ~same


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    # An empty run still yields the columns, so `tl.steps()["mismatch_count"]` works before step 0 lands.
    return pd.DataFrame(rows, columns=columns) if rows else pd.DataFrame(columns=columns)


def _field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


class Timeline:
    """DataFrames of one run: steps, versions, syncs, records, tokens, toggles."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.store = RunStore.open(self.run_dir, readonly=True)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Timeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        (n_steps, first, last, n_records, n_versions, n_toggles, n_invalid), = self.store._rows(
            "SELECT (SELECT COUNT(*) FROM steps), (SELECT MIN(step) FROM steps), (SELECT MAX(step) FROM steps),"
            " (SELECT COUNT(*) FROM records), (SELECT COUNT(*) FROM versions), (SELECT COUNT(*) FROM toggles),"
            " (SELECT COUNT(*) FROM steps WHERE valid = 0)")
        steps = f"steps {first}..{last}" if n_steps else "no steps yet"
        invalid = f", {n_invalid} invalid" if n_invalid else ""
        return (f"Timeline({str(self.run_dir)!r}: {steps}{invalid}, {n_records} records, "
                f"{n_versions} weight versions, {n_toggles} toggles)")

    def config(self) -> dict:
        return self.store.config()

    def source(self) -> dict | None:
        """For a run imported from another framework's dump (`rlkit import`): its format, the layout
        version read, the logprob semantics, what the dump did not record (`not_recorded`) and, per step,
        the framework's own metrics (`metrics`); None for a run rlkit made."""
        return self.store.info("import")

    def framework_metrics(self) -> pd.DataFrame:
        """One row per step of an imported run: the framework's own metrics under their own names (empty
        for a run rlkit made, or a source without trainer logprobs)."""
        metrics = (self.source() or {}).get("metrics", {})
        rows = [dict(step=int(step), **values) for step, values in metrics.items()]
        columns = ["step"] + sorted({k for r in rows for k in r} - {"step"})
        return _frame(sorted(rows, key=lambda r: r["step"]), columns)

    def steps(self) -> pd.DataFrame:
        """One row per complete step: every StepSummary field; ops_paths as `path.<op>` columns and timings
        as `time.<phase>` columns."""
        rows = []
        for s in self.store.steps():
            d = s.to_dict()
            d.update({f"path.{op}": p for op, p in d.pop("ops_paths").items()})
            d.update({f"time.{k}": t for k, t in d.pop("timings").items()})
            rows.append(d)
        base = [c for c in _field_names(StepSummary) if c not in ("ops_paths", "timings")]
        extra = sorted({k for r in rows for k in r} - set(base))
        return _frame(rows, base + extra)

    def versions(self) -> pd.DataFrame:
        return _frame([v.to_dict() for v in self.store.versions()], _field_names(WeightVersion))

    def syncs(self) -> pd.DataFrame:
        """One row per sync, with `ok` (acknowledged checksum == sent) and `duration` in seconds."""
        rows = [dict(s.to_dict(), ok=s.ok, duration=s.duration) for s in self.store.syncs()]
        return _frame(rows, _field_names(SyncEvent) + ["ok", "duration"])

    def toggles(self) -> pd.DataFrame:
        return _frame([t.to_dict() for t in self.store.toggles()], _field_names(ToggleEvent))

    def pending_toggles(self) -> pd.DataFrame:
        rows = [r.to_dict() for r in self.store.pending_toggles()]
        return _frame(rows, ["request_id", "op", "path", "requested_at", "source"])

    def records(self, step: int | None = None) -> pd.DataFrame:
        """One row per rollout record (of `step`, or of the whole run): ids, step, versions, engine, reward,
        token count, and the mismatch count and max |diff| of its rollout logprobs vs its latest trainer
        recompute (<NA> / NaN when it has none)."""
        where, params = ("WHERE r.step = ?", (step,)) if step is not None else ("", ())
        rows = []
        for (rid, s, pid, idx, eng, ver, reward, finish, n, lps, rver, tlps) in self.store._rows(
                "SELECT r.record_id, r.step, r.prompt_id, r.sample_index, r.engine_id, r.weight_version, "
                "r.reward, r.finish_reason, r.n_tokens, r.rollout_logprobs, c.weight_version, "
                "c.trainer_logprobs FROM records r LEFT JOIN recomputes c ON c.seq = "
                "(SELECT MAX(seq) FROM recomputes WHERE record_id = r.record_id) "
                f"{where} ORDER BY r.step, r.rowid", params):
            mism, max_diff = pd.NA, float("nan")
            if tlps is not None:
                a, b = np.frombuffer(lps, "<f4"), np.frombuffer(tlps, "<f4")
                mism = int(mismatches(a, b).sum())
                with np.errstate(invalid="ignore"):
                    d = np.abs(b.astype(np.float64) - a.astype(np.float64))
                d = d[np.isfinite(d)]
                max_diff = float(d.max()) if d.size else (0.0 if mism == 0 else float("inf"))
            rows.append([rid, s, pid, idx, eng, ver, pd.NA if rver is None else rver,
                         float("nan") if reward is None else reward, finish, n, mism, max_diff])
        df = pd.DataFrame(rows, columns=_RECORD_COLUMNS)
        return df.astype({"step": "int64", "sample_index": "int64", "weight_version": "int64",
                          "recompute_version": "Int64", "reward": "float64", "n_tokens": "int64",
                          "mismatch_count": "Int64", "max_abs_diff": "float64"})

    def tokens(self, step: int, record_id: str) -> pd.DataFrame:
        """Per generated token of one record: position, token id, rollout and trainer logprob (fp32; NaN
        trainer_lp when there is no recompute), diff = trainer - rollout in fp64, and the bitwise mismatch."""
        rec = self.store.record(record_id)
        if rec.step != step:
            raise StoreError(f"record {record_id} belongs to step {rec.step}, not step {step}")
        rollout = rec.logprobs_array()
        recs = self.store.recomputes_of(record_id)
        trainer = recs[-1].logprobs_array() if recs else np.full_like(rollout, np.nan)
        with np.errstate(invalid="ignore"):
            diff = trainer.astype(np.float64) - rollout.astype(np.float64)
        mism = mismatches(rollout, trainer) if recs else np.zeros(rollout.shape, dtype=bool)
        return pd.DataFrame({"position": np.arange(rec.n_tokens), "token_id": np.asarray(rec.token_ids, np.int64),
                             "rollout_lp": rollout, "trainer_lp": trainer, "diff": diff, "mismatch": mism},
                            columns=_TOKEN_COLUMNS)
