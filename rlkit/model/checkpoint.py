"""Hugging Face folders: config.json + safetensors with HF parameter names (+ tokenizer files).

`save_pretrained(model, folder)` writes a folder that transformers' Qwen3ForCausalLM and vLLM load;
`load_pretrained(folder)` reads such a folder, including a real sharded Qwen3 checkpoint
(model.safetensors.index.json), into rlkit's Qwen3.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlkit.model.config import Qwen3Config, data_dir
from rlkit.model.qwen3 import Qwen3ForCausalLM

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "generation_config.json")


class CheckpointError(ValueError):
    """A folder that is not a loadable Qwen3 checkpoint; the message says what is missing or wrong."""


def save_pretrained(model: Qwen3ForCausalLM, folder: str | Path, with_tokenizer: bool = True) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if with_tokenizer:
        src = data_dir() / "qwen3-tokenizer"
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, folder / name)
    return folder


def _tensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors file")
    return files


def read_config(folder: str | Path) -> Qwen3Config:
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder} has no config.json")
    try:
        hf = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {exc.msg}") from None
    return Qwen3Config.from_hf(hf, name=folder.name)


def load_state_dict_into(model: Qwen3ForCausalLM, folder: str | Path) -> None:
    """Copy a folder's tensors into `model` (names must match exactly; tied lm_head may be absent)."""
    expected = dict(model.state_dict())
    seen = set()
    for path in _tensor_files(Path(folder)):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name == "lm_head.weight" and model.config.tie_word_embeddings:
                    continue  # tied: the embedding is the head
                if name not in expected:
                    raise CheckpointError(f"{path.name}: unexpected tensor {name!r} for this Qwen3 config")
                t = f.get_tensor(name)
                if tuple(t.shape) != tuple(expected[name].shape):
                    raise CheckpointError(f"{name}: shape {tuple(t.shape)} in the checkpoint, "
                                          f"{tuple(expected[name].shape)} in the config")
                with torch.no_grad():
                    expected[name].copy_(t.to(expected[name].dtype))
                seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")


def load_pretrained(folder: str | Path, dtype: str | None = None,
                    device: str | torch.device = "cpu") -> Qwen3ForCausalLM:
    cfg = read_config(folder)
    if dtype:
        cfg = cfg.with_dtype(dtype)
    model = Qwen3ForCausalLM(cfg)
    load_state_dict_into(model, folder)
    return model.to(device)


def weights_checksum(named_tensors) -> str:
    """A checksum of weights that is cheap on any device and exact: each tensor's raw bits as integers,
    weighted by (index mod 65521) + 1 and summed in int64 (integer sums do not depend on order), then
    the per-tensor values and names hashed with SHA-256. Any changed bit changes it."""
    import hashlib

    h = hashlib.sha256()
    items = named_tensors.items() if hasattr(named_tensors, "items") else named_tensors
    for name, t in sorted(items, key=lambda kv: kv[0]):
        t = t.detach().contiguous()
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        ints = t.view(bits).reshape(-1).to(torch.int64)
        weights = torch.arange(ints.numel(), device=ints.device, dtype=torch.int64) % 65521 + 1
        value = int((ints * weights).sum())
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{value};".encode())
    return h.hexdigest()[:16]
