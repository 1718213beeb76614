"""Seeded per-request sampling from the processed distribution.

Each request owns a torch.Generator seeded from (seed, request id); each generated token draws one
uniform per vocabulary entry from it and picks argmax(z + Gumbel noise), z being the processed logits
(temperature, top-k, top-p; removed entries -inf). The draw depends only on the request's own generator
and logits, so a request samples the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import hashlib

import torch

from rlkit.kernels.logprob import SamplingParams, process_logits


def request_generator(seed: int, request_id: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def sample_token(logits_row: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """logits_row: fp32 [vocab] (any device; noise is drawn on the CPU so bits do not depend on it)."""
    z = process_logits(logits_row.unsqueeze(0), params)[0].cpu()
    u = torch.rand(z.shape[0], generator=generator, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))
    return int(torch.argmax(z.double() + gumbel))
