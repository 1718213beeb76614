"""Seeded per-request sampling from the processed distribution.

Each request owns a torch.Generator seeded from (seed, request id), on the engine's device; each
generated token draws one uniform per vocabulary entry from it and picks argmax(z + Gumbel noise), z
being the processed logits (temperature, top-k, top-p; removed entries -inf). A request's draw depends
only on its own generator and its own logits row, so it samples the same tokens whatever else is in the
batch. (CPU and CUDA generators produce different streams: a run is reproducible on its device type.)
"""

from __future__ import annotations

import hashlib

import torch

from rlkit import ops
from rlkit.types import SamplingParams


def request_generator(seed: int, request_id: str, device: torch.device | str = "cpu") -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator]) -> list[int]:
    """logits: fp32 [rows, vocab], one generator per row (on the logits' device). One sync for all rows.
    The processed logits come from `ops.process_logits` under the caller's contract."""
    z = ops.process_logits(logits, params)
    noise = torch.stack([torch.rand(z.shape[1], generator=g, device=z.device, dtype=torch.float64)
                         for g in generators])
    gumbel = -torch.log(-torch.log(noise.clamp_min(1e-300)))
    return torch.argmax(z.double() + gumbel, dim=-1).tolist()


def sample_token(logits_row: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One row (the vLLM sampler draws per request): the same draw as sample_tokens."""
    return sample_tokens(logits_row.reshape(1, -1), params, [generator])[0]
