"""Import a dump into an ordinary rlkit run store, and export a run store in the exchange schema.

    from rlkit.interop import import_run, export_rows
    import_run("slime", "dumps/slime-run", "runs/slime-run")    # then: rlkit report / rlkit dashboard
    write_rows(export_rows("runs/a"), "a.parquet")

An import is all or nothing: the dump is read and checked in full first (ExchangeError names the first
bad record), the store is then built in a hidden temporary folder beside the run directory, and that
folder is renamed into place only when complete. A refused or interrupted import leaves no run directory.

The store holds what the source recorded and says what it did not: one StepSummary per step with rlkit's
divergence metrics (rlkit.divergence) over the records that have trainer logprobs (NaN where a step has
none), the records and recomputes, weight versions (stand-ins when the source recorded none: version N
names "the weights that rolled out step N"), and the run info "import" (`Timeline.source()`): format,
layout version read, logprob semantics, the list of things not recorded, and per step the framework's own
metrics under its own names (rlkit/interop/framework_metrics.py).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import torch

from rlkit.divergence import logprob_divergence
from rlkit.interop.framework_metrics import framework_metrics
from rlkit.interop.frameworks import FORMATS, LAYOUTS, Source, read_slime, read_verl
from rlkit.interop.schema import SEMANTICS, ExchangeError, ExchangeRow, read_rows
from rlkit.timeline.records import Recompute, RolloutRecord, StepSummary, WeightVersion
from rlkit.timeline.store import RunStore, StoreError

NOT_RECORDED = "not recorded"
"""The checksum and fingerprint text of what an import cannot know."""


def read_source(fmt: str, src: str | os.PathLike, semantics: str = "raw") -> Source:
    """Read and check a dump of format `fmt` (rlkit | slime | verl)."""
    src = Path(src)
    if fmt not in FORMATS:
        raise ExchangeError(f"unknown format {fmt!r}; formats: {' | '.join(FORMATS)}")
    if semantics not in SEMANTICS:
        raise ExchangeError(f"logprob semantics must be raw or processed, got {semantics!r}")
    if not src.exists():
        raise ExchangeError(f"{src}: no such file or directory")
    if fmt == "slime":
        return read_slime(src, semantics)
    if fmt == "verl":
        return read_verl(src, semantics)
    rows = read_rows(src)
    missing = [name for name, absent in (
        ("trainer logprobs", any(r.trainer_logprobs is None for r in rows)),
        ("weight versions", any(r.rollout_weight_version is None for r in rows)),
        ("sampling parameters", any(r.temperature is None for r in rows)),
        ("engine ids", any(r.engine_id is None for r in rows)),
        ("finish reasons", any(r.finish_reason is None for r in rows))) if absent]
    return Source("rlkit", str(src), rows, missing + ["loss", "clip fraction", "step times"])


def _versions(rows: list[ExchangeRow]) -> tuple[dict[str, tuple[int, int]], bool]:
    """Per sample id, (rollout version, trainer version); False when they are stand-ins (step numbers)."""
    recorded = all(r.rollout_weight_version is not None for r in rows)
    out = {}
    for r in rows:
        v = r.rollout_weight_version if recorded else r.step
        out[r.sample_id] = (v, r.trainer_weight_version if recorded and r.trainer_weight_version is not None else v)
    return out, recorded


def _summary(step: int, rows: list[ExchangeRow], version: int, fingerprint: str) -> StepSummary:
    pairs = [r for r in rows if r.trainer_logprobs is not None]
    div = logprob_divergence([torch.tensor(r.rollout_logprobs, dtype=torch.float32) for r in pairs],
                             [torch.tensor(r.trainer_logprobs, dtype=torch.float32) for r in pairs]).to_dict()
    if not div["compared_tokens"]:  # nothing compared: no number, not a perfect score
        div.update({k: math.nan for k in div if k not in ("compared_tokens", "mismatch_count")})
    rewards = torch.tensor([r.reward for r in rows if r.reward is not None and not math.isnan(r.reward)],
                           dtype=torch.float64)
    return StepSummary(step=step, weight_version=version, **div, loss=math.nan,
                       reward_mean=float(rewards.mean()) if rewards.numel() else math.nan,
                       reward_std=float(rewards.std(unbiased=False)) if rewards.numel() else math.nan,
                       clip_fraction=math.nan, ops_paths={}, contract_fingerprint=fingerprint, timings={},
                       first_divergence=None)


def _sampling(r: ExchangeRow) -> dict:
    return {"temperature": r.temperature, "top_k": r.top_k, "top_p": r.top_p, "max_tokens": r.max_tokens,
            "seed": r.seed}


def import_run(fmt: str, src: str | os.PathLike, run_dir: str | os.PathLike, semantics: str = "raw") -> RunStore:
    """Read the dump `src` of format `fmt` and write it as a new run in `run_dir` (missing or empty);
    returns the store opened read-only."""
    run_dir = Path(run_dir)
    RunStore.check_new(run_dir)
    source = read_source(fmt, src, semantics)
    rows = source.rows
    versions, recorded = _versions(rows)
    not_recorded = list(source.not_recorded)
    if not recorded and "weight versions" not in not_recorded:
        not_recorded.insert(0, "weight versions")
    not_recorded.append("kernel paths")  # which op ran which path: rlkit's own runs only
    steps = sorted({r.step for r in rows})
    info = {"format": fmt, "source": str(Path(src).resolve()), "layout": LAYOUTS[fmt],
            "logprob_semantics": rows[0].logprob_semantics, "semantics_given": fmt != "rlkit",
            "records": len(rows), "steps": len(steps), "not_recorded": not_recorded, "notes": source.notes,
            "weight_versions": "recorded" if recorded else "stand-ins: version N = the weights of step N",
            "metrics": {}, "imported_at": time.time()}
    config = {"steps": len(steps), "task": "import", "imported_from": fmt, "source": info["source"]}
    fallback = f"{NOT_RECORDED} ({fmt})"
    tmp = run_dir.parent / f".{run_dir.name}.importing-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        store = RunStore.create(tmp, config)
        try:
            used = sorted({v for pair in versions.values() for v in pair})
            store.commit_initial([WeightVersion(v, -1, NOT_RECORDED, fallback, 0.0) for v in used])
            for step in steps:
                these = [r for r in rows if r.step == step]
                records = [RolloutRecord(
                    r.sample_id, step, r.prompt_id, r.sample_index, r.engine_id or fmt, versions[r.sample_id][0],
                    r.contract_fingerprint or fallback, r.prompt_token_ids, r.response_token_ids,
                    r.rollout_logprobs, math.nan if r.reward is None else r.reward,
                    r.finish_reason or "unknown", _sampling(r)) for r in these]
                recomputes = [Recompute(r.sample_id, step, versions[r.sample_id][1], r.contract_fingerprint or fallback,
                                        r.trainer_logprobs) for r in these if r.trainer_logprobs is not None]
                prints = {rec.contract_fingerprint for rec in records}
                metrics = framework_metrics(fmt, these, source.loss_masks)
                if metrics:
                    info["metrics"][str(step)] = metrics
                store.commit_step(_summary(step, these, min(versions[r.sample_id][0] for r in these),
                                           prints.pop() if len(prints) == 1 else "mixed"), records, recomputes)
            store.set_info("import", info)
        finally:
            store.close()
        if run_dir.exists():
            run_dir.rmdir()  # empty (checked above): the complete run takes its place
        os.rename(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return RunStore.open(run_dir, readonly=True)


# -- export in the schema -------------------------------------------------------------------------------
def _semantics(source: dict | None, sampling: dict) -> str:
    if source is not None:
        return source["logprob_semantics"]
    # rlkit's loop compares processed logprobs unless the sampling leaves the distribution as it is
    identity = sampling.get("temperature") == 1.0 and sampling.get("top_k") == 0 and sampling.get("top_p") == 1.0
    return "raw" if identity else "processed"


def export_rows(run_dir: str | os.PathLike) -> list[ExchangeRow]:
    """Every record of a run (with its latest trainer recompute) as exchange-schema rows."""
    with RunStore.open(run_dir, readonly=True) as store:
        source = store.info("import")
        rows = []
        for summary in store.steps():
            latest = {c.record_id: c for c in store.recomputes(summary.step)}
            for r in store.records(summary.step):
                c = latest.get(r.record_id)
                s = r.sampling
                rows.append(ExchangeRow(
                    step=r.step, sample_id=r.record_id, prompt_id=r.prompt_id, sample_index=r.sample_index,
                    prompt_token_ids=r.prompt_ids, response_token_ids=r.token_ids,
                    rollout_logprobs=r.rollout_logprobs, trainer_logprobs=None if c is None else c.trainer_logprobs,
                    logprob_semantics=_semantics(source, s), run_id=Path(run_dir).name,
                    rollout_weight_version=r.weight_version, trainer_weight_version=None if c is None else c.weight_version,
                    reward=None if math.isnan(r.reward) else r.reward, finish_reason=r.finish_reason,
                    temperature=s.get("temperature"), top_k=s.get("top_k"), top_p=s.get("top_p"),
                    max_tokens=s.get("max_tokens"), seed=s.get("seed"), engine_id=r.engine_id,
                    contract_fingerprint=r.contract_fingerprint))
    if not rows:
        raise StoreError(f"{run_dir} has no records to export")
    return rows
