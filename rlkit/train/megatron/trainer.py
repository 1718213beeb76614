"""MegatronTrainer: rlkit's trainer interface on Megatron-core's GPTModel, bitwise equal to the rollout.

What it offers (the same trainer-side calls the embedded trainer answers):
- `response_logprobs(sequences, prompt_lens, params=None)` -> list of fp32 [len - prompt_len] tensors,
  recomputed over packed (varlen) sequences; raw, or processed when params[i] is a SamplingParams;
- `state_dict_hf()` -> the gathered rlkit/HF-named weights (every TP shard, every PP stage), what the
  loop syncs into rollout engines (`EmbeddedEngine.load_weights`);
- `train_step(TrainBatch)` -> (trainer logprobs, stats dict): one GRPO/DAPO update (rlkit.train.grpo.policy_loss) with a plain
  torch AdamW over fp32 master copies of the Megatron parameters (Megatron's DistributedOptimizer needs
  its DDP grad buffers and CUDA; the update numerics are outside the logprob contract, what matters is
  that every replica of a parameter receives the same bits, see `_sync_grads`).

Parallelism: world = TP x CP x PP ranks (data parallelism is not wired: one model replica).
- TP: Megatron's sharding, rlkit's strict layers (spec.py); the logits' vocab shards are gathered to full
  fp32 rows before the strict log-softmax, so TP changes no bit (tested at TP 1 and TP 2).
- PP: stages built by Megatron (pre_process / post_process, layer offsets); activations move between
  stages with point-to-point send/recv, one pack at a time, forward for all packs then backward
  (GPipe order, no 1F1B interleaving). A tied embedding's last-stage copy gets its gradient summed
  with the first stage's by the canonical all-reduce.
- CP (context_parallel.py): each pack is split over the CP ranks (2 x CP chunks a sequence, rank r
  holding chunks r and 2CP-1-r), at global positions; attention all-gathers K/V (Megatron's
  cp_comm_type="all_gather" scheme, run by rlkit because Megatron's own CP is Transformer Engine's) and
  each rank runs ops.attention for its own chunks against keys 0..p, which under the contract gives the
  CP-1 bits for every query; response logprobs are gathered in token order, so every CP rank computes
  the same loss; every parameter's gradient is summed over the CP group by the canonical all-reduce.
  Ring (p2p) CP would exchange split states instead and would need a (max, sum, acc) split-state API
  from the attention kernels (through rlkit.ops).
- Sequence parallelism: left off (StrictRowParallelLinear refuses it). With a tree-ordered
  reduce-scatter (each rank's rows of the canonical all-reduce) it would change no bit; what it buys is
  memory, each TP rank keeping 1/TP of the norm and residual activations. Building it means: padding
  each pack to a multiple of TP tokens (a dummy sequence of pad tokens, which attention keeps to itself),
  the strict layers doing Megatron's SP communication themselves (all-gather of the column-parallel
  input, tree-ordered reduce-scatter of the row-parallel output, the same in reverse for the
  gradients) and summing every norm weight's gradient over TP. CP already shards those activations
  along the sequence, so it was not built with CP; it is the next layout piece, not a numerics one.

Distributed set-up: call `torch.distributed.init_process_group` first (gloo on CPU, NCCL on GPUs; the
strict collectives are all_gather based and run on either); with TP = CP = PP = 1 and no process group, the
trainer starts a one-process gloo group itself.

    trainer = MegatronTrainer(cfg, hf_state_dict, contract, MegatronTrainConfig(tp=2))
    lps = trainer.response_logprobs(seqs, prompt_lens)
    lps, stats = trainer.train_step(TrainBatch(seqs, prompt_lens, rollout_logprobs, advantages))
    engine.load_weights(trainer.state_dict_hf(), version=trainer.version)

Run the tests: `python -m pytest -q -m megatron tests/train/test_megatron.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams

from rlkit import ops
from rlkit.bitwise import differs
from rlkit.contract import NumericsContract
from rlkit.distributed import free_port
from rlkit.model.checkpoint import weights_checksum
from rlkit.model.config import Qwen3Config
from rlkit.train.grpo import policy_loss
import rlkit.train.megatron.convert as convert
from rlkit.train.megatron.cpu_shim import megatron_cpu_shim
from rlkit.train.megatron.context_parallel import ContextSplit, gather_rows, response_rows
from rlkit.train.megatron.spec import ContextParallelSeqParams, build_gpt_model
from rlkit.train.recompute import check_batch, pack_order
from rlkit.train.trainer import OptimConfig, TrainBatch  # noqa: F401 - TrainBatch re-exported
from rlkit.types import SamplingParams

# Replicated over TP, yet each rank's gradient covers only its own heads: summed over TP after backward.
_TP_PARTIAL_GRAD = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")


@dataclass(frozen=True)
class MegatronTrainConfig:
    tp: int = 1
    """Tensor-parallel size (divides num_key_value_heads, intermediate_size, vocab_size and the
    contract's gemm.k_chunks)."""
    pp: int = 1
    """Pipeline-parallel size (divides num_hidden_layers)."""
    cp: int = 1
    """Context-parallel size: each packed batch is split over this many ranks (any sequence lengths)."""
    optim: OptimConfig = OptimConfig(lr=1e-6)
    """The optimizer and loss settings, shared with the embedded trainer (no KL term here)."""

    def __post_init__(self) -> None:
        if self.optim.kl_coef:
            raise NotImplementedError("MegatronTrainer has no reference model: kl_coef must be 0")
        if min(self.tp, self.pp, self.cp) < 1:
            raise ValueError(f"TP {self.tp}, PP {self.pp}, CP {self.cp}: each must be >= 1")

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp

    @classmethod
    def from_optim(cls, optim: OptimConfig, tp: int = 1, pp: int = 1, cp: int = 1) -> "MegatronTrainConfig":
        """`--trainer megatron` runs with the run's optimizer settings."""
        return cls(tp=tp, pp=pp, cp=cp, optim=optim)


def initialize_parallel(tp: int, pp: int, cp: int = 1) -> None:
    """Megatron's model-parallel groups over the existing process group (world must be tp * cp * pp;
    Megatron's rank order tp-cp-dp-pp: TP ranks adjacent, then CP, then pipeline stages)."""
    if not dist.is_initialized():
        if tp * pp * cp != 1:
            raise RuntimeError(f"TP {tp} x CP {cp} x PP {pp} needs torch.distributed initialized by the launcher")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    world = dist.get_world_size()
    if world != tp * cp * pp:
        raise ValueError(f"world size {world} != TP {tp} x CP {cp} x PP {pp}: data parallelism is not wired")
    if parallel_state.model_parallel_is_initialized():
        have = (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_pipeline_model_parallel_world_size(),
                parallel_state.get_context_parallel_world_size())
        if have != (tp, pp, cp):
            raise ValueError(f"Megatron is already initialized with (TP, PP, CP) = {have}")
        return
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             context_parallel_size=cp)


class _GatherVocab(torch.autograd.Function):
    """[T, V/tp] fp32 shards -> [T, V] on every TP rank (rank order = vocab order); backward keeps
    this rank's columns of the gradient."""

    @staticmethod
    def forward(ctx, shard, group):
        world = dist.get_world_size(group)
        parts = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        ctx.rank, ctx.width = dist.get_rank(group), shard.shape[-1]
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, dy):
        lo = ctx.rank * ctx.width
        return dy[..., lo : lo + ctx.width].contiguous(), None


def _canonical_sum_(t: torch.Tensor, group) -> None:
    """In place: t = the sum of t over `group` by `ops.reduce_sum` under the active contract (strict:
    the canonical tree, identical bits on every member)."""
    t.copy_(ops.reduce_sum(t, group))


class MegatronTrainer:
    def __init__(self, cfg: Qwen3Config, hf_state: Mapping[str, torch.Tensor] | None = None,
                 contract: NumericsContract | None = None, config: MegatronTrainConfig | None = None,
                 device: str | torch.device = "cpu"):
        self.cfg = cfg
        self.contract = contract or NumericsContract.default()
        self.config = config or MegatronTrainConfig()
        self.device = torch.device(device)
        tp, pp, cp = self.config.tp, self.config.pp, self.config.cp
        convert.check_layout(cfg, tp, pp)
        initialize_parallel(tp, pp, cp)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.cp_group = parallel_state.get_context_parallel_group() if cp > 1 else None
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.cp_rank = parallel_state.get_context_parallel_rank()
        self.pre, self.post = self.pp_rank == 0, self.pp_rank == pp - 1
        self.layers_per_stage = cfg.num_hidden_layers // pp
        self.first_layer = self.pp_rank * self.layers_per_stage
        with megatron_cpu_shim():
            self.model = build_gpt_model(cfg, tp, pp, self.pre, self.post, cp).to(self.device)
        self.version = 0
        self._master: list[torch.Tensor] | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        if hf_state is not None:
            self.load_hf(hf_state)

    # -- weights --------------------------------------------------------------------------------------
    def _scope(self):
        """The contract for a forward/backward. No CPU shim here: rlkit's strict modules never reach
        Megatron's CUDA-only code; only model construction does (tied embeddings at PP > 1)."""
        return ops.use_contract(self.contract)

    def megatron_state(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under Megatron's names (local shard, local layer numbers)."""
        return {n: p.detach() for n, p in self.model.named_parameters()}

    @torch.no_grad()
    def load_hf(self, hf_state: Mapping[str, torch.Tensor]) -> None:
        """Copy rlkit/HF-named full weights into this rank's shard of this stage."""
        meg = convert.hf_to_megatron(hf_state, self.cfg)
        shard = convert.shard_tp(meg, self.cfg, self.config.tp, self.tp_rank)
        part = convert.stage_slice(shard, self.first_layer, self.layers_per_stage, self.pre, self.post,
                                   self.cfg.tie_word_embeddings)
        params = dict(self.model.named_parameters())
        if set(part) != set(params):
            raise ValueError(f"conversion gives {sorted(set(part) - set(params))[:3]} extra and "
                             f"{sorted(set(params) - set(part))[:3]} missing parameters")
        for name, p in params.items():
            if part[name].shape != p.shape:
                raise ValueError(f"{name}: {tuple(part[name].shape)} converted, {tuple(p.shape)} expected")
            p.copy_(part[name])
        if self._master is not None:
            for m, p in zip(self._master, params.values()):
                m.copy_(p)

    def state_dict_hf(self) -> dict[str, torch.Tensor]:
        """Every TP shard and PP stage gathered and converted to rlkit/HF names, on every rank (a
        snapshot: new tensors, not views of the parameters)."""
        local = self.megatron_state()
        if self.config.tp > 1:
            shards: list[dict[str, torch.Tensor]] = [{} for _ in range(self.config.tp)]
            for name, t in local.items():
                parts = [torch.empty_like(t) for _ in range(self.config.tp)]
                dist.all_gather(parts, t.contiguous(), group=self.tp_group)
                for r, part in enumerate(parts):
                    shards[r][name] = part
            local = convert.unshard_tp(shards, self.cfg)
        if self.config.pp > 1:
            stages: list = [None] * self.config.pp
            mine = ({k: v.cpu() for k, v in local.items()}, self.first_layer)
            dist.all_gather_object(stages, mine, group=self.pp_group)
            local = convert.merge_stages(stages)
            local = {k: v.to(self.device) for k, v in local.items()}
        # copies: conversion returns views into the live parameters, which the next step overwrites
        return {k: v.clone() for k, v in convert.megatron_to_hf(local, self.cfg).items()}

    def checksum(self) -> str:
        return weights_checksum(self.state_dict_hf())

    # -- forward --------------------------------------------------------------------------------------
    def _split(self, lens: list[int]) -> ContextSplit | None:
        """This CP rank's share of a pack (None at CP 1: the rank holds the whole pack)."""
        return ContextSplit(tuple(lens), self.config.cp, self.cp_rank) if self.config.cp > 1 else None

    def _forward_pack(self, seqs: list[torch.Tensor]):
        """One packed forward. Returns (full-vocab fp32 logits on the last stage else None, (stage output,
        received input) for the pipeline backward). The logits are [T, V] for the whole pack at CP 1, and
        the rows of this rank's tokens (ContextSplit.owned order) at CP > 1."""
        lens = [int(s.numel()) for s in seqs]
        split = self._split(lens)
        if split is None:
            ids = torch.cat(seqs)[None]                                                 # [1, T]
            pos = torch.cat([torch.arange(n, device=self.device) for n in lens])[None]  # [1, T]
            cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device=self.device)
            cu[1:] = torch.cumsum(torch.tensor(lens, device=self.device), 0)
            psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                  max_seqlen_q=max(lens), max_seqlen_kv=max(lens))
        else:  # this rank's runs of the pack, at their absolute positions
            ids = torch.cat(seqs)[split.owned().to(self.device)][None]                  # [1, T_local]
            pos = split.positions().to(self.device)[None]
            cu = split.local_cu_seqlens().to(device=self.device, dtype=torch.int32)
            runs = (cu[1:] - cu[:-1]).tolist()
            psp = ContextParallelSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                           max_seqlen_q=max(runs), max_seqlen_kv=max(runs),
                                           cp_group=self.cp_group, context=split)
        total = ids.shape[1]
        received = None
        if not self.pre:
            received = torch.empty(total, 1, self.cfg.hidden_size, dtype=self.cfg.torch_dtype,
                                   device=self.device)
            dist.recv(received, src=parallel_state.get_pipeline_model_parallel_prev_rank())
            received.requires_grad_(torch.is_grad_enabled())
            self.model.set_input_tensor(received)
        out = self.model(ids if self.pre else None, pos if self.pre else None, None,
                         packed_seq_params=psp)
        if not self.post:
            dist.send(out.detach().contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
            return None, (out, received)
        shard = out[0]                                                                  # [T, V/tp] fp32
        logits = shard if self.config.tp == 1 else _GatherVocab.apply(shard, self.tp_group)
        return logits, (out, received)

    def _logprobs(self, sequences, prompt_lens, params, keep: list | None):
        """Per-sequence response logprobs on the last stage (None elsewhere); `keep` collects each
        pack's pipeline tensors when a backward follows."""
        params = check_batch(sequences, prompt_lens, params)
        out: list[torch.Tensor | None] = [None] * len(sequences)
        for pack in pack_order([len(s) for s in sequences], self.config.optim.max_batch_tokens):
            seqs = [torch.as_tensor(list(sequences[i]), dtype=torch.int64, device=self.device) for i in pack]
            logits, tensors = self._forward_pack(seqs)
            if keep is not None:
                keep.append(tensors)
            if logits is None:
                continue
            split = self._split([len(s) for s in seqs])
            if split is not None:
                self._context_parallel_logprobs(logits, split, pack, seqs, prompt_lens, params, out)
                continue
            offset = 0
            for j, i in enumerate(pack):
                n, p = len(seqs[j]), prompt_lens[i]
                rows = logits[offset + p - 1 : offset + n - 1]                     # predict tokens p..n-1
                out[i] = ops.logprob_from_logits(rows, seqs[j][p:], params[i])
                offset += n
        return out

    def _context_parallel_logprobs(self, logits, split: ContextSplit, pack, seqs, prompt_lens, params, out):
        """Logprobs of the response tokens this CP rank's rows predict, gathered over the CP group in
        token order (every rank then holds, and computes the loss over, all of them)."""
        plens = [prompt_lens[i] for i in pack]
        groups, _, total = response_rows(split, plens)
        local = [ops.logprob_from_logits(logits[rows.to(self.device)],
                                         seqs[j][targets.to(self.device)], params[pack[j]])
                 for j, rows, targets in groups]
        local = torch.cat(local) if local else logits[:0, 0]  # no rows here: still part of the graph
        indices = [response_rows(split, plens, r)[1] for r in range(split.size)]
        flat = gather_rows(local, split, self.cp_group, replicated_consumer=True, indices=indices, total=total)
        for i, lp in zip(pack, torch.split(flat, [len(s) - p for s, p in zip(seqs, plens)])):
            out[i] = lp

    def _from_last_stage(self, flat: torch.Tensor | None, numel: int) -> torch.Tensor:
        if self.config.pp == 1:
            return flat
        buf = flat if self.post else torch.empty(numel, dtype=torch.float32, device=self.device)
        dist.broadcast(buf, src=parallel_state.get_pipeline_model_parallel_last_rank(), group=self.pp_group)
        return buf

    @torch.no_grad()
    def response_logprobs(self, sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int],
                          params: Sequence[SamplingParams | None] | None = None) -> list[torch.Tensor]:
        """Logprob of every response token of each sequence, fp32 [len - prompt_len], on every rank."""
        self.model.eval()
        with self._scope():
            out = self._logprobs(sequences, prompt_lens, params, keep=None)
        sizes = [len(s) - p for s, p in zip(sequences, prompt_lens)]
        flat = torch.cat(out) if self.post else None
        flat = self._from_last_stage(flat, sum(sizes))
        return list(torch.split(flat, sizes))

    # -- the update -----------------------------------------------------------------------------------
    def _ensure_optimizer(self) -> None:
        if self._optimizer is None:
            params = list(self.model.parameters())
            self._master = [p.detach().float().clone() for p in params]
            c = self.config.optim
            self._optimizer = torch.optim.AdamW(self._master, lr=c.lr, betas=c.betas, eps=c.adam_eps,
                                                weight_decay=c.weight_decay, foreach=False)

    def _sync_grads(self) -> None:
        named = dict(self.model.named_parameters())
        if self.config.cp > 1:  # each CP rank's gradient covers its own tokens: summed over CP first
            for p in named.values():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                _canonical_sum_(p.grad, self.cp_group)
        if self.config.tp > 1:
            for name, p in named.items():
                if name.endswith(_TP_PARTIAL_GRAD) and p.grad is not None:
                    _canonical_sum_(p.grad, self.tp_group)
        if self.config.pp > 1 and self.cfg.tie_word_embeddings and (self.pre or self.post):
            name = "embedding.word_embeddings.weight" if self.pre else "output_layer.weight"
            p = named[name]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            _canonical_sum_(p.grad, parallel_state.get_embedding_group())

    def _grad_norm(self) -> float:
        """Global L2 norm: sharded tensors counted on every TP rank, replicated ones on TP rank 0, the
        tied last-stage embedding copy not at all; summed over all model-parallel ranks by the
        canonical all-reduce (so every rank gets the same norm and the same clip factor)."""
        sq = torch.zeros(1, dtype=torch.float32, device=self.device)
        for name, p in self.model.named_parameters():
            if p.grad is None:
                continue
            if name == "output_layer.weight" and self.cfg.tie_word_embeddings:
                continue
            if convert._kind(name) == "replicated" and self.tp_rank != 0:
                continue
            sq += p.grad.float().pow(2).sum()
        if dist.get_world_size() > 1:
            sq = ops.reduce_sum(sq, parallel_state.get_model_parallel_group())
        return float(sq.sqrt())

    def set_contract(self, contract: NumericsContract) -> None:
        """Switch kernel paths (the runner calls it at step boundaries)."""
        self.contract = contract

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Alias of state_dict_hf(), the name rlkit.train.trainer.EmbeddedTrainer uses."""
        return self.state_dict_hf()

    def train_step(self, batch) -> tuple[list[torch.Tensor], dict]:
        """One GRPO/DAPO update, drop-in for EmbeddedTrainer.train_step: returns the trainer logprobs
        of this step's forward (detached, before the update; the numbers the loss saw) and the stats
        (loss, clip_fraction, ratio_mean, grad_norm, tokens, and mismatch_count / max_abs_diff of
        those logprobs against the rollout's, bitwise), identical on every rank."""
        self._ensure_optimizer()
        self.model.train()
        params = list(self.model.parameters())
        for p in params:
            p.grad = None
        n_seq = len(batch.sequences)
        sizes = [len(s) - p for s, p in zip(batch.sequences, batch.prompt_lens)]
        sampling = [batch.params] * n_seq if batch.params is not None else None
        keep: list = []
        stats_vec = torch.zeros(7, dtype=torch.float32, device=self.device)
        flat = None
        with self._scope(), torch.enable_grad():
            lps = self._logprobs(batch.sequences, batch.prompt_lens, sampling, keep)
            if self.post:
                new = torch.cat(lps)
                old = torch.cat([torch.as_tensor(o, dtype=torch.float32).reshape(-1)
                                 for o in batch.rollout_logprobs]).to(self.device)
                adv = batch.token_advantages(sizes).to(self.device)
                mask = batch.token_mask()
                mask = torch.ones_like(new, dtype=torch.bool) if mask is None else mask.to(self.device)
                if not (new.shape == old.shape == adv.shape == mask.shape):
                    raise ValueError(f"per-token sizes differ: logprobs {tuple(new.shape)}, rollout "
                                     f"{tuple(old.shape)}, advantages {tuple(adv.shape)}, mask {tuple(mask.shape)}")
                loss, stats = policy_loss(new, old, adv, mask, self.config.optim.clip_low, self.config.optim.clip_high)
                loss.backward()
                flat = new.detach()
                diff_mask = differs(flat.cpu(), old.cpu())
                delta = (flat.double().cpu() - old.double().cpu()).abs()
                stats_vec = torch.tensor([float(loss.detach()), stats["clip_fraction"], stats["ratio_mean"],
                                          float(mask.sum()), float(new.numel()), float(diff_mask.sum()),
                                          float(delta.max()) if delta.numel() else 0.0],
                                         dtype=torch.float32, device=self.device)
            self._pipeline_backward(keep)
        with self._scope():  # the gradient reductions follow the contract's all_reduce path too
            self._sync_grads()
            grad_norm = self._grad_norm()
        scale = 1.0
        if self.config.optim.grad_clip and grad_norm > self.config.optim.grad_clip:
            scale = self.config.optim.grad_clip / (grad_norm + 1e-6)
        with torch.no_grad():
            for m, p in zip(self._master, params):
                m.grad = None if p.grad is None else p.grad.float() * scale
            self._optimizer.step()
            for m, p in zip(self._master, params):
                p.copy_(m)  # one rounding to the parameter dtype
                p.grad = None
        self.model.eval()
        self.version += 1
        flat = self._from_last_stage(flat, sum(sizes))
        stats_vec = self._from_last_stage(stats_vec if self.post else None, 7)
        loss, clip_fraction, ratio_mean, tokens, total, mismatch, max_abs = stats_vec.tolist()
        stats = {"loss": loss, "clip_fraction": clip_fraction, "ratio_mean": ratio_mean,
                 "grad_norm": grad_norm, "tokens": int(tokens), "compared_tokens": int(total),
                 "mismatch_count": int(mismatch), "max_abs_diff": max_abs, "version": self.version}
        return list(torch.split(flat, sizes)), stats

    # -- checkpoints: each rank saves its own shard; a resumed run continues bit for bit -----------------
    def _rank_path(self, path) -> str:
        if self.config.world == 1:
            return str(path)
        cp = f".cp{self.cp_rank}" if self.config.cp > 1 else ""
        return f"{path}.tp{self.tp_rank}{cp}.pp{self.pp_rank}"

    def save(self, path) -> None:
        """Write this rank's parameters, fp32 masters and AdamW state to `path` (one rank) or
        `<path>.tp<r>[.cp<c>].pp<s>` (each rank its own file)."""
        self._ensure_optimizer()
        torch.save({"params": {k: v.cpu() for k, v in self.megatron_state().items()},
                    "masters": [m.detach().cpu() for m in self._master],
                    "optimizer": self._optimizer.state_dict(), "version": self.version},
                   self._rank_path(path))

    @torch.no_grad()
    def load(self, path) -> None:
        state = torch.load(self._rank_path(path), map_location=self.device, weights_only=False)
        self._ensure_optimizer()
        params = dict(self.model.named_parameters())
        if set(state["params"]) != set(params):
            raise ValueError(f"{self._rank_path(path)} holds another layout's parameters")
        for name, p in params.items():
            p.copy_(state["params"][name])
        for m, saved in zip(self._master, state["masters"]):
            m.copy_(saved)
        self._optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]

    def _pipeline_backward(self, keep: list) -> None:
        """PP > 1: the last stage already ran loss.backward(); pass each pack's input gradient to the
        previous stage, which backpropagates its own output with it (packs in forward order)."""
        if self.config.pp == 1:
            return
        for out, received in keep:
            if not self.post:
                grad = torch.empty_like(out)
                dist.recv(grad, src=parallel_state.get_pipeline_model_parallel_next_rank())
                torch.autograd.backward(out, grad)
            if not self.pre:
                g = received.grad if received.grad is not None else torch.zeros_like(received)
                dist.send(g.contiguous(), dst=parallel_state.get_pipeline_model_parallel_prev_rank())
