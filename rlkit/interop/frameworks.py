"""Readers for other frameworks' rollout/trainer dumps: each turns a dump into exchange-schema rows.

- `slime`: the debug dumps slime writes with `--dump-details DIR` (or `--save-debug-rollout-data` /
  `--save-debug-train-data`): `DIR/rollout_data/{rollout_id}.pt` = torch.save({"rollout_id", "samples":
  [Sample.to_dict()]}) with the rollout engine's logprobs, and `DIR/train_data/{rollout_id}.pt` (format 2:
  {"format_version": 2, "rollout_id", "samples": [per-sample train fields], ...}; the older
  {"rollout_id", "rank", "rollout_data": {field: [per sample]}} too) with the trainer's `log_probs`.
  Layout read from THUDM/slime at 624b824a (slime/observability/rollout_data_utils.py,
  train_data_utils.py, slime/utils/types.py).
- `verl`: the generations verl writes with `trainer.rollout_data_dir=DIR`: `DIR/{global_step}.jsonl`, one
  JSON object per sample with input, output, gts, score, step and every per-sample list of
  `reward_extra_infos_dict`. Layout read from verl-project/verl at 1dda039b (verl/trainer/ppo/ray_trainer.py
  `_dump_generations` / `_log_rollout_data`). verl's stock dump holds decoded text only; the per-token
  fields are added under verl's own batch key names (`responses`, `rollout_log_probs`, `old_log_probs`,
  optional `prompts`, `response_mask`), see docs/IMPORT.md.

Neither dump says whether its logprobs are raw or processed: the caller says (`semantics`), and the import
records that it was given, not read. What a dump does not record is listed in `Source.not_recorded`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlkit.interop.schema import ExchangeError, ExchangeRow, check_rows, row_from_dict

FORMATS = ("rlkit", "slime", "verl")
LAYOUTS = {
    "rlkit": "rlkit exchange schema v1 (docs/IMPORT.md)",
    "slime": "slime --dump-details rollout_data/ and train_data/ (THUDM/slime 624b824a)",
    "verl": "verl trainer.rollout_data_dir {step}.jsonl (verl-project/verl 1dda039b)",
}


@dataclass
class Source:
    """What a reader got from a dump: the rows and what the dump did and did not record."""

    format: str
    path: str
    rows: list[ExchangeRow]
    not_recorded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    loss_masks: dict[str, list[int]] = field(default_factory=dict)
    """Per sample id, the source's loss mask over response tokens (slime's metric averages over it)."""


def _fp32(values: Any) -> tuple[np.ndarray, int]:
    """Logprobs as fp32, and how many were not fp32 values (rounded): a framework may hand fp64 floats."""
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    wide = np.asarray(values, dtype=np.float64).reshape(-1)
    narrow = wide.astype(np.float32)
    lost = (narrow.astype(np.float64) != wide) & ~np.isnan(wide)
    return narrow, int(lost.sum())


def _ints(values: Any) -> list[int]:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values).reshape(-1).astype(np.int64).tolist()


def _load_pt(path: Path) -> Any:
    import torch

    try:  # weights_only: a dump is data; nothing in it may run code
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line
        raise ExchangeError(f"{path}: not a readable torch.save file of plain data "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def _numbered(folder: Path, suffix: str) -> list[tuple[int, Path]]:
    out = []
    for p in folder.glob(f"*{suffix}"):
        if p.stem.isdigit():
            out.append((int(p.stem), p))
    return sorted(out)


# -- slime ----------------------------------------------------------------------------------------------
_SLIME_FINISH = {"completed": "stop", "truncated": "length", "aborted": "error", "failed": "error"}


def _slime_train_samples(path: Path, rollout_id: int) -> list[dict]:
    payload = _load_pt(path)
    if not isinstance(payload, dict):
        raise ExchangeError(f"{path}: expected slime's train dump (a dict), got {type(payload).__name__}")
    if "samples" in payload:  # format_version 2
        samples = payload["samples"]
    elif isinstance(payload.get("rollout_data"), dict):  # the older dump: one list per field
        data = payload["rollout_data"]
        n = len(data.get("response_lengths", []))
        samples = [{k: v[i] for k, v in data.items() if isinstance(v, (list, tuple)) and len(v) == n}
                   for i in range(n)]
    else:
        raise ExchangeError(f"{path}: slime train dump without 'samples' or 'rollout_data'")
    if payload.get("rollout_id", rollout_id) != rollout_id:
        raise ExchangeError(f"{path}: holds rollout {payload.get('rollout_id')}, its name says {rollout_id}")
    return list(samples)


def _slime_weight_version(sample: dict) -> int | None:
    versions = sample.get("weight_versions") or []
    try:
        return int(versions[-1]) if versions else None
    except (TypeError, ValueError):
        return None


def read_slime(src: Path, semantics: str) -> Source:
    src = Path(src)
    rollout_dir = src / "rollout_data" if (src / "rollout_data").is_dir() else src
    train_dir = src / "train_data" if (src / "train_data").is_dir() else None
    files = _numbered(rollout_dir, ".pt")
    if not files:
        raise ExchangeError(f"{src}: no slime rollout dumps (rollout_data/<rollout_id>.pt)")
    rows, masks, rounded, no_train, versions_known, untrained = [], {}, 0, [], True, 0
    for rollout_id, path in files:
        payload = _load_pt(path)
        if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
            raise ExchangeError(f"{path}: expected slime's rollout dump {{'rollout_id', 'samples': [...]}}")
        if payload.get("rollout_id", rollout_id) != rollout_id:
            raise ExchangeError(f"{path}: holds rollout {payload.get('rollout_id')}, its name says {rollout_id}")
        samples = payload["samples"]
        train_path = train_dir / f"{rollout_id}.pt" if train_dir else None
        train = _slime_train_samples(train_path, rollout_id) if train_path and train_path.is_file() else None
        if train is None:
            no_train.append(rollout_id)
        # slime's train dump orders its samples like the rollout dump and says so with `rollout_position`
        # (format 2), else `sample_index` (= Sample.index); failing both, the order is the link
        link = "order"
        if train and all(t.get("rollout_position") is not None for t in train):
            link = "rollout_position"
        elif train and all(t.get("sample_index") is not None for t in train):
            link = "sample_index"
        if link == "order" and train is not None and len(train) != len(samples):
            raise ExchangeError(f"{train_path}: {len(train)} train samples for {len(samples)} rollout samples, "
                                f"and neither rollout_position nor sample_index to link them")
        by_key = {(j if link == "order" else int(t[link])): t for j, t in enumerate(train or [])}
        group_counts: dict[Any, int] = {}
        for i, s in enumerate(samples):
            if not isinstance(s, dict):
                raise ExchangeError(f"{path}: sample {i} is a {type(s).__name__}, not a Sample.to_dict()")
            sid = f"slime/{rollout_id}/{s.get('index', i) if s.get('index') is not None else i}"
            where = f"{path}: record {sid!r}"
            for key in ("tokens", "response_length", "rollout_log_probs"):
                if s.get(key) is None:
                    raise ExchangeError(f"{where}: missing field {key}")
            tokens, n = _ints(s["tokens"]), int(s["response_length"])
            if not 0 <= n <= len(tokens):
                raise ExchangeError(f"{where}: response_length {n} for {len(tokens)} tokens")
            rollout, lost = _fp32(s["rollout_log_probs"])
            rounded += lost
            if len(rollout) != n:
                raise ExchangeError(f"{where}: {len(rollout)} rollout_log_probs for response_length {n} "
                                    f"(ragged record)")
            trainer = None
            t = by_key.get(s.get("index") if link == "sample_index" else i)
            if t is not None:
                if t.get("log_probs") is None:
                    raise ExchangeError(f"{train_path}: record {sid!r}: missing field log_probs")
                if "tokens" in t and _ints(t["tokens"]) != tokens:
                    raise ExchangeError(f"{train_path}: record {sid!r}: its tokens differ from the rollout dump's")
                trainer, lost = _fp32(t["log_probs"])
                rounded += lost
                if len(trainer) != n:
                    raise ExchangeError(f"{train_path}: record {sid!r}: {len(trainer)} log_probs for "
                                        f"response_length {n} (ragged record)")
            elif train is not None:  # not trained on (slime's remove_sample, a filter): rollout side only
                untrained += 1
            group = s.get("group_index")
            group_counts[group] = group_counts.get(group, -1) + 1
            reward = s.get("reward")
            if isinstance(reward, dict):  # slime picks one key with --reward-key; a dump keeps them all
                numbers = [v for v in reward.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
                reward = numbers[0] if len(numbers) == 1 else None
            version = _slime_weight_version(s)
            versions_known &= version is not None
            if s.get("loss_mask") is not None:
                masks[sid] = _ints(s["loss_mask"])
            rows.append(row_from_dict({
                "step": rollout_id, "sample_id": sid,
                "prompt_id": f"slime/{rollout_id}/group{group if group is not None else i}",
                "sample_index": group_counts[group], "prompt_token_ids": tokens[:len(tokens) - n],
                "response_token_ids": tokens[len(tokens) - n:], "rollout_logprobs": rollout,
                "trainer_logprobs": trainer, "logprob_semantics": semantics,
                "rollout_weight_version": version,
                "reward": None if reward is None else float(reward),
                "finish_reason": _SLIME_FINISH.get(str(s.get("status")), s.get("status") and str(s.get("status"))),
            }, str(path), f"sample {i}"))
    not_recorded = ["sampling parameters", "engine ids", "logprob semantics (given on the command line)",
                    "loss", "clip fraction", "step times"]
    if not versions_known:
        not_recorded.insert(0, "weight versions")
    if no_train:
        not_recorded.insert(0, f"trainer logprobs of step(s) {', '.join(map(str, no_train))} (no train_data dump)")
    notes = [f"{rounded} logprob(s) were not fp32 values and were rounded to fp32"] if rounded else []
    if untrained:
        notes.append(f"{untrained} rollout sample(s) have no train sample (not trained on): rollout side only")
    return Source("slime", str(src), check_rows(rows, str(src)), not_recorded, notes, masks)


# -- verl -----------------------------------------------------------------------------------------------
VERL_TOKEN_FIELDS = ("responses", "rollout_log_probs")
"""Per-token fields a verl dump needs for an import (verl's batch key names); `old_log_probs` (the actor's
recompute), `prompts` and `response_mask` are optional."""


def read_verl(src: Path, semantics: str) -> Source:
    src = Path(src)
    files = [(int(src.stem) if src.stem.isdigit() else 0, src)] if src.is_file() else _numbered(src, ".jsonl")
    if not files:
        raise ExchangeError(f"{src}: no verl generation dumps (<step>.jsonl)")
    rows, rounded, seen_trainer = [], 0, set()
    for _, path in files:
        groups: dict[tuple[int, str], int] = {}
        with open(path, encoding="utf-8") as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
        for lineno, line in lines:
            try:
                d = json.loads(line)
            except ValueError as e:
                raise ExchangeError(f"{path}: line {lineno} is not JSON ({e})") from None
            step = d.get("step")
            sid = str(d.get("request_id") or f"verl/{step}/{lineno}")
            where = f"{path}: record {sid!r} (line {lineno})"
            if not all(k in d for k in VERL_TOKEN_FIELDS):
                if not any(k in d for k in VERL_TOKEN_FIELDS) and lineno == lines[0][0]:
                    raise ExchangeError(f"{path}: verl's stock dump holds text only (input, output, score); an "
                                        f"import needs the per-token fields {', '.join(VERL_TOKEN_FIELDS)} "
                                        f"(and old_log_probs) in each line, see docs/IMPORT.md")
                missing = [k for k in VERL_TOKEN_FIELDS if k not in d]
                raise ExchangeError(f"{where}: missing field(s) {', '.join(missing)}")
            if isinstance(step, bool) or not isinstance(step, int):
                raise ExchangeError(f"{where}: step must be an integer, got {step!r}")
            tokens, rollout = d["responses"], d["rollout_log_probs"]
            trainer = d.get("old_log_probs")
            mask = d.get("response_mask")
            if not isinstance(tokens, list) or not isinstance(rollout, list):
                raise ExchangeError(f"{where}: responses and rollout_log_probs must be lists")
            if len(rollout) != len(tokens) or (trainer is not None and len(trainer) != len(tokens)):
                raise ExchangeError(f"{where}: {len(tokens)} responses, {len(rollout)} rollout_log_probs, "
                                    f"{'no' if trainer is None else len(trainer)} old_log_probs (ragged record)")
            if mask is not None:  # verl pads responses to one length; the mask marks the real tokens
                if len(mask) != len(tokens):
                    raise ExchangeError(f"{where}: {len(mask)} response_mask values for {len(tokens)} responses")
                keep = [i for i, m in enumerate(mask) if m]
                tokens, rollout = [tokens[i] for i in keep], [rollout[i] for i in keep]
                trainer = None if trainer is None else [trainer[i] for i in keep]
            rollout32, lost = _fp32(rollout)
            rounded += lost
            trainer32 = None
            if trainer is not None:
                trainer32, lost = _fp32(trainer)
                rounded += lost
                seen_trainer.add(step)
            prompt_id = str(d.get("uid") or "p-" + hashlib.sha1(str(d.get("input", "")).encode()).hexdigest()[:12])
            index = groups[(step, prompt_id)] = groups.get((step, prompt_id), -1) + 1
            score = d.get("score")
            rows.append(row_from_dict({
                "step": step, "sample_id": sid, "prompt_id": prompt_id, "sample_index": index,
                "prompt_token_ids": d.get("prompts") or [], "response_token_ids": tokens,
                "rollout_logprobs": rollout32, "trainer_logprobs": trainer32, "logprob_semantics": semantics,
                "reward": float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None,
            }, str(path), f"line {lineno}"))
    steps = sorted({r.step for r in rows})
    not_recorded = ["weight versions", "sampling parameters", "engine ids", "finish reasons",
                    "logprob semantics (given on the command line)", "loss", "clip fraction", "step times"]
    if any(not r.prompt_token_ids for r in rows):
        not_recorded.insert(0, "prompt token ids (no 'prompts' field)")
    missing = [s for s in steps if s not in seen_trainer]
    if missing:
        not_recorded.insert(0, f"trainer logprobs of step(s) {', '.join(map(str, missing))} (no old_log_probs)")
    notes = [f"{rounded} logprob(s) were not fp32 values and were rounded to fp32"] if rounded else []
    return Source("verl", str(src), check_rows(rows, str(src)), not_recorded, notes)
