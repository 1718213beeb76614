"""RayRunner: a trainer actor and N rollout actors; weights travel through Ray's object store.

Placement: every actor asks for `num_cpus` (1 by default) and `num_gpus` (0 on the CPU; 1 per actor
when the run's device is CUDA). A rollout actor that dies is restarted by Ray (max_restarts); the runner
then loads the current weight version into it again (a SyncEvent records the re-sync, checksum
acknowledged) and resubmits that engine's requests. Generation is a pure function of (weights, contract,
request), so the retried requests yield the same records, and results are collected once per request
id: nothing is lost or duplicated.

With the same seed and `threads`, records are bitwise identical to the LocalRunner's (tests/runners).
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import torch

from rlkit.config import RunConfig
from rlkit.contract import NumericsContract
from rlkit.model.qwen3 import Qwen3ForCausalLM
from rlkit.rollout.types import GenerationRequest, GenerationResult
from rlkit.runners.base import engine_copy, split_requests, sync_event
from rlkit.timeline.records import SyncEvent
from rlkit.train.trainer import TrainBatch


def _ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is in requirements.txt
        raise RuntimeError(f"--runner ray needs Ray (pip install -r requirements.txt): {exc}") from None
    return ray


class _TrainerActor:
    def __init__(self, cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract):
        from rlkit.runners.base import make_trainer

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.trainer = make_trainer(cfg, model, contract)

    def train_step(self, batch: TrainBatch):
        return self.trainer.train_step(batch)

    def publish(self):
        return self.trainer.state_dict(), self.trainer.checksum()

    def set_contract(self, contract):
        self.trainer.set_contract(contract)

    def save(self, path):
        self.trainer.save(path)

    def load(self, path):
        self.trainer.load(path)


class _RolloutActor:
    def __init__(self, cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract, engine_id: str):
        from rlkit.rollout.engine import EmbeddedEngine

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.engine = EmbeddedEngine(engine_copy(model), contract, cfg.engine, engine_id=engine_id)

    def pid(self) -> int:
        return os.getpid()

    def generate(self, requests):
        return self.engine.generate(requests)

    def load_weights(self, state_dict, version):
        return self.engine.load_weights(state_dict, version)

    def set_contract(self, contract):
        self.engine.set_contract(contract)

    def locate(self, seqs, plens, ids):
        from rlkit.parity import locate_first_divergence

        e = self.engine
        return locate_first_divergence(e.model, e.contract, e, seqs, plens, ids)


class RayRunner:
    def __init__(self, cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract,
                 num_cpus_per_actor: float = 1, kill_engine_at: tuple[int, int] | None = None):
        ray = _ray()
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(include_dashboard=False, log_to_driver=False, num_cpus=max(2, os.cpu_count() or 2))
        self.cfg = cfg
        self.contract = contract
        gpus = 1 if cfg.device.startswith("cuda") else 0
        trainer_cls = ray.remote(num_cpus=num_cpus_per_actor, num_gpus=gpus)(_TrainerActor)
        rollout_cls = ray.remote(num_cpus=num_cpus_per_actor, num_gpus=gpus, max_restarts=3,
                                 max_task_retries=0)(_RolloutActor)
        # Kept referenced for the runner's lifetime: Ray restarts a dead actor from its constructor
        # arguments, which must still be in the object store then.
        self._model_ref = model_ref = ray.put(model)
        self.trainer = trainer_cls.remote(cfg, model_ref, contract)
        self.engine_ids = [f"engine-{i}" for i in range(cfg.engines)]
        self.engines = [rollout_cls.remote(cfg, model_ref, contract, eid) for eid in self.engine_ids]
        self._version = 0
        self._weights_ref = None
        self._checksum = ""
        self.resyncs: list[SyncEvent] = []
        self._kill_engine_at = kill_engine_at
        self._step = -1

    def _get(self, refs):
        return _ray().get(refs)

    @staticmethod
    def _actor_down_errors():
        ex = _ray().exceptions
        return (ex.RayActorError, ex.ActorUnavailableError)

    def _call_restarting(self, make_ref, attempts: int = 120):
        """ray.get(make_ref()), retried while the actor is being restarted (it refuses calls then)."""
        for attempt in range(attempts):
            try:
                return self._get(make_ref())
            except _ray().exceptions.ActorUnavailableError:
                time.sleep(0.5)
        raise RuntimeError("a rollout actor did not come back after a restart")

    def generate(self, requests: Sequence[GenerationRequest], step: int) -> list[GenerationResult]:
        ray = _ray()
        parts = split_requests(requests, self.cfg)
        pending = {i: self.engines[i].generate.remote(part) for i, part in enumerate(parts) if part}
        if self._kill_engine_at and self._kill_engine_at[0] == step:
            ray.kill(self.engines[self._kill_engine_at[1]], no_restart=False)  # fault injection (tests)
        results: dict[str, GenerationResult] = {}
        for attempt in range(4):
            failed = []
            for i, ref in pending.items():
                try:
                    for r in ray.get(ref):
                        results.setdefault(r.request_id, r)
                except self._actor_down_errors():
                    failed.append(i)
            if not failed:
                break
            pending = {}
            for i in failed:
                self._resync(i)
                pending[i] = self.engines[i].generate.remote(parts[i])
        missing = [r.request_id for r in requests if r.request_id not in results]
        if missing:
            raise RuntimeError(f"rollout lost {len(missing)} requests after retries, e.g. {missing[:3]}")
        return [results[r.request_id] for r in requests]

    def _resync(self, i: int) -> None:
        """A restarted actor holds its construction weights: load the current version again."""
        started = time.time()
        engine = self.engines[i]
        acked = self._call_restarting(lambda: engine.load_weights.remote(self._weights_ref, self._version))
        self._call_restarting(lambda: engine.set_contract.remote(self.contract))
        self.resyncs.append(sync_event(self.engine_ids[i], self._version, self._checksum, acked, started))

    def train_step(self, batch: TrainBatch):
        return self._get(self.trainer.train_step.remote(batch))

    def publish(self, version: int) -> str:
        ray = _ray()
        state, checksum = self._get(self.trainer.publish.remote())
        self._weights_ref = ray.put(state)  # one copy in the object store, read by every engine
        self._version, self._checksum = version, checksum
        return checksum

    def sync(self, version: int, checksum: str) -> list[SyncEvent]:
        started = time.time()
        acks = self._get([e.load_weights.remote(self._weights_ref, version) for e in self.engines])
        return [sync_event(eid, version, checksum, a, started) for eid, a in zip(self.engine_ids, acks)]

    def take_resyncs(self) -> list[SyncEvent]:
        out, self.resyncs = self.resyncs, []
        return out

    def set_contract(self, contract: NumericsContract) -> None:
        self.contract = contract
        self._get([self.trainer.set_contract.remote(contract)] + [e.set_contract.remote(contract)
                                                                   for e in self.engines])

    def locate(self, seqs, plens, ids) -> dict | None:
        return self._get(self.engines[0].locate.remote(seqs, plens, ids))

    def engine_pid(self, i: int) -> int:
        return self._get(self.engines[i].pid.remote())

    def save(self, path) -> None:
        self._get(self.trainer.save.remote(str(path)))

    def load(self, path, version: int) -> list[SyncEvent]:
        self._get(self.trainer.load.remote(str(path)))
        return self.sync(version, self.publish(version))

    def close(self) -> None:
        ray = _ray()
        for actor in [self.trainer, *self.engines]:
            ray.kill(actor, no_restart=True)
