"""The RayRunner's GPU plan (rlkit/runners/placement.py): the ranks of one group on distinct GPUs,
colocated evenly when there are fewer GPUs than actors, a GPU each when there are enough. The plan's use
by Ray (placement group bundles, each actor's CUDA_VISIBLE_DEVICES) runs in lab/layouts_2gpu.py's Ray
phase (tests/train/test_layouts_2gpu_dry_run.py, over two GPUs a CPU Ray cluster declares)."""

import pytest

from rlkit.runners.placement import plan_gpus


def test_cp2_trainer_and_one_engine_share_two_gpus():
    """The two-GPU issue layout: trainer TP 1 x CP 2 and a TP-1 engine (3 actors, 2 GPUs)."""
    plan = plan_gpus({"trainer": 2, "engine-0": 1}, 2)
    assert plan.gpus == {"trainer": [0, 1], "engine-0": [0]}
    assert plan.load == {0: 2, 1: 1} and plan.share == 0.5


def test_cp2_trainer_and_a_tp2_engine_one_rank_of_each_a_gpu():
    plan = plan_gpus({"trainer": 2, "engine-0": 2}, 2)
    assert plan.gpus == {"trainer": [0, 1], "engine-0": [0, 1]} and plan.share == 0.5


def test_source_layout_on_eight_gpus():
    """Megatron TP 4 x CP 2 (8 ranks) feeding two TP-4 engines: every GPU one trainer rank and one engine
    rank, the engines on disjoint halves."""
    plan = plan_gpus({"trainer": 8, "engine-0": 4, "engine-1": 4}, 8)
    assert plan.gpus["trainer"] == list(range(8))
    assert plan.gpus["engine-0"] == [0, 1, 2, 3] and plan.gpus["engine-1"] == [4, 5, 6, 7]
    assert set(plan.load.values()) == {2} and plan.share == 0.5


def test_enough_gpus_give_every_actor_its_own():
    """What `num_gpus=1` per actor gave before the plan: six actors on six of eight GPUs."""
    plan = plan_gpus({"trainer": 2, "engine-0": 2, "engine-1": 2}, 8)
    assert plan.gpus == {"trainer": [0, 1], "engine-0": [2, 3], "engine-1": [4, 5]}
    assert plan.share == 1.0 and len(plan.load) == 6


def test_uneven_load_asks_a_share_ray_can_count():
    """Three actors on one GPU: each asks 0.3333 (Ray counts GPU shares in units of 1e-4)."""
    plan = plan_gpus({"trainer": 1, "engine-0": 1, "engine-1": 1}, 1)
    assert plan.gpus == {"trainer": [0], "engine-0": [0], "engine-1": [0]}
    assert plan.share == 0.3333 and 3 * plan.share <= 1


@pytest.mark.parametrize("groups, gpus, match", [
    ({"trainer": 4, "engine-0": 1}, 2, "trainer has 4 ranks .* 2 GPUs"),
    ({"trainer": 1, "engine-0": 4}, 2, "engine-0 has 4 ranks"),
    ({"trainer": 1}, 0, "at least one GPU"),
])
def test_a_group_wider_than_the_gpus_is_refused(groups, gpus, match):
    with pytest.raises(ValueError, match=match):
        plan_gpus(groups, gpus)
