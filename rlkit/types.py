"""Value types that both sides share: the attention layout and the sampling parameters.

Low in the house: this module imports torch and nothing from rlkit, so the model, the rollout engines,
the trainers, `rlkit.ops` and the kernels all name the same two types.

- `AttentionLayout`: where each sequence's queries sit and where its keys live (packed prefill, chunked
  prefill against a paged cache, paged decode). `rlkit.ops.attention` reads it.
- `SamplingParams`: a request's sampling, the one spelling of it. Its distribution fields (temperature,
  top_k, top_p) define the "processed" logprob semantics (`rlkit.ops.process_logits`); the rest
  (max_tokens, stop_token_ids, seed) say how long a response may be and how its draws are seeded. A run
  config, a parity run, an engine request, a trainer recompute and a rollout record all carry this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QWEN3_STOP_IDS = (151645, 151643)
"""Qwen3's end-of-turn ids: <|im_end|>, <|endoftext|> (rlkit.model.tokenizer names them too)."""

DEFAULT_MAX_TOKENS = 64
"""A request's response length when nothing else says."""

SAMPLING_RECORD_KEYS = ("temperature", "top_k", "top_p", "max_tokens", "seed")
"""The sampling fields a rollout record stores (rlkit.timeline.records)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """One request's sampling. The distribution is logits / temperature (fp32), then top-k, then top-p,
    renormalized (kernels/logprob.py `process_logits`); a draw is seeded by `seed` and the request id,
    so it does not depend on the batch the request runs in."""

    temperature: float = 1.0
    """Logits are divided by this (> 0; greedy is top_k=1)."""
    top_k: int = 0
    """Keep logits >= the k-th largest; 0 disables top-k."""
    top_p: float = 1.0
    """Keep the shortest prefix (sorted descending, ties by token id) whose exclusive cumulative
    probability is below top_p; 1.0 disables top-p."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Most tokens a response may have."""
    stop_token_ids: tuple[int, ...] = QWEN3_STOP_IDS
    """A sampled token among these ends the response (it is kept)."""
    seed: int = 0
    """With the request id, seeds the request's own generator."""

    def __post_init__(self) -> None:
        if not (self.temperature > 0):
            raise ValueError(f"temperature={self.temperature!r}; expected > 0 (use top_k=1 for greedy)")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r}; expected an integer >= 0 (0 disables it)")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p!r}; expected 0 < top_p <= 1")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r}; expected an integer >= 1")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed={self.seed!r}; expected an integer")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def distribution(self) -> tuple[float, int, float]:
        """(temperature, top_k, top_p): what decides the processed distribution; requests with equal
        values are processed together."""
        return (self.temperature, self.top_k, self.top_p)

    @property
    def is_identity(self) -> bool:
        """True when processed logprobs equal raw ones (temperature 1, no top-k, no top-p)."""
        return self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0

    def record(self) -> dict:
        """The fields a rollout record stores (SAMPLING_RECORD_KEYS)."""
        return {key: getattr(self, key) for key in SAMPLING_RECORD_KEYS}


@dataclass(frozen=True, slots=True, weakref_slot=True)
class AttentionLayout:
    """Where each sequence's queries sit and where its keys live.

    Sequence i owns queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] at absolute positions
    query_start[i], query_start[i]+1, ...; it sees keys at positions 0..context_lens[i]-1, where
    context_lens[i] = query_start[i] + (its number of queries). Keys are either packed
    (k[cu_seqlens_k[i]:cu_seqlens_k[i+1]], position 0 first) or paged (block_table[i] lists the cache
    pages holding positions 0.., page_size positions each).
    """

    cu_seqlens_q: torch.Tensor
    """[seqs + 1] int64: sequence i's queries are q[cu_seqlens_q[i]:cu_seqlens_q[i+1]]."""
    query_start: torch.Tensor
    """[seqs] int64: the absolute position of each sequence's first query."""
    context_lens: torch.Tensor
    """[seqs] int64: keys each sequence sees (query_start + its number of queries)."""
    cu_seqlens_k: torch.Tensor | None = None
    """Packed keys: sequence i's keys are k[cu_seqlens_k[i]:cu_seqlens_k[i+1]], position 0 first."""
    block_table: torch.Tensor | None = None
    """Paged keys: [seqs, pages] cache page ids holding positions 0.., page_size positions each."""
    one_query_per_seq: bool = False
    """Set by `paged_decode`: every sequence has exactly one query, known without reading a tensor, so
    no call on this layout reads device values on the host (CUDA-graph capture needs that)."""

    @classmethod
    def prefill(cls, cu_seqlens: torch.Tensor) -> "AttentionLayout":
        """Packed causal prefill: every sequence's queries are its keys, starting at position 0."""
        cu = cu_seqlens.to(torch.int64)
        lens = cu[1:] - cu[:-1]
        return cls(cu_seqlens_q=cu, query_start=torch.zeros_like(lens), context_lens=lens, cu_seqlens_k=cu)

    @classmethod
    def paged(cls, query_lens: torch.Tensor, context_lens: torch.Tensor,
              block_table: torch.Tensor) -> "AttentionLayout":
        """Chunked prefill (query_lens > 1) or decode (query_lens == 1) against a paged KV cache that
        already holds these queries' own keys."""
        q_lens = query_lens.to(torch.int64)
        ctx = context_lens.to(torch.int64)
        cu = torch.zeros(q_lens.numel() + 1, dtype=torch.int64, device=q_lens.device)
        cu[1:] = torch.cumsum(q_lens, 0)
        return cls(cu_seqlens_q=cu, query_start=ctx - q_lens, context_lens=ctx, block_table=block_table)

    @classmethod
    def paged_decode(cls, context_lens: torch.Tensor, block_table: torch.Tensor) -> "AttentionLayout":
        """Decode: one query per sequence (its newest token, already in the cache) against a paged KV
        cache. Equal to `paged(ones, context_lens, block_table)`, but built and consumed without a host
        sync: the launch is sized by the block table's width, not by the context lengths' values."""
        ctx = context_lens.to(torch.int64)
        cu = torch.arange(ctx.numel() + 1, dtype=torch.int64, device=ctx.device)
        return cls(cu_seqlens_q=cu, query_start=ctx - 1, context_lens=ctx, block_table=block_table,
                   one_query_per_seq=True)

    @property
    def num_seqs(self) -> int:
        return int(self.query_start.numel())

    @property
    def paged_keys(self) -> bool:
        return self.block_table is not None
