"""Rollout engines: the embedded engine (rlkit's Qwen3, paged KV cache, continuous batching) and the
vLLM adapter (rlkit.rollout.vllm_engine), both returning GenerationResult records."""

from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
from rlkit.rollout.types import GenerationRequest, GenerationResult
from rlkit.types import SamplingParams

__all__ = ["EmbeddedEngine", "EngineConfig", "GenerationRequest", "GenerationResult", "SamplingParams"]
