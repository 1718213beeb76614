"""Qwen3 (dense) configuration and the named model presets.

Model presets are functions returning a complete config (`MODEL_PRESETS["tiny"]()`, or `preset("tiny")`): the four real Qwen3 dense sizes
read from the data folder's config summary, and `tiny`, the same architecture with small dims and
the real vocabulary (151,936) for the CPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", **{k: k for k in _DTYPES}}
"""Short names the CLI accepts -> the config's dtype names."""


def data_dir() -> Path:
    """The data folder (tokenizer, datasets, Qwen3 config summary): $RLKIT_DATA; unset, `shared/data` in
    the folder that holds the repository checkout (the development layout)."""
    env = os.environ.get("RLKIT_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "data"


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int = 151_936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40_960
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    dtype: str = "bfloat16"
    """Parameter dtype: bfloat16 | float32."""
    name: str = "qwen3"

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; expected one of {', '.join(_DTYPES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def with_dtype(self, dtype: str) -> "Qwen3Config":
        return dataclasses.replace(self, dtype=dtype)

    def num_parameters(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_attention_heads * 2 + self.num_key_value_heads * 2) + 2 * d
        layer = attn + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embed + self.num_hidden_layers * layer + h

    # -- HF config.json ------------------------------------------------------------------------
    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": None, "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "initializer_range": self.initializer_range,
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": self.num_hidden_layers,
            "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": self.dtype, "dtype": self.dtype,
            "use_cache": True,
        }

    @classmethod
    def from_hf(cls, hf: dict[str, Any], name: str = "qwen3") -> "Qwen3Config":
        if hf.get("model_type") not in (None, "qwen3"):
            raise ValueError(f"config.json has model_type={hf.get('model_type')!r}; rlkit loads dense qwen3")
        if hf.get("rope_scaling"):
            raise ValueError("rope_scaling is not supported by rlkit's Qwen3 (the dense chat models have none)")
        dtype = hf.get("torch_dtype") or hf.get("dtype") or "bfloat16"
        keys = {f.name for f in dataclasses.fields(cls)} - {"dtype", "name"}
        vals = {k: hf[k] for k in keys if k in hf}
        if "head_dim" not in hf:
            vals["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
        return cls(**vals, dtype=dtype if dtype in _DTYPES else "bfloat16", name=name)


def _from_summary(key: str, name: str) -> Callable[[], Qwen3Config]:
    def preset() -> Qwen3Config:
        path = data_dir() / "qwen3-configs" / "qwen3_dense_configs_summary.json"
        if not path.is_file():
            raise FileNotFoundError(f"preset {name!r} reads {path}; set RLKIT_DATA to the data folder")
        entry = json.loads(path.read_text())[key]
        return Qwen3Config.from_hf({**entry, "model_type": "qwen3"}, name=name)

    preset.__name__ = name.replace("-", "_").replace(".", "_")
    preset.__doc__ = f"{key}'s real dimensions (random weights unless a checkpoint is loaded)."
    return preset


def qwen3_tiny() -> Qwen3Config:
    """The Qwen3 architecture with small dims for the CPU: 2 layers, hidden 128, 4 query heads over 2 KV
    heads of 32, MLP 384, the real 151,936-entry vocabulary and tokenizer, tied embeddings."""
    return Qwen3Config(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                       tie_word_embeddings=True, dtype="bfloat16", name="tiny")


MODEL_PRESETS: dict[str, Callable[[], Qwen3Config]] = {
    "tiny": qwen3_tiny,
    "qwen3-0.6b": _from_summary("Qwen3-0.6B", "qwen3-0.6b"),
    "qwen3-1.7b": _from_summary("Qwen3-1.7B", "qwen3-1.7b"),
    "qwen3-4b": _from_summary("Qwen3-4B", "qwen3-4b"),
    "qwen3-8b": _from_summary("Qwen3-8B", "qwen3-8b"),
}


def preset(name: str) -> Qwen3Config:
    """The model preset `name` (a Qwen3Config); run presets are rlkit.config.RUN_PRESETS."""
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]()
