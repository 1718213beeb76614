"""What the RL loop asks of a runner, and what every runner shares.

A runner owns one trainer and K rollout engines and moves weights between them. The loop never cares
where they live: in this process (LocalRunner) or in Ray actors (RayRunner). Requests are assigned to
engines by prompt group (every sample of a prompt goes to the same engine, groups round-robin), so the
assignment — and with it every engine's batches — is the same under both runners.
"""

from __future__ import annotations

import copy
import time
from typing import Protocol, Sequence

import torch

from rlkit.config import RunConfig
from rlkit.contract import NumericsContract
from rlkit.model import Qwen3ForCausalLM, build_model, preset
from rlkit.rollout.types import GenerationRequest, GenerationResult
from rlkit.timeline.records import SyncEvent
from rlkit.train.trainer import TrainBatch


class SyncError(RuntimeError):
    """An engine acknowledged another checksum than the one published: the step is not valid."""


class Runner(Protocol):
    engine_ids: list[str]

    def generate(self, requests: Sequence[GenerationRequest], step: int) -> list[GenerationResult]: ...

    def train_step(self, batch: TrainBatch) -> tuple[list[torch.Tensor], dict]: ...

    def publish(self, version: int) -> str: ...

    def sync(self, version: int, checksum: str) -> list[SyncEvent]: ...

    def take_resyncs(self) -> list[SyncEvent]: ...

    def set_contract(self, contract: NumericsContract) -> None: ...

    def locate(self, seqs, plens, ids) -> dict | None: ...

    def save(self, path) -> None: ...

    def load(self, path, version: int) -> list[SyncEvent]: ...

    def close(self) -> None: ...

    def placement(self) -> dict: ...


def engine_of(request_index: int, samples_per_prompt: int, engines: int) -> int:
    """Prompt groups round-robin over engines."""
    return (request_index // samples_per_prompt) % engines


def split_requests(requests: Sequence[GenerationRequest], cfg: RunConfig) -> list[list[GenerationRequest]]:
    parts: list[list[GenerationRequest]] = [[] for _ in range(cfg.engines)]
    for i, r in enumerate(requests):
        parts[engine_of(i, cfg.samples_per_prompt, cfg.engines)].append(r)
    return parts


def seeded_model(cfg: RunConfig) -> Qwen3ForCausalLM:
    """The seeded model a run starts from, before its warm start (rlkit/train/warm_start.py, which the loop
    runs when the config asks for one). The dtype is concrete here: the loop resolves "auto" once."""
    return build_model(preset(cfg.model).with_dtype(cfg.dtype), seed=cfg.seed, device=cfg.device)


def make_trainer(cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract):
    """The run's trainer: rlkit's embedded trainer, or Megatron-core's GPTModel with rlkit's spec at
    (cfg.trainer_tp, cfg.trainer_cp, cfg.trainer_pp); above one rank the caller is one of the ranks, with
    torch.distributed initialized (the RayRunner's trainer actors)."""
    if cfg.trainer == "megatron":
        from rlkit.train.megatron import MegatronTrainConfig, MegatronTrainer

        return MegatronTrainer(model.config, model.state_dict(), contract,
                               MegatronTrainConfig.from_optim(cfg.optim, cfg.trainer_tp, cfg.trainer_pp,
                                                              cfg.trainer_cp),
                               device=cfg.device)
    from rlkit.train.trainer import EmbeddedTrainer

    return EmbeddedTrainer(model, contract, cfg.optim)


def logprobs_to_host(logprobs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The trainer's per-sequence logprobs on the host, detached, read in one device-to-host copy: the
    loop compares and stores them there. A copy a sequence was a sync each (256 a step at the learning
    shape), and a Ray actor returning CUDA tensors had each one pickled storage by storage."""
    if not logprobs:
        return []
    flat = torch.cat([t.detach().reshape(-1) for t in logprobs]).cpu()
    return list(flat.split([t.numel() for t in logprobs]))


def engine_copy(model: Qwen3ForCausalLM) -> Qwen3ForCausalLM:
    clone = copy.deepcopy(model)
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def sync_event(engine_id: str, version: int, sent: str, acked: str, started: float) -> SyncEvent:
    return SyncEvent(engine_id=engine_id, version=version, checksum_sent=sent, checksum_acknowledged=acked,
                     started_at=started, finished_at=time.time())
