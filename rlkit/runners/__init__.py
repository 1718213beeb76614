"""Runners place the trainer and the rollout engines: in this process, or in Ray actors."""

from rlkit.runners.base import Runner, SyncError, seeded_model
from rlkit.runners.local import LocalRunner


def make_runner(cfg, model, contract, **kw) -> Runner:
    if cfg.runner == "ray":
        from rlkit.runners.ray_runner import RayRunner

        return RayRunner(cfg, model, contract, **kw)
    return LocalRunner(cfg, model, contract)


__all__ = ["Runner", "LocalRunner", "SyncError", "seeded_model", "make_runner"]
