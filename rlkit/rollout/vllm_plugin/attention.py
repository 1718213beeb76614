"""`RLKIT_STRICT`: a vLLM attention backend whose math is `rlkit.ops.attention` over vLLM's paged KV cache.

Why a backend of our own: vLLM's attention kernels (CPU_ATTN here, FlashAttention / Triton on GPUs) choose
their own KV split schedule per batch shape, so a query's result depends on whether it ran in a prefill, a
chunked prefill or a decode step. rlkit's strict attention fixes one schedule (AttentionSpec: absolute-
position KV blocks, fixed splits, a pairwise LSE merge tree), so every mode gives the trainer's bits.

How it plugs in: the backend is registered under its own name (`register_backend("RLKIT_STRICT", ...)`,
nothing of vLLM's is overridden) and rlkit's vLLM model hands the class to its `Attention` layers when the
contract's attention path is strict. vLLM then allocates the KV cache, computes slot mappings and block
tables as for any backend; this file only
- writes each step's keys/values into the cache pages (`do_kv_cache_update`), and
- turns vLLM's per-step metadata into an `AttentionLayout.paged(query_lens, seq_lens, block_table)` and
  calls `rlkit.ops.attention` under the model's contract.

KV cache layout: vLLM hands each layer a 4D view [blocks, kv_heads, block_size, 2 * head_dim] whose
strides follow the engine-wide layout (LBHNC, LBNHC, ...). K lives in the first head_dim entries of the
last axis, V in the second. The backend accepts every layout (`supported_kv_cache_layouts() -> None`): it
only indexes the view, so the strides never reach the math. rlkit's attention reads keys as
[pages, page_size, kv_heads, head_dim], which is this view with axes 1 and 2 swapped (no copy).

Not supported (refused at construction): sliding windows, ALiBi, logit soft-capping, sinks, quantized KV
caches, encoder / cross attention. Qwen3 dense uses none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

from rlkit import ops
from rlkit.types import AttentionLayout


def split_kv(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per-layer view [blocks, kv_heads, block_size, 2 * head_dim] -> rlkit's paged keys and
    values, each [pages, page_size, kv_heads, head_dim] (views, not copies)."""
    paged = kv_cache.transpose(1, 2)
    return paged[..., :head_dim], paged[..., head_dim:]


@dataclass
class RlkitAttentionMetadata:
    num_actual_tokens: int
    num_reqs: int
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    seq_lens: torch.Tensor  # [num_reqs]: keys each request sees after this step (its own included)
    block_table: torch.Tensor  # [num_reqs, max_blocks]
    slot_mapping: torch.Tensor  # [num_actual_tokens]

    def layout(self) -> AttentionLayout:
        query_lens = self.query_start_loc[1:] - self.query_start_loc[:-1]
        return AttentionLayout.paged(query_lens, self.seq_lens, self.block_table)


class RlkitAttentionMetadataBuilder(AttentionMetadataBuilder[RlkitAttentionMetadata]):
    # The strict attention takes decodes and prefills in any order in one call: no batch reordering.
    reorder_batch_threshold: ClassVar[int | None] = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> RlkitAttentionMetadata:
        m = common_attn_metadata
        n = m.num_reqs
        return RlkitAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens, num_reqs=n,
            query_start_loc=m.query_start_loc[: n + 1], seq_lens=m.seq_lens[:n],
            block_table=m.block_table_tensor[:n], slot_mapping=m.slot_mapping)


class RlkitAttentionImpl(AttentionImpl[RlkitAttentionMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes=None, sliding_window=None, kv_cache_dtype: str = "auto",
                 logits_soft_cap=None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, **extra) -> None:
        unsupported = {
            "alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
            "logits_soft_cap": logits_soft_cap, "kv_sharing_target_layer_name": kv_sharing_target_layer_name,
            **{k: v for k, v in extra.items() if v is not None},
        }
        given = sorted(k for k, v in unsupported.items() if v)
        if given or attn_type != AttentionType.DECODER or kv_cache_dtype not in ("auto", "bfloat16",
                                                                                   "float16", "float32"):
            raise NotImplementedError(
                f"RLKIT_STRICT attention supports causal decoder attention with an unquantized KV cache; "
                f"got attn_type={attn_type}, kv_cache_dtype={kv_cache_dtype}, options {given}")
        if abs(scale - head_size ** -0.5) > 1e-12 * scale:
            # the contract fixes scores = (q.k) * head_dim**-0.5 (AttentionSpec.score_scale)
            raise NotImplementedError(f"RLKIT_STRICT attention uses head_dim**-0.5; got scale {scale}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """Store this step's keys/values [tokens, kv_heads, head_dim] at their slots
        (slot = block * block_size + offset; a negative slot marks a padding token and is skipped)."""
        n = slot_mapping.shape[0]
        slots = slot_mapping.to(torch.int64)
        keep = slots >= 0
        if not bool(keep.all()):
            slots, key, value = slots[keep], key[:n][keep], value[:n][keep]
        else:
            key, value = key[:n], value[:n]
        k_pages, v_pages = split_kv(kv_cache, self.head_size)
        block_size = k_pages.shape[1]
        blocks, offsets = slots // block_size, slots % block_size
        k_pages[blocks, offsets] = key.to(k_pages.dtype)
        v_pages[blocks, offsets] = value.to(v_pages.dtype)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: RlkitAttentionMetadata | None, output: torch.Tensor,
                output_scale=None, output_block_scale=None) -> torch.Tensor:
        """query [tokens, heads, head_dim] -> output [tokens, heads, head_dim] (written in place)."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("RLKIT_STRICT attention does not fuse output quantization")
        if attn_metadata is None:  # vLLM's warm-up / profiling pass without a KV cache
            return output
        n = attn_metadata.num_actual_tokens
        k_pages, v_pages = split_kv(kv_cache, self.head_size)
        # the contract in effect is the model's (RlkitQwen3ForCausalLM.forward wraps every step in it)
        out = ops.attention(query[:n], k_pages, v_pages, attn_metadata.layout())
        output[:n].copy_(out.view(n, *output.shape[1:]))
        return output


class RlkitAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "bfloat16", "float16", "float32"]

    @staticmethod
    def get_name() -> str:
        return "RLKIT_STRICT"

    @staticmethod
    def get_impl_cls() -> type[RlkitAttentionImpl]:
        return RlkitAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[RlkitAttentionMetadataBuilder]:
        return RlkitAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls):
        return None  # any: the backend only indexes the per-layer view

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER
