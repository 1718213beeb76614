"""Which GPU each Ray actor of a run sits on: the trainer's ranks and every rollout engine's ranks.

Why a plan of its own: one actor per GPU is what Ray does by default (`num_gpus=1`), so a TP 1 x CP 2
trainer beside one rollout engine asks for three GPUs, and on a two-GPU machine the third actor waits for
ever. The source layout (a TP 4 x CP 2 trainer feeding two TP-4 engines on 8 GPUs) is colocated: trainer
and engines share the GPUs. The rules:
- the ranks of one process group (the trainer's TP x CP x PP ranks; one engine's TP ranks) sit on
  distinct GPUs: NCCL refuses two ranks of one communicator on one device;
- each group takes the least loaded GPUs (ties: the lower index), the trainer first, then the engines in
  order, its ranks in ascending GPU order; so with enough GPUs every actor has a GPU of its own (what
  `num_gpus=1` gave), and with fewer they share evenly;
- every actor asks for `share` of a GPU, 1 / (most actors on one GPU), so Ray's accounting fits exactly.
The RayRunner pins each actor to its GPU through a placement group of one bundle a GPU used
(`{"GPU": 1, "CPU": ...}`): Ray hands each bundle its own GPU and sets an actor's CUDA_VISIBLE_DEVICES
to its bundle's, so `cuda` inside an actor is the planned GPU. Nothing here changes a bit: where a rank
computes is not part of the numerics contract.

    plan = plan_gpus({"trainer": 2, "engine-0": 1}, gpus=2)
    plan.gpus["trainer"], plan.gpus["engine-0"], plan.share   # [0, 1], [0], 0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuPlan:
    gpus: dict[str, list[int]]
    """Each group's ranks' GPU indices (0..n-1 of the GPUs placed over), rank order."""
    share: float
    """The fraction of a GPU every actor asks Ray for (rounded down to Ray's 1e-4 resolution)."""

    @property
    def load(self) -> dict[int, int]:
        """Actors on each GPU that holds any."""
        out: dict[int, int] = {}
        for ranks in self.gpus.values():
            for g in ranks:
                out[g] = out.get(g, 0) + 1
        return dict(sorted(out.items()))


def plan_gpus(groups: dict[str, int], gpus: int) -> GpuPlan:
    """Place groups of ranks (name -> rank count, in placement order) over `gpus` GPUs (rules above).
    ValueError (one line) when a group has more ranks than there are GPUs."""
    if gpus < 1:
        raise ValueError(f"placing actors on GPUs needs at least one GPU, got {gpus}")
    load = [0] * gpus
    out: dict[str, list[int]] = {}
    for name, ranks in groups.items():
        if ranks < 1:
            raise ValueError(f"{name}: {ranks} ranks (need >= 1)")
        if ranks > gpus:
            raise ValueError(f"{name} has {ranks} ranks and each needs a GPU of its own (NCCL), but there are "
                             f"{gpus} GPUs to place on")
        chosen = sorted(sorted(range(gpus), key=lambda g: (load[g], g))[:ranks])
        for g in chosen:
            load[g] += 1
        out[name] = chosen
    return GpuPlan(out, math.floor(1e4 / max(load)) / 1e4)
