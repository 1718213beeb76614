"""Init checkpoints: the weights an RL run starts from instead of its seeded init (a warm start's result).

A folder written by `save_init_checkpoint`: the Hugging Face layout of rlkit/model/checkpoint.py
(config.json + model.safetensors + tokenizer files, so transformers and vLLM load it too) and
`init_checkpoint.json`, its manifest: the model preset, the dtype, the weights checksum
(`weights_checksum`, the one the timeline records for every weight version), the SHA-256 of
model.safetensors, and what made it (e.g. the warm start's steps and held-out reward).

`load_init_checkpoint` refuses, in one line (InitCheckpointError) and before touching the model where it
can: a missing folder or manifest, another model shape or dtype than the run's, a model.safetensors whose
bytes are not the ones the manifest recorded, or loaded weights whose checksum is not the recorded one
(or not the one a resuming run stored). RunConfig.init_checkpoint names such a folder; both arms of a
comparison started from one folder start from the same bits, and their stores say so.

    info = save_init_checkpoint(model, "ckpt/warm", model_name="qwen3-0.6b", made_by={"steps": 400})
    info = load_init_checkpoint(model, "ckpt/warm", model_name="qwen3-0.6b", dtype="bfloat16")
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rlkit.model.checkpoint import CheckpointError, load_state_dict_into, read_config, save_pretrained
from rlkit.model.checkpoint import weights_checksum
from rlkit.model.config import preset

MANIFEST = "init_checkpoint.json"
FORMAT = "rlkit-init-checkpoint-v1"
WEIGHTS_FILE = "model.safetensors"


class InitCheckpointError(ValueError):
    """A folder that cannot be a run's initial weights; the message says why, in one line."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def save_init_checkpoint(model, folder: str | Path, *, model_name: str, made_by: dict[str, Any]) -> dict:
    """Write `model` (its weights as they are, in its dtype) and the manifest into `folder` (new or
    empty); returns the manifest. The manifest is written last: a folder without one is not a checkpoint."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise InitCheckpointError(f"{folder} is not empty; an init checkpoint goes into a new or empty folder")
    save_pretrained(model, folder)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    manifest = {"format": FORMAT, "model": model_name, "dtype": dtype,
                "weights_checksum": weights_checksum(model.state_dict()),
                "safetensors_sha256": file_sha256(folder / WEIGHTS_FILE), "made_by": made_by}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(folder / MANIFEST)
    return manifest


def read_manifest(folder: str | Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise InitCheckpointError(f"init checkpoint {folder}: no such folder")
    path = folder / MANIFEST
    if not path.is_file():
        raise InitCheckpointError(f"init checkpoint {folder}: no {MANIFEST} (`rlkit warmstart --out` writes one)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InitCheckpointError(f"{path} is not valid JSON: {e.msg}") from None
    missing = [k for k in ("format", "model", "dtype", "weights_checksum", "safetensors_sha256")
               if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise InitCheckpointError(f"{path} lacks {', '.join(missing)}")
    if manifest["format"] != FORMAT:
        raise InitCheckpointError(f"{path}: format {manifest['format']!r}, this rlkit reads {FORMAT}")
    return manifest


def check_init_checkpoint(folder: str | Path, *, model_name: str, dtype: str) -> dict:
    """The manifest, once it says the folder holds `model_name`'s shape in `dtype` (cheap: reads no
    weights; the run's preflight calls it before it creates anything)."""
    manifest = read_manifest(folder)
    want = preset(model_name).with_dtype(dtype)
    try:
        got = read_config(folder)
    except CheckpointError as e:
        raise InitCheckpointError(f"init checkpoint {folder}: {e}") from None
    shape = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "tie_word_embeddings")
    differ = [f"{k} {getattr(got, k)} (run: {getattr(want, k)})" for k in shape if getattr(got, k) != getattr(want, k)]
    if differ or manifest["model"] != model_name:
        raise InitCheckpointError(f"init checkpoint {folder} holds a {manifest['model']} model, the run is "
                                  f"{model_name}{': ' + ', '.join(differ) if differ else ''}")
    if manifest["dtype"] != dtype:
        raise InitCheckpointError(f"init checkpoint {folder} holds {manifest['dtype']} weights, the run is "
                                  f"{dtype} (a converted copy would not be the same bits)")
    return manifest


def load_init_checkpoint(model, folder: str | Path, *, model_name: str, dtype: str,
                         expect_checksum: str | None = None) -> dict:
    """Load the folder's weights into `model` (in place) after every check; returns the manifest."""
    folder = Path(folder)
    manifest = check_init_checkpoint(folder, model_name=model_name, dtype=dtype)
    if expect_checksum is not None and manifest["weights_checksum"] != expect_checksum:
        raise InitCheckpointError(f"init checkpoint {folder} has weights checksum {manifest['weights_checksum']}, "
                                  f"this run started from {expect_checksum}: not the same weights")
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise InitCheckpointError(f"init checkpoint {folder}: no {WEIGHTS_FILE}")
    sha = file_sha256(weights)
    if sha != manifest["safetensors_sha256"]:
        raise InitCheckpointError(f"init checkpoint {folder}: {WEIGHTS_FILE} has SHA-256 {sha[:16]}..., the manifest "
                                  f"recorded {manifest['safetensors_sha256'][:16]}... (changed since it was written)")
    try:
        load_state_dict_into(model, folder)
    except CheckpointError as e:
        raise InitCheckpointError(f"init checkpoint {folder}: {e}") from None
    got = weights_checksum(model.state_dict())
    if got != manifest["weights_checksum"]:
        raise InitCheckpointError(f"init checkpoint {folder}: the loaded weights have checksum {got}, the manifest "
                                  f"recorded {manifest['weights_checksum']}")
    return manifest
