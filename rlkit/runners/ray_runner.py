"""RayRunner: trainer actors and rollout actors; weights travel through Ray's object store, or by CUDA IPC
where the trainer and every engine share one GPU (rlkit/runners/shared_weights.py: the engines copy the
weights from the trainer's memory, device to device; `placement()["weights"]` says which).

Placement: every actor asks for `num_cpus` (1 by default). On the CPU it asks for no GPU. When the run's
device is CUDA, the actors are placed over the Ray cluster's GPUs (or `gpus` of them) by
rlkit/runners/placement.py: the ranks of one group (the trainer's, each engine's) on distinct GPUs,
trainer and engines sharing GPUs when there are fewer GPUs than actors (a TP 1 x CP 2 trainer and a TP-2
engine on two GPUs: one trainer rank and one engine rank on each), each actor pinned to its GPU through
a placement group bundle and asking for an equal share of it. `gpus=N` on a CPU run places the actors
the same way over N GPUs the Ray cluster declares (`ray.init(num_gpus=N)`), computing on the CPU: the
placement's test without a GPU. `placement()` says where each rank landed (Ray's GPU ids).

A rollout actor that dies is restarted by Ray (max_restarts); the runner then loads the current weight
version into it again (a SyncEvent records the re-sync, checksum acknowledged) and resubmits that
engine's requests. Generation is a pure function of (weights, contract, request), so the retried
requests yield the same records, and results are collected once per request id: nothing is lost or
duplicated.

Tensor-parallel engines (`RunConfig.rollout_tp` > 1): an engine is `rollout_tp` actors, one per rank,
joined in their own process group (gloo on the CPU, NCCL on GPUs) and holding their shards of the model
(rlkit/model/parallel.py). Every call goes to all ranks of the engine (they meet in collectives); the
records come from rank 0, and the runner checks that every rank sampled the same tokens. A weight sync's
acknowledged checksum is that of the whole model rebuilt from the ranks' loaded shards, so it compares
with the trainer's. A rank that dies fails the step with a clear error: a TP engine is not restarted. A Megatron trainer
at TP x CP x PP > 1 (`trainer_tp`, `trainer_cp`, `trainer_pp`) is likewise one actor per rank in its own
group (Megatron orders the ranks TP first, then CP, then PP); every call goes to all of them and rank 0
answers.

With the same seed and `threads`, records are bitwise identical to the LocalRunner's (tests/runners).
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import torch

from rlkit.config import RunConfig
from rlkit.contract import NumericsContract
from rlkit.divergence import locate_first_divergence
from rlkit.distributed import free_port, join_group
from rlkit.model.qwen3 import Qwen3ForCausalLM
from rlkit.rollout.types import GenerationRequest, GenerationResult
from rlkit.runners.base import engine_copy, logprobs_to_host, split_requests, sync_event
from rlkit.runners.placement import plan_gpus
from rlkit.runners.shared_weights import SharedWeights
from rlkit.timeline.records import SyncEvent
from rlkit.train.trainer import TrainBatch


def _ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is in requirements.txt
        raise RuntimeError(f"--runner ray needs Ray (pip install -r requirements.txt): {exc}") from None
    return ray


class _TrainerActor:
    def __init__(self, cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract, rank: int = 0,
                 port: int = 0):
        from rlkit.runners.base import make_trainer

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.trainer_ranks > 1:
            join_group(cfg.device, rank, cfg.trainer_ranks, port)
        self.trainer = make_trainer(cfg, model, contract)

    def train_step(self, batch: TrainBatch):
        logprobs, stats = self.trainer.train_step(batch)
        return logprobs_to_host(logprobs), stats

    def gpu_ids(self) -> list:
        return _ray().get_gpu_ids()

    def publish(self):
        return self.trainer.state_dict(), self.trainer.checksum()

    def publish_shared(self):
        """The weights as CUDA IPC handles (kept alive here until the next publish: an engine restarted
        in the meantime loads them again)."""
        self._shared = SharedWeights(self.trainer.state_dict())
        return self._shared, self.trainer.checksum()

    def set_contract(self, contract):
        self.trainer.set_contract(contract)

    def save(self, path):
        self.trainer.save(path)

    def load(self, path):
        self.trainer.load(path)


class _RolloutActor:
    def __init__(self, cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract, engine_id: str,
                 tp_rank: int = 0, tp_port: int = 0):
        from rlkit.rollout.engine import EmbeddedEngine

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.tp_size, self.tp_rank = cfg.rollout_tp, tp_rank
        if self.tp_size > 1:
            import torch.distributed as dist

            from rlkit.model.parallel import TensorParallel

            join_group(cfg.device, tp_rank, self.tp_size, tp_port)
            shard = Qwen3ForCausalLM(model.config, TensorParallel(self.tp_size, tp_rank, dist.group.WORLD))
            shard.load_state_dict(shard.shard(model.state_dict()))
            model = shard.to(model.device)
        else:
            model = engine_copy(model)
        self.engine = EmbeddedEngine(model, contract, cfg.engine, engine_id=engine_id)

    def pid(self) -> int:
        return os.getpid()

    def gpu_ids(self) -> list:
        return _ray().get_gpu_ids()

    def generate(self, requests):
        return self.engine.generate(requests)

    def load_weights(self, state_dict, version):
        if isinstance(state_dict, SharedWeights):  # copied from the trainer's memory on this GPU
            return state_dict.load_into(lambda state: self.engine.load_weights(state, version))
        acked = self.engine.load_weights(state_dict, version)
        if self.tp_size == 1:
            return acked
        # the whole model rebuilt from what every rank loaded, checksummed on rank 0
        import torch.distributed as dist

        from rlkit.model.checkpoint import weights_checksum
        from rlkit.model.parallel import unshard_state_dicts

        mine = {k: v.detach().cpu() for k, v in self.engine.model.state_dict().items()}
        parts = [None] * self.tp_size if self.tp_rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        return weights_checksum(unshard_state_dicts(parts, self.engine.model.config)) if self.tp_rank == 0 else None

    def set_contract(self, contract):
        self.engine.set_contract(contract)

    def locate(self, seqs, plens, ids):
        e = self.engine
        return locate_first_divergence(e.model, e.contract, e, seqs, plens, ids)


class RayRunner:
    def __init__(self, cfg: RunConfig, model: Qwen3ForCausalLM, contract: NumericsContract,
                 num_cpus_per_actor: float = 1, kill_engine_at: tuple[int, int] | None = None,
                 gpus: int | None = None):
        """`gpus`: how many of the Ray cluster's GPUs to place the actors over (None: all of them when the
        run's device is CUDA, none on the CPU)."""
        ray = _ray()
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(include_dashboard=False, log_to_driver=False, num_cpus=max(2, os.cpu_count() or 2))
        self.cfg = cfg
        self.contract = contract
        tp, ranks = cfg.rollout_tp, cfg.trainer_ranks
        self.engine_ids = [f"engine-{i}" for i in range(cfg.engines)]
        self.plan, self._pg = self._place(cfg, gpus, num_cpus_per_actor)
        trainer_cls = ray.remote(num_cpus=num_cpus_per_actor)(_TrainerActor)
        rollout_cls = ray.remote(num_cpus=num_cpus_per_actor, max_restarts=3 if tp == 1 else 0,
                                 max_task_retries=0)(_RolloutActor)
        # Kept referenced for the runner's lifetime: Ray restarts a dead actor from its constructor
        # arguments, which must still be in the object store then.
        self._model_ref = model_ref = ray.put(model)
        port = free_port() if ranks > 1 else 0
        self.trainers = [self._on_gpu(trainer_cls, "trainer", r).remote(cfg, model_ref, contract, r, port)
                         for r in range(ranks)]
        self.trainer = self.trainers[0]
        self.groups = []  # the actors of each engine, rank 0 first
        for eid in self.engine_ids:
            port = free_port() if tp > 1 else 0
            self.groups.append([self._on_gpu(rollout_cls, eid, r).remote(cfg, model_ref, contract, eid, r, port)
                                for r in range(tp)])
        self.engines = [g[0] for g in self.groups]
        self._version = 0
        self._weights_ref = None
        self._checksum = ""
        self.resyncs: list[SyncEvent] = []
        self._kill_engine_at = kill_engine_at
        self._step = -1
        self._by_ipc: bool | None = None

    def _place(self, cfg: RunConfig, gpus: int | None, cpus: float):
        """(the GPU plan, the placement group holding one bundle a GPU it uses), or (None, None) when the
        actors ask for no GPU."""
        ray = _ray()
        have = int(ray.cluster_resources().get("GPU", 0))
        if gpus is None:
            if not cfg.device.startswith("cuda"):
                return None, None
            if have == 0:
                raise RuntimeError(f"device {cfg.device}, but the Ray cluster has no GPU")
            if cfg.device not in ("cuda", "cuda:0"):  # an actor sees its own GPU alone, as cuda:0
                raise ValueError(f"device {cfg.device}: the RayRunner places its actors on GPUs itself; "
                                 f"use device cuda")
            gpus = have
        if gpus == 0:
            return None, None
        if gpus > have:
            raise ValueError(f"placing on {gpus} GPUs, but the Ray cluster has {have}")
        plan = plan_gpus({"trainer": cfg.trainer_ranks, **{eid: cfg.rollout_tp for eid in self.engine_ids}}, gpus)
        from ray.util.placement_group import placement_group, remove_placement_group

        bundles = [{"GPU": 1, **({"CPU": cpus * n} if cpus else {})} for n in plan.load.values()]
        pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(pg.ready(), timeout=120)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            raise RuntimeError(f"Ray could not reserve {len(bundles)} GPUs with {cpus} CPUs an actor within "
                               f"120 s (cluster: {ray.cluster_resources()})") from None
        return plan, pg

    def _on_gpu(self, cls, group: str, rank: int):
        """The actor class pinned to rank `rank` of `group`'s planned GPU (as is when no GPU is used)."""
        if self.plan is None:
            return cls
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = list(self.plan.load).index(self.plan.gpus[group][rank])
        return cls.options(num_gpus=self.plan.share, scheduling_strategy=PlacementGroupSchedulingStrategy(
            self._pg, placement_group_bundle_index=bundle))

    def placement(self) -> dict:
        """Where the actors run: the plan (GPU indices among those placed over) and, per group, the GPU
        ids Ray gave each rank (what its CUDA_VISIBLE_DEVICES holds)."""
        if self.plan is None:
            return {"runner": "ray", "device": self.cfg.device, "gpus": 0, "weights": "object store"}
        ids = self._gpu_ids()
        return {"runner": "ray", "device": self.cfg.device, "gpus": len(self.plan.load), "share": self.plan.share,
                "plan": self.plan.gpus, "ray_gpu_ids": ids,
                "weights": "cuda ipc" if self._weights_by_ipc() else "object store"}

    def _gpu_ids(self) -> dict[str, list[list[str]]]:
        actors = {"trainer": self.trainers, **dict(zip(self.engine_ids, self.groups))}
        return {name: [[str(i) for i in got] for got in self._get([a.gpu_ids.remote() for a in group])]
                for name, group in actors.items()}

    def _weights_by_ipc(self) -> bool:
        """Whether weights go by CUDA IPC: a CUDA run whose one-rank trainer and one-rank engines all got
        the same single GPU from Ray (a handle means nothing on another GPU)."""
        if self._by_ipc is None:
            self._by_ipc = False
            if (self.plan is not None and self.cfg.device.startswith("cuda") and self.cfg.trainer_ranks == 1
                    and self.cfg.rollout_tp == 1):
                seen = {tuple(ids) for group in self._gpu_ids().values() for ids in group}
                self._by_ipc = len(seen) == 1 and len(next(iter(seen))) == 1
        return self._by_ipc

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

    def _group_get(self, i: int, refs: list) -> list:
        """ray.get of one call on every rank of engine i, in rank order; for a tensor-parallel engine, a
        clear error when a rank is gone (its ranks cannot go on without it)."""
        try:
            return self._get(refs)
        except self._actor_down_errors() as exc:
            if len(refs) == 1:
                raise
            raise RuntimeError(f"{self.engine_ids[i]}: a rank of the tensor-parallel engine is gone "
                               f"({type(exc).__name__}); TP engines are not restarted") from None

    def _generate_tp(self, parts) -> dict[str, GenerationResult]:
        pending = {i: [a.generate.remote(part) for a in self.groups[i]] for i, part in enumerate(parts) if part}
        results: dict[str, GenerationResult] = {}
        for i, refs in pending.items():
            first, *others = self._group_get(i, refs)
            for rank, other in enumerate(others, start=1):
                if [r.token_ids for r in other] != [r.token_ids for r in first]:
                    raise RuntimeError(f"{self.engine_ids[i]}: rank {rank} sampled other tokens than rank 0")
            results.update((r.request_id, r) for r in first)
        return results

    def generate(self, requests: Sequence[GenerationRequest], step: int) -> list[GenerationResult]:
        ray = _ray()
        parts = split_requests(requests, self.cfg)
        if self.cfg.rollout_tp > 1:
            results = self._generate_tp(parts)
            missing = [r.request_id for r in requests if r.request_id not in results]
            if missing:
                raise RuntimeError(f"rollout lost {len(missing)} requests, e.g. {missing[:3]}")
            return [results[r.request_id] for r in requests]
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

    def _trainer_call(self, call):
        """`call(actor)` on every trainer rank (they meet in collectives); rank 0's value."""
        return self._get([call(a) for a in self.trainers])[0]

    def train_step(self, batch: TrainBatch):
        return self._trainer_call(lambda a: a.train_step.remote(batch))

    def publish(self, version: int) -> str:
        ray = _ray()
        if self._weights_by_ipc():  # handles only: the engines copy from the trainer's memory
            state, checksum = self._trainer_call(lambda a: a.publish_shared.remote())
        else:
            state, checksum = self._trainer_call(lambda a: a.publish.remote())
        self._weights_ref = ray.put(state)  # one copy in the object store, read by every engine
        self._version, self._checksum = version, checksum
        return checksum

    def sync(self, version: int, checksum: str) -> list[SyncEvent]:
        started = time.time()
        refs = [[a.load_weights.remote(self._weights_ref, version) for a in g] for g in self.groups]
        acks = [self._group_get(i, r)[0] for i, r in enumerate(refs)]  # rank 0 acknowledges for its engine
        return [sync_event(eid, version, checksum, a, started) for eid, a in zip(self.engine_ids, acks)]

    def take_resyncs(self) -> list[SyncEvent]:
        out, self.resyncs = self.resyncs, []
        return out

    def set_contract(self, contract: NumericsContract) -> None:
        self.contract = contract
        self._get([t.set_contract.remote(contract) for t in self.trainers] +
                  [a.set_contract.remote(contract) for g in self.groups for a in g])

    def locate(self, seqs, plens, ids) -> dict | None:
        # every rank runs the locator's forwards (its ranks meet in collectives); rank 0 reports
        return self._group_get(0, [a.locate.remote(seqs, plens, ids) for a in self.groups[0]])[0]

    def engine_pid(self, i: int) -> int:
        return self._get(self.engines[i].pid.remote())

    def _trainer_path(self, path) -> str:
        """A one-rank trainer saves to `path`; a multi-rank one into the folder `path`, a file per rank."""
        if len(self.trainers) == 1:
            return str(path)
        os.makedirs(path, exist_ok=True)
        return os.path.join(path, "trainer")

    def save(self, path) -> None:
        target = self._trainer_path(path)
        self._trainer_call(lambda a: a.save.remote(target))

    def load(self, path, version: int) -> list[SyncEvent]:
        target = self._trainer_path(path)
        self._trainer_call(lambda a: a.load.remote(target))
        return self.sync(version, self.publish(version))

    def close(self) -> None:
        ray = _ray()
        for actor in [*self.trainers, *(a for g in self.groups for a in g)]:
            ray.kill(actor, no_restart=True)
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None
