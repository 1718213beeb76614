"""The layout matrix on gloo: every Megatron trainer layout in {TP 1, 2} x {CP 1, 2} x {PP 1, 2} against
the embedded rollout at TP 1, 2 and 4.

A cell is `trainer_vs_decode`: the logprobs the rollout recorded while decoding (paged, TP p) against what
the trainer recomputes for the same sequences (packed, TP x CP x PP), compared with torch.equal on every
rank of the trainer. Under the strict contract every cell has 0 mismatches (raw and processed
logprobs): the row-parallel sums are the canonical tree whatever the TP degree, a query's attention is a
function of its keys 0..p and the fixed split schedule whatever the CP degree (context_parallel.py), and
pipeline stages only move activations. The native path's cells are measured beside them as the control
(printed; where this CPU's native kernels happen to agree everywhere, the control is skipped with its
measurement, tests/negative.py). Each layout also runs one GRPO step: its forward equals the rollout, its
ranks end with identical weights, and the weights it publishes decode to what it recomputes.

Process plan for 2 shared cores: one gloo group per world size computing all of its cells, its ranks
forked from a server that imported torch and Megatron once. World 4 first: rollouts at TP 1 (rank 0),
TP 2 (ranks 0, 1) and TP 4, strict and native, then its trainer layouts; worlds 1, 2 and 8 then
recompute the sequences those rollouts sampled.
Run: `.venv/bin/python -m pytest -q -s tests/train/test_layout_matrix.py` (-s shows the tables).
"""

from __future__ import annotations

import math

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.model import build_model, preset
from rlkit.model.checkpoint import weights_checksum
from rlkit.rollout.engine import EmbeddedEngine
from rlkit.rollout.types import GenerationRequest
from rlkit.types import SamplingParams
from tests.distributed import run_ranks
from tests.negative import require_native_difference

pytestmark = pytest.mark.megatron

SEED = 0
STRICT, NATIVE = NumericsContract.default(), NumericsContract.native()
SAMPLING = dict(temperature=0.9, top_p=0.95)
# (prompt length, max new tokens): packs either side of the 16-row GEMM tile; the 2-token prompt with one
# new token gives a 3-token sequence, shorter than the 4 chunks CP 2 cuts it into (empty chunks)
PROMPTS = [(5, 7), (9, 5), (3, 8), (2, 1)]
LAYOUTS = {1: [(1, 1, 1)], 2: [(2, 1, 1), (1, 2, 1), (1, 1, 2)], 4: [(2, 2, 1), (2, 1, 2), (1, 2, 2)],
           8: [(2, 2, 2)]}
"""Trainer layouts (TP, CP, PP) by world size."""
ROLLOUT_TP = (1, 2, 4)
RESUMED = (1, 2, 1)
"""The layout that also checkpoints and resumes (each CP rank its own file)."""
LR = 1e-3
PRELOAD = ("torch", "rlkit.train.megatron", "rlkit.rollout.engine", "tests.train.test_layout_matrix")
"""Imported once by the fork server the ranks are forked from (tests/distributed.py)."""


def _requests() -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(4)
    return [GenerationRequest(f"m{i}", tuple(torch.randint(0, 151_000, (n,), generator=g).tolist()),
                              SamplingParams(max_tokens=m, seed=i, **SAMPLING), logprobs_mode="both")
            for i, (n, m) in enumerate(PROMPTS)]


def _advantages(sequences, prompt_lens):
    """GRPO-style signed advantages: per token for the first sequence, one float for the others."""
    return ([torch.full((len(sequences[0]) - prompt_lens[0],), -1.0)]
            + [1.0 if i % 2 else -1.0 for i in range(1, len(sequences))])


# -- what each rank does (module level: pickled into spawned processes) -------------------------------
def _rollout(tp: int, rank: int, group, contract: NumericsContract) -> dict:
    from rlkit.model.parallel import TensorParallel

    model = build_model(preset("tiny"), seed=SEED, tp=TensorParallel(tp, rank, group) if tp > 1 else None)
    results = EmbeddedEngine(model, contract).generate(_requests())
    assert all(r.ok for r in results), [r.error for r in results]
    return {"sequences": [list(r.prompt_ids) + r.token_ids for r in results],
            "prompt_lens": [len(r.prompt_ids) for r in results],
            "raw": torch.cat([torch.tensor(r.raw_logprobs, dtype=torch.float32) for r in results]),
            "processed": torch.cat([torch.tensor(r.processed_logprobs, dtype=torch.float32) for r in results])}


def _rollouts(rank: int, world: int) -> dict:
    """{(rollout TP, path): record} for TP 1 (rank 0 alone), TP 2 (ranks 0 and 1) and TP 4 (the world),
    as rank 0 recorded them, on every rank."""
    import torch.distributed as dist

    pair = dist.new_group([0, 1])  # every rank takes part in making a group
    out = {}
    for name, contract in (("strict", STRICT), ("native", NATIVE)):
        if rank == 0:
            out[(1, name)] = _rollout(1, 0, None, contract)
        if rank < 2:
            out[(2, name)] = _rollout(2, rank, pair, contract)
        out[(4, name)] = _rollout(4, rank, dist.group.WORLD, contract)
    shared = [out]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def _sequence_sets(rollouts: dict) -> tuple[dict, dict]:
    """The distinct (path, sequences) the trainer must recompute, and which one each rollout cell uses."""
    sets, cell_set = {}, {}
    for (tp, path), rec in rollouts.items():
        key = (path, tuple(map(tuple, rec["sequences"])))
        sets.setdefault(key, {"path": path, "sequences": rec["sequences"], "prompt_lens": rec["prompt_lens"]})
        cell_set[(tp, path)] = key
    return sets, cell_set


def _layout_rank(rank: int, world: int, sets: dict | None, train_job: dict | None) -> dict:
    """(World 4 with sets None: the rollouts first.) Every layout of this world size: recompute every
    sequence set, then one GRPO step."""
    from megatron.core import parallel_state

    from rlkit.train.megatron import MegatronTrainConfig, MegatronTrainer, TrainBatch
    from rlkit.train.trainer import OptimConfig

    out = {}
    if sets is None:
        out["rollouts"] = _rollouts(rank, world)
        sets, _ = _sequence_sets(out["rollouts"])
        r = out["rollouts"][(1, "strict")]
        train_job = {"sequences": r["sequences"], "prompt_lens": r["prompt_lens"], "old": r["raw"]}
    cfg = preset("tiny")
    hf = build_model(cfg, seed=SEED).state_dict()
    for tp, cp, pp in LAYOUTS[world]:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()  # the next layout regroups the same ranks
        tr = MegatronTrainer(cfg, hf, config=MegatronTrainConfig(tp=tp, pp=pp, cp=cp, optim=OptimConfig(lr=LR)))
        cells = {}
        for key, job in sets.items():
            tr.contract = STRICT if job["path"] == "strict" else NATIVE
            seqs, plens = job["sequences"], job["prompt_lens"]
            cells[key] = {"raw": torch.cat(tr.response_logprobs(seqs, plens))}
            if job["path"] == "strict":
                params = [SamplingParams(**SAMPLING)] * len(seqs)
                cells[key]["processed"] = torch.cat(tr.response_logprobs(seqs, plens, params))
        tr.contract = STRICT
        seqs, plens = train_job["sequences"], train_job["prompt_lens"]
        old = list(torch.split(train_job["old"], [len(s) - p for s, p in zip(seqs, plens)]))
        step_lps, stats = tr.train_step(TrainBatch(seqs, plens, old, _advantages(seqs, plens)))
        state = tr.state_dict_hf()
        out[(tp, cp, pp)] = {"cells": cells, "stats": stats, "step_logprobs": torch.cat(step_lps),
                             "checksum": weights_checksum(state),
                             "state_after": state if rank == 0 else None,
                             "logprobs_after": torch.cat(tr.response_logprobs(seqs, plens))}
        if (tp, cp, pp) == RESUMED:
            out["resume"] = _resume_twice(tr, TrainBatch(seqs, plens, old, _advantages(seqs, plens)))
    return out


def _resume_twice(tr, batch) -> list:
    """Save this rank's state, then twice: load it and take a step. Both must give the same weights."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/ckpt"  # this rank's file: ckpt.tp<r>.cp<c>.pp<s>
        tr.save(path)
        runs = []
        for _ in range(2):
            tr.load(path)
            _, stats = tr.train_step(batch)
            runs.append((weights_checksum(tr.state_dict_hf()), stats))
        return runs


# -- the matrix ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def matrix() -> dict:
    """{"rollouts": {(tp, path): record}, "cell_set": ..., (tp, cp, pp): [per-rank results]}."""
    four = run_ranks(4, _layout_rank, None, None, preload=PRELOAD)
    rollouts = four[0]["rollouts"]
    sets, cell_set = _sequence_sets(rollouts)
    r = rollouts[(1, "strict")]
    train_job = {"sequences": r["sequences"], "prompt_lens": r["prompt_lens"], "old": r["raw"]}
    out = {"rollouts": rollouts, "cell_set": cell_set, "train_job": train_job}
    for world in (4, 1, 2, 8):
        ranks = four if world == 4 else run_ranks(world, _layout_rank, sets, train_job, preload=PRELOAD)
        for layout in LAYOUTS[world]:
            out[layout] = [got[layout] for got in ranks]
        if world == 2:
            out["resume"] = [got["resume"] for got in ranks]
    return out


def _layouts():
    return [layout for world in sorted(LAYOUTS) for layout in LAYOUTS[world]]


def _cell(matrix, layout, rollout_tp, path, semantics="raw"):
    """Differing tokens, worst over the trainer's ranks, and the tokens compared."""
    key = matrix["cell_set"][(rollout_tp, path)]
    want = matrix["rollouts"][(rollout_tp, path)][semantics]
    reports = [compare(got["cells"][key][semantics], want, f"{layout} vs rollout TP{rollout_tp}")
               for got in matrix[layout]]
    return max(r.differing for r in reports), reports[0].total, reports


def _table(matrix, path, semantics="raw") -> str:
    head = "| trainer TP x CP x PP | " + " | ".join(f"rollout TP {p}" for p in ROLLOUT_TP) + " |"
    rows = [head, "|" + "---|" * (len(ROLLOUT_TP) + 1)]
    for layout in _layouts():
        tp, cp, pp = layout
        cells = [_cell(matrix, layout, p, path, semantics) for p in ROLLOUT_TP]
        rows.append(f"| {tp} x {cp} x {pp} | " + " | ".join(f"{d} / {n}" for d, n, _ in cells) + " |")
    return "\n".join(rows)


def test_layout_matrix_strict_zero_mismatches(matrix):
    """Every trainer layout x every rollout TP: trainer_vs_decode (raw) and its processed twin, 0
    mismatches on every rank."""
    print(f"\nstrict trainer_vs_decode, mismatches / tokens (worst rank):\n{_table(matrix, 'strict')}")
    print(f"\nstrict trainer_vs_decode_processed:\n{_table(matrix, 'strict', 'processed')}")
    for layout in _layouts():
        for p in ROLLOUT_TP:
            for semantics in ("raw", "processed"):
                _, _, reports = _cell(matrix, layout, p, "strict", semantics)
                for rank, report in enumerate(reports):
                    assert report.equal, f"{semantics}, trainer rank {rank}: {report}"


def test_layout_matrix_native_control(matrix):
    """The native path's cells, measured: plain torch GEMMs, SDPA and the backend's all-reduce, so
    whether a cell differs depends on this CPU's kernels (tests/negative.py)."""
    table = _table(matrix, "native")
    differing = sum(_cell(matrix, layout, p, "native")[0] for layout in _layouts() for p in ROLLOUT_TP)
    require_native_difference(differing, f"native trainer_vs_decode, mismatches / tokens:\n{table}\n"
                                         f"{differing} differing tokens over all cells")


def test_every_layout_trains_and_syncs(matrix):
    """One GRPO step per layout: its forward recomputes exactly what the rollout recorded (ratio 1), all
    of its ranks end with the same weights, the gradient norm agrees with TP 1 x CP 1 x PP 1 (gradient
    bits are outside the logprob contract: CP sums per-rank partials, so only closeness is claimed), and
    the weights it publishes, loaded into an engine, decode to what the trainer recomputes."""
    job = matrix["train_job"]
    base_norm = matrix[(1, 1, 1)][0]["stats"]["grad_norm"]
    before = build_model(preset("tiny"), seed=SEED).state_dict()
    prompts = [tuple(s[:p]) for s, p in zip(job["sequences"], job["prompt_lens"])]
    responses = [list(s[p:]) for s, p in zip(job["sequences"], job["prompt_lens"])]
    print("\ngradient norm of the step, by layout (TP x CP x PP): " + ", ".join(
        f"{tp}x{cp}x{pp} {matrix[(tp, cp, pp)][0]['stats']['grad_norm']:.9g}" for tp, cp, pp in _layouts()))
    for layout in _layouts():
        ranks = matrix[layout]
        for rank, got in enumerate(ranks):
            stats = got["stats"]
            assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0, (layout, stats)
            assert stats["mismatch_count"] == 0 and stats["ratio_mean"] == 1.0, (layout, rank, stats)
            assert_bitwise_equal(got["step_logprobs"], job["old"], f"{layout} rank {rank}: step forward")
            assert got["checksum"] == ranks[0]["checksum"], f"{layout}: rank {rank} holds other weights"
            assert abs(stats["grad_norm"] / base_norm - 1) < 1e-2, (layout, stats["grad_norm"], base_norm)
        after = ranks[0]["state_after"]
        assert any(not torch.equal(after[n], before[n]) for n in before if before[n].dim() == 2), layout
        engine = EmbeddedEngine(build_model(preset("tiny"), seed=SEED), STRICT)
        engine.load_weights(after, version=1)
        decoded = torch.cat(engine.replay(prompts, responses))
        for rank, got in enumerate(ranks):
            assert_bitwise_equal(got["logprobs_after"], decoded,
                                 f"{layout} rank {rank}: recompute after the step vs engine decode")


def test_context_parallel_checkpoint_resumes_bit_for_bit(matrix):
    """TP 1 x CP 2: each rank saves its own file; restored twice, the same step gives the same weights
    and statistics on every rank."""
    for rank, ((sum_a, stats_a), (sum_b, stats_b)) in enumerate(matrix["resume"]):
        assert stats_a == stats_b and sum_a == sum_b, f"CP rank {rank}: a resumed step differs"
        assert sum_a == matrix["resume"][0][0][0], f"CP rank {rank} holds other weights than rank 0"
