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


def gumbel_noise(rows: int, vocab: int, generators: list[torch.Generator], device) -> torch.Tensor:
    """float64 [rows, vocab]: row i is -log(-log(u)) of `vocab` uniforms drawn from generators[i] (u
    clamped to >= 1e-300), computed in place in one buffer: the values of
    -torch.log(-torch.log(torch.rand(vocab, generator=g, dtype=torch.float64).clamp_min(1e-300))), bit for
    bit (tests/rollout/test_sampling.py), without a temporary of the buffer's size per operation (rows x
    vocab x 8 bytes: 311 MB for a decode batch of 256 at Qwen3's vocabulary)."""
    noise = torch.empty(rows, vocab, dtype=torch.float64, device=device)
    for row, g in zip(noise, generators, strict=True):
        row.uniform_(generator=g)  # torch.rand is uniform_ on a new tensor: the same draw
    return noise.clamp_min_(1e-300).log_().neg_().log_().neg_()


def sample_token_ids(logits: torch.Tensor, params: SamplingParams,
                     generators: list[torch.Generator]) -> torch.Tensor:
    """logits: fp32 [rows, vocab], one generator per row (on the logits' device): the chosen ids, int64
    [rows] on that device (no sync). The processed logits come from `ops.process_logits` under the
    caller's contract; the choice is argmax(z + Gumbel noise) in float64 (the noise plus z added in place:
    the same sums as z + noise)."""
    z = ops.process_logits(logits, params)
    noise = gumbel_noise(z.shape[0], z.shape[1], generators, z.device)
    return torch.argmax(noise.add_(z), dim=-1)


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator]) -> list[int]:
    """`sample_token_ids` read to the host: one sync for all rows."""
    return sample_token_ids(logits, params, generators).tolist()


def sample_token(logits_row: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One row (the vLLM sampler draws per request): the same draw as sample_tokens."""
    return sample_tokens(logits_row.reshape(1, -1), params, [generator])[0]
