"""rlkit inside vLLM: the out-of-tree Qwen3, the strict attention backend, the strict sampler and the
weight-sync worker extension. Everything here imports vLLM; `rlkit.rollout.vllm_engine` imports it lazily.

What gets registered (`register()`, idempotent, called by VllmEngine in the driver process and by the
worker extension module in every vLLM worker process):
- model architecture `RlkitQwen3ForCausalLM` in vLLM's ModelRegistry (selected per engine with
  `hf_overrides={"architectures": ["RlkitQwen3ForCausalLM"], "rlkit_contract": <contract JSON>}`);
- attention backend `RLKIT_STRICT` in vLLM's attention-backend registry (a new member, nothing of vLLM's
  is overridden); rlkit's model passes it to its attention layers when the contract's attention path is
  strict, and leaves the platform's own backend in place when it is native.

Users who build `vllm.LLM` themselves (not through VllmEngine) can get the same registration in every
vLLM process through the general-plugin entry point (see `pyproject.toml`):
    [project.entry-points."vllm.general_plugins"]
    rlkit = "rlkit.rollout.vllm_plugin:register"

On the CPU, `register()` also calls `torch.cpu._init_amx()` (measured on this project's CPU
machines: without it vLLM's AMX attention kernel raises SIGILL on CPUs with AMX); elsewhere that call is skipped.
"""

from __future__ import annotations

import torch

from rlkit.rollout.vllm_plugin.names import ATTENTION_BACKEND, CONTRACT_KEY, MODEL_ARCH, WORKER_EXTENSION

_registered = False


def init_amx() -> None:
    """Request AMX tile permission for this process (a no-op where AMX is absent or on other devices)."""
    init = getattr(torch.cpu, "_init_amx", None)
    if init is not None:
        init()


def register() -> None:
    """Register rlkit's model and attention backend with vLLM in this process (safe to call twice)."""
    global _registered
    if _registered:
        return
    init_amx()
    from vllm import ModelRegistry
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from rlkit.rollout.vllm_plugin.attention import RlkitAttentionBackend
    from rlkit.rollout.vllm_plugin.model import RlkitQwen3ForCausalLM

    if ATTENTION_BACKEND not in AttentionBackendEnum.__members__:
        register_backend(ATTENTION_BACKEND, f"{RlkitAttentionBackend.__module__}.RlkitAttentionBackend")
    if MODEL_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(MODEL_ARCH, RlkitQwen3ForCausalLM)
    _registered = True
