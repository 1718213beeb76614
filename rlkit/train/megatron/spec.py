"""Megatron-core's GPTModel for Qwen3, with every op's math routed through `rlkit.ops`.

What: a `ModuleSpec` for Megatron's `TransformerLayer` whose leaves are rlkit modules, plus
`build_gpt_model(cfg, ...)`, which builds `RlkitGPTModel` (Megatron's GPTModel with a strict embedding
lookup and a strict output layer). Megatron keeps what it is good at (parameter layout, tensor- and
pipeline-parallel sharding, process groups, the layer/block/model structure, bias-dropout-add); rlkit
decides every bit of the forward:

| Megatron slot                          | rlkit module here            | math                                   |
|----------------------------------------|------------------------------|----------------------------------------|
| input_layernorm / pre_mlp_layernorm    | StrictRMSNorm                | ops.rms_norm                           |
| final_layernorm, q_layernorm, k_layernorm | StrictRMSNorm             | ops.rms_norm (per head for q/k)        |
| linear_qkv, linear_fc1 (column-par.)   | StrictColumnParallelLinear   | ops.linear on the local output shard   |
| linear_proj, linear_fc2 (row-parallel) | StrictRowParallelLinear      | ops.linear(..., row_parallel, tp_*)    |
| core_attention                         | StrictCoreAttention          | ops.rope on q, k; ops.attention, prefill layout over the packed sequences (CP: the all-gathered K/V) |
| mlp activation                         | StrictSwiGLU                 | ops.swiglu(gate, up) on fc1's halves   |
| embedding.word_embeddings              | StrictVocabParallelEmbedding | a lookup; TP shards are selected, never summed |
| output_layer                           | StrictOutputLayer            | ops.logits on the local vocab shard (fp32) |

Why the bits equal rlkit's own Qwen3 (and hence the rollout engine):
- column-parallel layers compute each output column from the whole K with the contract's GEMM; the
  strict GEMM's per-column result does not depend on how many columns sit beside it (measured on this
  CPU for every shard width >= 16; tests/train/test_megatron.py checks the whole model), so Megatron's
  fused QKV ([q heads of group g; k_g; v_g] per KV group) and fused [gate; up] give the same columns
  as rlkit's separate q/k/v and gate/up projections;
- row-parallel layers are `ops.linear`'s row-parallel form: each rank computes its subtree of the
  canonical K tree in fp32 and the canonical all-reduce combines the top levels, so TP 1 == TP 2 == TP 4;
- RoPE is applied inside the core attention (GPTModel is built with position_embedding_type='none'),
  because Megatron's own rotary path computes its tables on the device in fp32; positions restart at 0
  for every packed sequence (Megatron's `thd` layout, PackedSeqParams.cu_seqlens_q);
- the residual adds are Megatron's bias-dropout-add with p = 0 and no bias: `residual + x` in the model
  dtype, the same single rounding as rlkit's RmsNormSpec.residual_add (IEEE addition is commutative);
- logits leave the output layer in fp32 (never rounded to bf16, LogprobSpec.logits_dtype); the trainer
  gathers the vocab shards and runs ops.logprob_from_logits on whole rows.

Backward: the linear layers use custom autograd functions whose forward is the strict op and whose
backward is plain fp32 matmuls (gradient bits are outside the logprob contract); attention's backward
is the op's own (rlkit.kernels.attention: strict forward, native SDPA backward). TP gradient reductions
use the canonical all-reduce so replicated parameters stay bit-identical on every rank.

Run: this module is imported by rlkit.train.megatron.trainer; `pytest -m megatron tests/train` tests it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dataclasses import dataclass

from megatron.core.models.gpt import GPTModel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add

from rlkit import ops
from rlkit.model.config import Qwen3Config
from rlkit.train.megatron.context_parallel import ContextSplit, gather_rows
from rlkit.types import AttentionLayout


@dataclass
class ContextParallelSeqParams(PackedSeqParams):
    """Megatron's packed (`thd`) parameters for one CP rank's tokens: cu_seqlens_q / kv are the local
    runs', `context` says which tokens of the pack they are (positions, the K/V gather), `cp_group` (a
    PackedSeqParams field) is the CP process group."""

    context: ContextSplit | None = None


# -- autograd: strict forward, plain fp32 backward ----------------------------------------------------
def _canonical_all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    """Sum over the TP group by `ops.reduce_sum` under the active contract (strict: the canonical tree,
    fp32 wire, rounded back to t's dtype; every rank gets the same bits, so TP-replicated parameters
    stay identical after an update)."""
    if group is None or dist.get_world_size(group) == 1:
        return t
    return ops.reduce_sum(t, group)


class _ColumnLinear(torch.autograd.Function):
    """y_local = x @ w_local.T (strict forward). Backward: dx = dy_local @ w_local summed over TP ranks
    (Megatron's column-parallel dgrad all-reduce), dw = dy_local.T @ x."""

    @staticmethod
    def forward(ctx, x, w, tp_group, out_fp32: bool):
        ctx.save_for_backward(x, w)
        ctx.tp_group = tp_group
        if out_fp32:
            lead = x.shape[:-1]
            return ops.logits(x.reshape(-1, x.shape[-1]), w).reshape(*lead, w.shape[0])
        return ops.linear(x, w)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]).float()
        dx = (dy2 @ w.float()).to(x.dtype).reshape(x.shape)
        dx = _canonical_all_reduce(dx, ctx.tp_group)
        dw = (dy2.t() @ x.reshape(-1, x.shape[-1]).float()).to(w.dtype)
        return dx, dw, None, None


class _RowLinear(torch.autograd.Function):
    """y = sum over TP ranks of x_local @ w_local.T, by ops.linear's row-parallel form (strict: fp32
    subtree partials + canonical all-reduce). Backward: dy is replicated, so dx_local = dy @ w_local and
    dw_local = dy.T @ x_local with no communication."""

    @staticmethod
    def forward(ctx, x, w, tp_group, tp_size: int):
        ctx.save_for_backward(x, w)
        if tp_size == 1:
            return ops.linear(x, w, row_parallel=True)
        return ops.linear(x, w, row_parallel=True, tp_group=tp_group, tp_size=tp_size)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]).float()
        dx = (dy2 @ w.float()).to(x.dtype).reshape(x.shape)
        dw = (dy2.t() @ x.reshape(-1, x.shape[-1]).float()).to(w.dtype)
        return dx, dw, None, None


class _SelectOwnedRows(torch.autograd.Function):
    """TP embedding: every rank looked up the ids it owns (zeros elsewhere); gather all ranks' rows and
    take each id's row from its owner. A selection, not a sum: the result is the stored bf16 row
    exactly, -0.0 included (a sum with the other ranks' +0.0 would turn -0.0 into +0.0)."""

    @staticmethod
    def forward(ctx, local, owner, rank, group):
        world = dist.get_world_size(group)
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local.contiguous(), group=group)
        stacked = torch.stack(parts)  # [tp, ..., h]
        ctx.save_for_backward(owner)
        ctx.rank = rank
        idx = owner.unsqueeze(0).unsqueeze(-1).expand(1, *local.shape)
        return stacked.gather(0, idx).squeeze(0)

    @staticmethod
    def backward(ctx, dy):
        (owner,) = ctx.saved_tensors
        mine = (owner == ctx.rank).unsqueeze(-1)
        return torch.where(mine, dy, torch.zeros_like(dy)), None, None, None


# -- leaf modules -------------------------------------------------------------------------------------
class StrictRMSNorm(torch.nn.Module):
    """Megatron norm slot (built with config, hidden_size, eps) running ops.rms_norm."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.config = config
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class StrictColumnParallelLinear(ColumnParallelLinear):
    """Megatron's ColumnParallelLinear (its parameters, sharding and forward plumbing) with the local
    GEMM replaced: the strict (or native, per contract) `ops.linear` on this rank's output shard."""

    def _forward_impl(self, input, weight, bias, *args, allreduce_dgrad=False, **kwargs):
        if bias is not None:
            raise NotImplementedError("Qwen3 linears have no bias (add_bias_linear=False)")
        return _ColumnLinear.apply(input, weight, self.tp_group if allreduce_dgrad else None, False)


class StrictRowParallelLinear(RowParallelLinear):
    """Megatron's RowParallelLinear whose GEMM and all-reduce are one `ops.linear(..., tp_group,
    tp_size)`: fp32 subtree partials per rank, combined by the canonical tree, rounded once."""

    def forward(self, input_):
        if not self.input_is_parallel or self.sequence_parallel or self.bias is not None:
            raise NotImplementedError("StrictRowParallelLinear: input_is_parallel, no SP, no bias")
        tp = self.tp_group.size()
        return _RowLinear.apply(input_, self.weight, self.tp_group, tp), None


class StrictCoreAttention(MegatronModule):
    """Megatron's core-attention slot: RoPE (ops.rope) on q and k, then ops.attention over the packed
    sequences with AttentionLayout.prefill. q/k arrive already normed (q_layernorm / k_layernorm), so the
    order is Qwen3's: norm, rope, attention.

    Packed (`thd`): q [T, heads, D], cu_seqlens from PackedSeqParams, positions restart at 0 per
    sequence. Unpacked (`sbhd`): q [S, B, heads, D] is treated as B whole sequences of S tokens, causal,
    so `attention_mask` is not read (no padding: pack sequences of different lengths instead)."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, cp_comm_type=None, softmax_scale=None, pg_collection=None,
                 rope_theta: float = 1_000_000.0):
        super().__init__(config=config)
        if attn_mask_type != AttnMaskType.causal:
            raise NotImplementedError("StrictCoreAttention is causal self-attention")
        if softmax_scale is not None and softmax_scale != config.kv_channels ** -0.5:
            raise NotImplementedError("the contract scales scores by head_dim ** -0.5")
        if config.context_parallel_size > 1 and cp_comm_type not in (None, "all_gather"):
            raise NotImplementedError(f"cp_comm_type={cp_comm_type!r}: the strict path gathers K/V "
                                      f"(all_gather); a ring would need the attention's split states")
        self.rope_theta = rope_theta

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if attention_bias is not None:
            raise NotImplementedError("no attention bias in Qwen3")
        packed = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        split = getattr(packed_seq_params, "context", None) if packed else None
        if split is not None and split.size > 1:
            return self._context_parallel(query, key, value, split, packed_seq_params.cp_group)
        if self.config.context_parallel_size > 1:
            raise NotImplementedError("CP > 1 needs packed input with ContextParallelSeqParams")
        if packed:
            cu = packed_seq_params.cu_seqlens_q.to(device=query.device, dtype=torch.int64)
            q, k, v = query, key, value                                   # [T, heads, D]
        else:
            s, b = query.shape[:2]
            cu = torch.arange(b + 1, device=query.device, dtype=torch.int64) * s
            q, k, v = (t.transpose(0, 1).reshape(b * s, *t.shape[2:]) for t in (query, key, value))
        lens = cu[1:] - cu[:-1]
        starts = torch.repeat_interleave(cu[:-1], lens)
        positions = torch.arange(q.shape[0], device=q.device, dtype=torch.int64) - starts
        q = ops.rope(q, positions, self.rope_theta)
        k = ops.rope(k, positions, self.rope_theta)
        out = ops.attention(q, k, v, AttentionLayout.prefill(cu))       # [T, heads, D]
        if packed:
            return out.reshape(out.shape[0], -1)
        return out.reshape(b, s, -1).transpose(0, 1)                      # [S, B, heads * D]

    def _context_parallel(self, q, k, v, split: ContextSplit, group):
        """This CP rank's queries (its runs of the pack, at their absolute positions) against the keys
        0..p of their sequences, gathered in pack order from every CP rank (K and V in one gather)."""
        positions = split.positions().to(q.device)
        q = ops.rope(q, positions, self.rope_theta)
        k = ops.rope(k, positions, self.rope_theta)
        kv = gather_rows(torch.cat([k, v], dim=-1), split, group, replicated_consumer=False)
        k_full, v_full = kv.split(k.shape[-1], dim=-1)                 # [pack tokens, kv heads, D] each
        keys, values, layout = split.attention_inputs(k_full, v_full)
        out = ops.attention(q, keys, values, layout)                   # [local tokens, heads, D]
        return out.reshape(out.shape[0], -1)


class StrictSwiGLU(torch.nn.Module):
    """The MLP activation slot (`MLPSubmodules.activation_func`): fc1's local output is this rank's
    [gate shard; up shard]; the result is ops.swiglu(gate, up)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.chunk(x, 2, dim=-1)
        return ops.swiglu(gate, up)


class StrictVocabParallelEmbedding(VocabParallelEmbedding):
    """Megatron's vocab-parallel embedding whose TP combine is a selection of the owner's row."""

    def forward(self, input_):
        world = self.tp_group.size()
        if world == 1:
            return F.embedding(input_, self.weight)
        outside = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
        local_ids = torch.where(outside, torch.zeros_like(input_), input_ - self.vocab_start_index)
        local = F.embedding(local_ids, self.weight)
        local = torch.where(outside.unsqueeze(-1), torch.zeros_like(local), local)
        owner = torch.div(input_, self.num_embeddings_per_partition, rounding_mode="floor")
        return _SelectOwnedRows.apply(local, owner, self.tp_group.rank(), self.tp_group)


class StrictOutputLayer(ColumnParallelLinear):
    """The lm_head: fp32 logits of this rank's vocab shard, by ops.logits (strict: the contract's GEMM
    rounded once to fp32). The trainer gathers the shards; rows are never rounded to bf16."""

    def _forward_impl(self, input, weight, bias, *args, allreduce_dgrad=False, **kwargs):
        return _ColumnLinear.apply(input, weight, self.tp_group if allreduce_dgrad else None, True)


# -- the spec and the model ---------------------------------------------------------------------------
def qwen3_layer_spec(cfg: Qwen3Config) -> ModuleSpec:
    """A Megatron TransformerLayer spec for one Qwen3 decoder layer with rlkit's strict leaves."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=StrictRMSNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=StrictColumnParallelLinear,
                    core_attention=ModuleSpec(module=StrictCoreAttention,
                                              params={"rope_theta": float(cfg.rope_theta)}),
                    linear_proj=StrictRowParallelLinear,
                    q_layernorm=StrictRMSNorm,
                    k_layernorm=StrictRMSNorm,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=StrictRMSNorm,
            mlp=ModuleSpec(
                module=MLP,
                submodules=MLPSubmodules(linear_fc1=StrictColumnParallelLinear,
                                         activation_func=StrictSwiGLU,
                                         linear_fc2=StrictRowParallelLinear),
            ),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def qwen3_block_spec(cfg: Qwen3Config, num_layers_here: int) -> TransformerBlockSubmodules:
    """The block spec: `num_layers_here` Qwen3 layers (this pipeline stage's) and the strict final norm
    (a bare layer spec would give Megatron's default norm class for final_layernorm)."""
    return TransformerBlockSubmodules(layer_specs=[qwen3_layer_spec(cfg)] * num_layers_here,
                                      layer_norm=StrictRMSNorm)


def transformer_config(cfg: Qwen3Config, tp: int = 1, pp: int = 1, cp: int = 1) -> TransformerConfig:
    """Megatron's TransformerConfig for a Qwen3 config. Dropout is 0, nothing is fused by Megatron
    (every op is rlkit's), and weights are allocated on the CPU uninitialized (they are loaded). CP is
    Megatron's all-gather scheme, run by StrictCoreAttention (context_parallel.py)."""
    return TransformerConfig(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_key_value_heads,
        kv_channels=cfg.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.rms_norm_eps,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        # Megatron hands the whole fc1 output to `MLPSubmodules.activation_func` only under this flag;
        # no Transformer Engine is involved: the module built there is StrictSwiGLU.
        use_te_activation_func=True,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        params_dtype=cfg.torch_dtype,
        pipeline_dtype=cfg.torch_dtype,
        bf16=cfg.torch_dtype == torch.bfloat16,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        cp_comm_type="all_gather" if cp > 1 else None,
        sequence_parallel=False,
        use_cpu_initialization=True,
        perform_initialization=False,
    )


class RlkitGPTModel(GPTModel):
    """GPTModel with the strict embedding lookup and the strict fp32 output layer swapped in after
    Megatron builds its own (GPTModel builds both directly, not from a spec). Parameters keep
    Megatron's names (`embedding.word_embeddings.weight`, `output_layer.weight`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        tp_group = self.pg_collection.tp
        if self.pre_process:
            old = self.embedding.word_embeddings
            new = StrictVocabParallelEmbedding(old.num_embeddings, old.embedding_dim,
                                               init_method=self.config.init_method,
                                               config=self.config, tp_group=tp_group)
            new.weight = old.weight  # the same Parameter object: tying and attributes are kept
            self.embedding.word_embeddings = new
        if self.post_process:
            old = self.output_layer
            new = StrictOutputLayer(self.config.hidden_size, self.vocab_size, config=self.config,
                                    init_method=self.config.init_method, bias=False,
                                    gather_output=False, skip_weight_param_allocation=old.weight is None,
                                    tp_group=tp_group)
            if old.weight is not None:
                new.weight = old.weight
            self.output_layer = new


def build_gpt_model(cfg: Qwen3Config, tp: int = 1, pp: int = 1, pre_process: bool = True,
                    post_process: bool = True, cp: int = 1) -> RlkitGPTModel:
    """This rank's Megatron GPTModel for `cfg` (model-parallel state must be initialized)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    config = transformer_config(cfg, tp, pp, cp)
    layers_here = get_num_layers_to_build(config)
    return RlkitGPTModel(
        config=config,
        transformer_layer_spec=qwen3_block_spec(cfg, layers_here),
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=cfg.tie_word_embeddings,
        position_embedding_type="none",
    )
