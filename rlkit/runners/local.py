"""LocalRunner: the trainer and K embedded engines in this process (the embedded default)."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from rlkit.config import RunConfig
from rlkit.contract import NumericsContract
from rlkit.divergence import locate_first_divergence
from rlkit.model.qwen3 import Qwen3ForCausalLM
from rlkit.rollout.engine import EmbeddedEngine
from rlkit.rollout.types import GenerationRequest, GenerationResult
from rlkit.runners.base import engine_copy, logprobs_to_host, make_trainer, split_requests, sync_event
from rlkit.timeline.records import SyncEvent
from rlkit.train.trainer import TrainBatch


class LocalRunner:
    def __init__(self, cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract):
        # the torch thread count (cfg.threads) is this process's: rlkit/loop.py sets it before the model
        self.cfg = cfg
        self.engines = [EmbeddedEngine(engine_copy(model), contract, cfg.engine, engine_id=f"engine-{i}")
                        for i in range(cfg.engines)]
        self.trainer = make_trainer(cfg, model, contract)
        self.engine_ids = [e.engine_id for e in self.engines]
        self._published: dict[str, torch.Tensor] | None = None

    def generate(self, requests: Sequence[GenerationRequest], step: int) -> list[GenerationResult]:
        out: list[GenerationResult] = []
        for engine, part in zip(self.engines, split_requests(requests, self.cfg)):
            out.extend(engine.generate(part))
        order = {r.request_id: i for i, r in enumerate(requests)}
        return sorted(out, key=lambda r: order[r.request_id])

    def train_step(self, batch: TrainBatch):
        logprobs, stats = self.trainer.train_step(batch)
        return logprobs_to_host(logprobs), stats

    def publish(self, version: int) -> str:
        self._published = self.trainer.state_dict()
        return self.trainer.checksum()

    def sync(self, version: int, checksum: str) -> list[SyncEvent]:
        events = []
        for engine in self.engines:
            started = time.time()
            acked = engine.load_weights(self._published, version)
            events.append(sync_event(engine.engine_id, version, checksum, acked, started))
        return events

    def take_resyncs(self) -> list[SyncEvent]:
        return []  # in-process engines never restart

    def set_contract(self, contract: NumericsContract) -> None:
        self.trainer.set_contract(contract)
        for engine in self.engines:
            engine.set_contract(contract)

    def locate(self, seqs, plens, ids) -> dict | None:
        engine = self.engines[0]
        return locate_first_divergence(engine.model, engine.contract, engine, seqs, plens, ids)

    def save(self, path) -> None:
        self.trainer.save(path)

    def load(self, path, version: int) -> list[SyncEvent]:
        self.trainer.load(path)
        return self.sync(version, self.publish(version))

    def placement(self) -> dict:
        """Where the trainer and the engines run: this process, on the run's device."""
        return {"runner": "local", "device": self.cfg.device}

    def close(self) -> None:
        """Drop the engines (weights, KV cache, decode graphs) and the trainer (model, optimizer): once the
        loop has closed its runner their GPU memory is free, whoever still holds the runner (a second run
        in the same process starts on an empty GPU). A closed runner is not used again."""
        self.engines, self.trainer, self._published = [], None, None
