"""RayRunner: a trainer actor and rollout actors on a local Ray cluster (num_gpus=0 on the CPU) produce
records bitwise identical to the LocalRunner's; a rollout actor killed mid-step is restarted, re-synced,
and the step completes with no record lost or duplicated."""

import pytest

from rlkit import loop
from rlkit.timeline.records import bitwise_differences
from tests.runners.test_loop import small

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_cluster():
    import os

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _all_records(store):
    out = []
    for s in store.steps():
        out.extend(store.records(s.step))
        out.extend(store.recomputes(s.step))
    return out


def test_ray_run_equals_local_run_bitwise_and_survives_a_killed_actor(tmp_path, ray_cluster):
    cfg = small(steps=3, engines=2)
    local = loop.run(tmp_path / "local", cfg, progress=False)
    ray_store = loop.run(tmp_path / "ray", cfg.replace(runner="ray"), progress=False,
                         runner_kwargs={"kill_engine_at": (1, 1)})
    a, b = _all_records(local), _all_records(ray_store)
    assert len(a) == len(b) == 3 * (8 + 8)  # 8 records and 8 recomputes per step
    ids = [r.record_id for r in b if hasattr(r, "reward")]
    assert len(ids) == len(set(ids)) == 3 * 8, "records lost or duplicated"
    for x, y in zip(a, b):
        assert not bitwise_differences(x, y), bitwise_differences(x, y)
    assert [v.checksum for v in local.versions()] == [v.checksum for v in ray_store.versions()]
    engines = {r.engine_id for r in b if hasattr(r, "engine_id")}
    assert engines == {"engine-0", "engine-1"}
    resyncs = [s for s in ray_store.syncs() if s.engine_id == "engine-1" and s.version == 1]
    assert len(resyncs) >= 2 and all(s.ok for s in resyncs), "the restarted actor was not re-synced"


def test_tensor_parallel_engines_equal_the_local_run(tmp_path, ray_cluster):
    """Two rollout engines of two tensor-parallel ranks each (four actors, gloo within each engine): the
    records and recomputes are the LocalRunner's, bit for bit, and every weight sync is acknowledged with
    the checksum of the whole model rebuilt from the ranks' loaded shards."""
    cfg = small(steps=2, engines=2)
    local = loop.run(tmp_path / "local", cfg, progress=False)
    tp_store = loop.run(tmp_path / "tp", cfg.replace(runner="ray", rollout_tp=2), progress=False,
                        runner_kwargs={"num_cpus_per_actor": 0.5})
    a, b = _all_records(local), _all_records(tp_store)
    assert len(a) == len(b) == 2 * (8 + 8)
    for x, y in zip(a, b):
        assert not bitwise_differences(x, y), bitwise_differences(x, y)
    assert [v.checksum for v in local.versions()] == [v.checksum for v in tp_store.versions()]
    syncs = tp_store.syncs()
    assert {s.engine_id for s in syncs} == {"engine-0", "engine-1"} and all(s.ok for s in syncs)


def test_tensor_parallel_engines_need_ray():
    with pytest.raises(ValueError, match="rollout_tp=2 needs runner='ray'"):
        small(rollout_tp=2)


@pytest.mark.megatron
def test_megatron_tp2_trainer_with_tp2_engines_has_zero_mismatch(tmp_path, ray_cluster):
    """The layout of the 8-GPU issue at CPU scale: a Megatron trainer of two TP ranks and two rollout
    engines of two TP ranks each, all placed by the RayRunner (six actors). Strict: 0 mismatches at every
    step while the weights move; step 0 (same initial weights) equals the single-process Megatron run's
    records bit for bit; a checkpoint is a folder of per-rank files, and a run resumed from one redoes
    the next step bit for bit."""
    cfg = small(steps=3, engines=2, trainer="megatron", shaping=0.1)  # shaping: non-zero advantages
    local = loop.run(tmp_path / "local", cfg.replace(steps=1), progress=False)
    kw = {"num_cpus_per_actor": 0.5}
    store = loop.run(tmp_path / "ray", cfg.replace(runner="ray", rollout_tp=2, trainer_tp=2), progress=False,
                     runner_kwargs=kw)
    steps = store.steps()
    assert [s.step for s in steps] == [0, 1, 2] and all(s.mismatch_count == 0 for s in steps)
    assert len({v.checksum for v in store.versions()}) == 4, "the weights moved at every step"
    assert all(s.ok for s in store.syncs())
    for x, y in zip(local.records(0), store.records(0)):
        assert not bitwise_differences(x, y), bitwise_differences(x, y)
    assert (tmp_path / "ray" / "checkpoints" / "step-000001.pt" / "trainer.tp1.pp0").is_file()
    last = store.records(2) + store.recomputes(2)
    store.truncate_after(1)  # as if the run had died during step 2
    store.close()
    again = loop.run(tmp_path / "ray", None, resume=True, progress=False, runner_kwargs=kw)
    redone = again.records(2) + again.recomputes(2)
    assert len(redone) == len(last) > 0
    for x, y in zip(last, redone):
        assert not bitwise_differences(x, y), bitwise_differences(x, y)


@pytest.mark.megatron
def test_megatron_tp2_cp2_trainer_has_zero_mismatch(tmp_path, ray_cluster):
    """A Megatron trainer of TP 2 x CP 2 (four actors, Megatron's rank order: TP first, then CP) placed by
    the RayRunner beside one rollout engine: 0 mismatches at every step while the weights move; step 0
    equals the single-process Megatron run's records bit for bit; each rank checkpoints its own file."""
    cfg = small(steps=2, trainer="megatron", shaping=0.1)
    local = loop.run(tmp_path / "local", cfg.replace(steps=1), progress=False)
    store = loop.run(tmp_path / "ray", cfg.replace(runner="ray", trainer_tp=2, trainer_cp=2), progress=False,
                     runner_kwargs={"num_cpus_per_actor": 0.5})
    steps = store.steps()
    assert [s.step for s in steps] == [0, 1] and all(s.mismatch_count == 0 for s in steps)
    assert len({v.checksum for v in store.versions()}) == 3, "the weights moved at every step"
    assert all(s.ok for s in store.syncs())
    for x, y in zip(local.records(0) + local.recomputes(0), store.records(0) + store.recomputes(0)):
        assert not bitwise_differences(x, y), bitwise_differences(x, y)
    assert (tmp_path / "ray" / "checkpoints" / "step-000001.pt" / "trainer.tp1.cp1.pp0").is_file()
