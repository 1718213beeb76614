"""rlkit's one Qwen3 (dense) model: config and presets, the nn.Module, HF folder I/O, the tokenizer."""

from rlkit.model.checkpoint import CheckpointError, load_pretrained, save_pretrained
from rlkit.model.config import MODEL_PRESETS, Qwen3Config, preset
from rlkit.model.qwen3 import ForwardBatch, Qwen3ForCausalLM, build_model

__all__ = ["Qwen3Config", "MODEL_PRESETS", "preset", "Qwen3ForCausalLM", "ForwardBatch", "build_model",
           "save_pretrained", "load_pretrained", "CheckpointError"]
