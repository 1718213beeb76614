"""Trainer-side logprob recompute: full-sequence forward over packed (varlen) sequences.

Batched differently from the rollout on purpose: sequences are sorted longest-first and packed greedily
up to `max_batch_tokens`, so a sequence's neighbours (and the number of rows in every GEMM) differ from
anything the rollout engine saw. Under the strict contract that cannot change a bit.
"""

from __future__ import annotations

from typing import Sequence

import torch

from rlkit.types import SamplingParams
from rlkit.model.qwen3 import ForwardBatch, Qwen3ForCausalLM


def pack_order(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices grouped into packs: longest first, greedy up to max_batch_tokens (a longer sequence goes
    alone)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    packs, current, used = [], [], 0
    for i in order:
        if current and used + lengths[i] > max_batch_tokens:
            packs.append(current)
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    if current:
        packs.append(current)
    return packs


def check_batch(sequences, prompt_lens, params) -> list:
    """Every sequence has a prompt and at least one response token; returns one params entry each."""
    if len(sequences) != len(prompt_lens):
        raise ValueError("sequences and prompt_lens differ in length")
    params = list(params) if params is not None else [None] * len(sequences)
    for i, (s, p) in enumerate(zip(sequences, prompt_lens)):
        if not 1 <= p < len(s):
            raise ValueError(f"sequence {i}: prompt_len {p} must be in [1, {len(s) - 1}] for {len(s)} tokens")
    return params


def response_logprobs(model: Qwen3ForCausalLM, sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int],
                      params: Sequence[SamplingParams | None] | None = None, max_batch_tokens: int = 4096,
                      grad: bool = False) -> list[torch.Tensor]:
    """Logprob of every response token (positions prompt_len..end) of each sequence, fp32 [len - prompt_len].

    `params[i]` selects processed semantics for sequence i (None: raw). With grad=True the result keeps
    the autograd graph (the policy-gradient loss uses it)."""
    params = check_batch(sequences, prompt_lens, params)
    out: list[torch.Tensor | None] = [None] * len(sequences)
    dev = model.device
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        for pack in pack_order([len(s) for s in sequences], max_batch_tokens):
            seqs = [torch.tensor(list(sequences[i]), dtype=torch.int64, device=dev) for i in pack]
            hidden = model(ForwardBatch.packed(seqs))
            # one logprob call per distinct sampling semantics in the pack (rows are independent, so how
            # they are grouped cannot change a bit; fewer calls keep the lm_head work in large blocks)
            groups: dict = {}
            offset = 0
            for j, i in enumerate(pack):
                n, p = len(seqs[j]), prompt_lens[i]
                groups.setdefault(params[i], []).append((i, offset + p - 1, offset + n - 1, seqs[j][p:]))
                offset += n
            for semantics, members in groups.items():
                rows = torch.cat([torch.arange(lo, hi, device=dev) for _, lo, hi, _ in members])
                lp = model.logprobs(hidden[rows], torch.cat([t for *_, t in members]), semantics)
                start = 0
                for i, lo, hi, _ in members:
                    out[i] = lp[start : start + hi - lo]
                    start += hi - lo
    return out  # type: ignore[return-value]
