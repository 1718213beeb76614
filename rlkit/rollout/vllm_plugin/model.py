"""rlkit's Qwen3 as a vLLM model: the same module tree, parameters and forward as rlkit/model/qwen3.py.

`RlkitQwen3ForCausalLM` subclasses rlkit's `Qwen3ForCausalLM` and changes exactly one leaf: each layer's
`AttentionCore` (the op that reads keys from a cache) becomes `PagedAttention`, a vLLM `Attention` layer,
so that vLLM owns the paged KV cache, the block tables and the scheduling. Everything else (norms, GEMMs,
RoPE, SwiGLU, the lm_head) is rlkit's module code calling `rlkit.ops` under the engine's contract; there is
no second copy of the Qwen3 math. Parameter names are rlkit's, which are Hugging Face's, so a checkpoint
written by `rlkit.model.save_pretrained` loads as is.

The contract arrives with the model config: VllmEngine sets
`hf_overrides={"architectures": ["RlkitQwen3ForCausalLM"], "rlkit_contract": contract.to_json()}`, and the
worker extension can replace it between steps (`set_contract`) as long as the attention path is unchanged
(the attention backend of a vLLM layer is fixed when the layer is built: strict -> RLKIT_STRICT, native ->
the platform's own backend, e.g. CPU_ATTN or FLASH_ATTN).

Weights load through each parameter's `weight_loader` (vLLM's `default_weight_loader` when the parameter
has none), looked up by name at call time: that is what vLLM's in-place `reload_weights` needs (it swaps
parameters for meta copies and wraps their loaders while a reload runs).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

from rlkit import ops
from rlkit.contract import NumericsContract
from rlkit.model.config import Qwen3Config
from rlkit.model.qwen3 import ForwardBatch, Qwen3ForCausalLM
from rlkit.rollout.vllm_plugin.names import CONTRACT_KEY
from rlkit.rollout.vllm_plugin.attention import RlkitAttentionBackend

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}


def contract_from_hf(hf_config) -> NumericsContract:
    text = getattr(hf_config, CONTRACT_KEY, None)
    return NumericsContract.from_json(text) if text else NumericsContract.default()


def rlkit_config(vllm_config: VllmConfig) -> Qwen3Config:
    """rlkit's Qwen3Config from vLLM's model config (transformers >= 5 keeps rope_theta in rope_parameters)."""
    model_config = vllm_config.model_config
    hf = dict(model_config.hf_config.to_dict())
    rope = hf.pop("rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rlkit's Qwen3 has plain RoPE; the config asks for {rope}")
    if hf.get("rope_theta") is None:
        hf.pop("rope_theta", None)
        if rope.get("rope_theta") is not None:
            hf["rope_theta"] = rope["rope_theta"]
    dtype = _DTYPE_NAMES.get(model_config.dtype)
    if dtype is None:
        raise ValueError(f"rlkit's Qwen3 runs bfloat16, float16 or float32; vLLM asked for {model_config.dtype}")
    return Qwen3Config.from_hf(hf, name="vllm").with_dtype(dtype)


class PagedAttention(Attention):
    """The attention leaf op inside vLLM: same call as rlkit's AttentionCore, (q, k, v, layout) -> out
    [T, H, D], but the keys are written to and read from vLLM's paged cache by the layer's backend, and
    the layout comes from vLLM's forward context (the `layout` argument is None here)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout=None) -> torch.Tensor:  # type: ignore[override]
        t = q.shape[0]
        return super().forward(q, k, v).view(t, self.num_heads, self.head_size)


class RlkitQwen3ForCausalLM(Qwen3ForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        if vllm_config.parallel_config.tensor_parallel_size != 1 or \
                vllm_config.parallel_config.pipeline_parallel_size != 1:
            raise NotImplementedError("RlkitQwen3ForCausalLM runs with tensor/pipeline parallel size 1")
        cfg = rlkit_config(vllm_config)
        super().__init__(cfg)
        self.contract = contract_from_hf(vllm_config.model_config.hf_config)
        self.rlkit_param_names = tuple(name for name, _ in self.named_parameters())
        strict = self.contract.path("attention") == "strict"
        self.attention_path = "strict" if strict else "native"
        for i, layer in enumerate(self.model.layers):
            layer.self_attn.attn = PagedAttention(
                cfg.num_attention_heads, cfg.head_dim, cfg.head_dim ** -0.5,
                num_kv_heads=cfg.num_key_value_heads, cache_config=vllm_config.cache_config,
                prefix=f"{prefix}model.layers.{i}.self_attn.attn",
                attn_backend=RlkitAttentionBackend if strict else None)

    # -- contract ---------------------------------------------------------------------------------
    def set_contract(self, contract: NumericsContract) -> None:
        if contract.path("attention") != self.attention_path:
            raise ValueError(f"this engine's attention layers were built for the {self.attention_path} path; "
                             f"switching attention to {contract.path('attention')} needs a new engine")
        self.contract = contract

    # -- the vLLM model interface -----------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(input_ids, self.model.embed_tokens.weight)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors=None,  # type: ignore[override]
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise NotImplementedError("RlkitQwen3ForCausalLM takes token ids (no prompt embeds, no PP)")
        with ops.use_contract(self.contract):
            return super().forward(ForwardBatch(input_ids, positions.to(torch.int64), layout=None))  # [T, h]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """fp32 logits [rows, vocab] by the contract's lm_head GEMM (strict: rounded once to fp32)."""
        with ops.use_contract(self.contract):
            return self.logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())  # looked up now: a reload swaps them while it runs
        loaded: set[str] = set()
        for name, tensor in weights:
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # tied: the embedding is the head
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no parameter in rlkit's Qwen3 "
                                 f"({len(params)} parameters, e.g. {next(iter(params))!r})")
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded

    def rlkit_state(self) -> dict[str, torch.Tensor]:
        """rlkit's parameters only (the state_dict of a plain Qwen3ForCausalLM): what checksums cover."""
        params = dict(self.named_parameters())
        return {name: params[name] for name in self.rlkit_param_names}
