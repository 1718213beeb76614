"""Every two-GPU check of issue 18 in one device call: trainer CP 2 and trainer TP 2 against rollout TP 1
and TP 2 over NCCL, and a short Ray-placed RL run with a CP-2 trainer.

Phase `layouts` (two processes, one a GPU, NCCL; the `--model` shape, default qwen3-1.7b, random bf16
weights drawn on each GPU from one seed, identical on both):
1. rollouts, strict and native: rlkit's embedded engine at TP 2 (sharded over both GPUs,
   rlkit/model/parallel.py; eager decode) and at TP 1 on GPU 0 (decode from CUDA graphs) sample the same
   `--requests` requests (random prompts of 8-199 tokens, `--max-tokens` new tokens each) plus a 2-token
   prompt with one new token (a 3-token sequence, shorter than the four chunks CP 2 cuts it into),
   temperature 0.9, top-p 0.95, recording raw and processed logprobs. Checks: strict TP 2 == TP 1 (the
   same tokens, logprobs bit for bit), and both TP-2 ranks sampled the same tokens; native measured beside;
2. the Megatron trainer (Megatron-core's GPTModel with rlkit's strict spec) at TP 2 x CP 1 x PP 1 and
   TP 1 x CP 2 x PP 1 (`--layouts`; 1x1x2 can be added) recomputes every rollout's sequences. A cell is
   `trainer_vs_decode`: the logprobs the rollout recorded while decoding against the trainer's recompute
   of the same sequences, torch.equal on every trainer rank (the table shows the worst rank; the JSON has
   each rank's count, max |delta| and first differing values). Strict: 0 in every cell, raw and
   processed. The native path's cells are the control beside it (they differ).
Prints the tables as tests/train/test_layout_matrix.py does; writes $OUT/layouts-2gpu.json.

Phase `ray`: the RL loop (rlkit/loop.py, what `rlkit run --runner ray --trainer megatron --trainer-cp 2
--rollout-tp 2` runs) with a Megatron trainer of TP 1 x CP 2 (two actors) and one rollout engine of TP
`--ray-rollout-tp` (default 2: two actors), placed over the two GPUs by rlkit/runners/placement.py (one
trainer rank and one engine rank a GPU, each actor pinned through a placement-group bundle, half a GPU
each), `--ray-steps` strict steps at the `--ray-model` shape (default qwen3-0.6b, so both phases fit one
10-minute call; arith task, 4 prompts x 4 samples, 64-token responses, ASCII shaping so the weights
move). Per step: compared tokens, mismatch_count (0 required), max |delta|; every sync acknowledged;
the Ray GPU ids each rank ran on (the trainer's ranks on distinct GPUs, the engine's too). Writes
$OUT/ray-cp2.json.

Exit status 0 when every strict check of every phase run holds; 1 otherwise (a phase that raised too).

--dry-run: the same code on the CPU: gloo instead of NCCL, the tiny preset (bf16, as the gloo layout
matrix), 4 requests of 8 new tokens; the Ray phase in fp32 (2 steps of 2 prompts x 2 samples, 4 tokens)
on a local Ray cluster that declares two GPUs (nothing computes on them: the placement is what it
exercises). tests/train/test_layouts_2gpu_dry_run.py runs it.

On `nvidia-h200-x2`, one call. First, here, once (the carry folder is git-ignored):
    .venv/bin/python lab/device_carry.py build      # .thirdparty/device/: slim Ray, wheels, data
(2 min here; 28.6 MiB, with the tracked files 48.7 MiB of the 64 MiB a call sends), then the device
tool's `run` with kind "nvidia-h200-x2", carry [".thirdparty/device"], timeout_s 600:
    set -o pipefail; python3 -m pip install -q --no-deps --no-build-isolation -e . &&
    python3 lab/device_carry.py install /tmp/site &&
    PYTHONPATH=/tmp/site RLKIT_DATA=.thirdparty/device/data PYTHONUNBUFFERED=1
    python3 lab/layouts_2gpu.py --out $OUT 2>&1 | tee $OUT/layouts-2gpu.log
(`--phases layouts` or `--phases ray` splits it over two calls.) NVLink multicast stays off: the three
variables below are set before anything starts, so the ranks and Ray's workers inherit them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[var] = value  # NVLink multicast stays off (the machine's documentation), also in children

SEED = 1234
SAMPLING = dict(temperature=0.9, top_p=0.95)
"""As the gloo layout matrix: processed logprobs differ from raw ones."""
ROLLOUT_TP = (1, 2)
PATHS = ("strict", "native")
DEFAULT_LAYOUTS = "2x1x1,1x2x1"
"""Trainer (TP x CP x PP) layouts of two ranks: the issue's TP 2 and CP 2."""


# -- phase `layouts`: one process a GPU ---------------------------------------------------------------
def _requests(n: int, max_tokens: int):
    from rlkit.rollout.types import GenerationRequest
    from rlkit.types import SamplingParams

    g = torch.Generator().manual_seed(5)
    lens = [int(torch.randint(8, 200, (1,), generator=g)) for _ in range(n)]
    shapes = [(n_prompt, max_tokens) for n_prompt in lens] + [(2, 1)]  # the short one: 3 tokens in all
    return [GenerationRequest(f"r{i}", tuple(torch.randint(0, 151_000, (p,), generator=g).tolist()),
                              SamplingParams(max_tokens=m, seed=i, stop_token_ids=(), **SAMPLING),
                              logprobs_mode="both")
            for i, (p, m) in enumerate(shapes)]


def _record(results) -> dict:
    assert all(r.ok for r in results), [r.error for r in results]
    return {"tokens": [list(r.token_ids) for r in results],
            "sequences": [list(r.prompt_ids) + list(r.token_ids) for r in results],
            "prompt_lens": [len(r.prompt_ids) for r in results],
            "raw": torch.cat([torch.tensor(r.raw_logprobs, dtype=torch.float32) for r in results]),
            "processed": torch.cat([torch.tensor(r.processed_logprobs, dtype=torch.float32) for r in results])}


def _free(dev) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _rollouts(rank: int, full, reqs, dev) -> tuple[dict, bool]:
    """{(rollout TP, path): record} as rank 0 recorded them, on both ranks; and whether both TP-2 ranks
    sampled the same tokens."""
    from rlkit import NumericsContract
    from rlkit.model.parallel import TensorParallel
    from rlkit.model.qwen3 import Qwen3ForCausalLM
    from rlkit.rollout.engine import EmbeddedEngine, EngineConfig

    with torch.device(dev):
        shard = Qwen3ForCausalLM(full.config, TensorParallel(2, rank, dist.group.WORLD)).eval()
    shard.load_state_dict(shard.shard(full.state_dict()))
    engine_cfg = EngineConfig(num_pages=4096, max_num_seqs=len(reqs), max_batch_tokens=4096, max_model_len=1024)
    out = {}
    for path in PATHS:
        contract = NumericsContract.default() if path == "strict" else NumericsContract.native()
        out[(2, path)] = _record(EmbeddedEngine(shard, contract, engine_cfg).generate(reqs))
        if rank == 0:
            out[(1, path)] = _record(EmbeddedEngine(full, contract, engine_cfg).generate(reqs))
        _free(dev)
    del shard
    _free(dev)
    mine = {path: out[(2, path)]["tokens"] for path in PATHS}
    shared = [out]
    dist.broadcast_object_list(shared, src=0)
    same = all(mine[p] == shared[0][(2, p)]["tokens"] for p in PATHS)
    return shared[0], same


def _trainer_cells(layout, cfg, hf_state, dev, rollouts) -> dict:
    """One trainer layout's recompute of every rollout's sequences, compared on this rank:
    {(rollout TP, path, semantics): report}."""
    from megatron.core import parallel_state

    from rlkit import NumericsContract
    from rlkit.bitwise import compare
    from rlkit.train.megatron import MegatronTrainConfig, MegatronTrainer
    from rlkit.types import SamplingParams

    tp, cp, pp = layout
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()  # the next layout regroups the same two ranks
    tr = MegatronTrainer(cfg, hf_state, NumericsContract.default(), MegatronTrainConfig(tp=tp, pp=pp, cp=cp),
                         device=dev)
    got = {}  # (path, sequences) -> {semantics: logprobs}: identical sequence sets are recomputed once
    for (rollout_tp, path), rec in rollouts.items():
        key = (path, tuple(map(tuple, rec["sequences"])))
        if key in got:
            continue
        tr.set_contract(NumericsContract.default() if path == "strict" else NumericsContract.native())
        seqs, plens = rec["sequences"], rec["prompt_lens"]
        got[key] = {"raw": torch.cat([x.cpu() for x in tr.response_logprobs(seqs, plens)])}
        if path == "strict":
            params = [SamplingParams(**SAMPLING)] * len(seqs)
            got[key]["processed"] = torch.cat([x.cpu() for x in tr.response_logprobs(seqs, plens, params)])
    del tr
    _free(dev)
    cells = {}
    for (rollout_tp, path), rec in rollouts.items():
        key = (path, tuple(map(tuple, rec["sequences"])))
        for semantics in got[key]:
            rep = compare(got[key][semantics], rec[semantics],
                          f"trainer {tp}x{cp}x{pp} vs rollout TP{rollout_tp} ({path}, {semantics})")
            cells[(rollout_tp, path, semantics)] = {"differing": rep.differing, "tokens": rep.total,
                                                    "max_abs_diff": rep.max_abs_diff, "first": rep.first}
    return cells


def _table(layouts, cells, path: str, semantics: str) -> str:
    rows = ["| trainer TP x CP x PP | " + " | ".join(f"rollout TP {p}" for p in ROLLOUT_TP) + " |",
            "|" + "---|" * (len(ROLLOUT_TP) + 1)]
    for layout in layouts:
        per_rank = cells[layout]
        shown = []
        for p in ROLLOUT_TP:
            reports = [c[(p, path, semantics)] for c in per_rank]
            shown.append(f"{max(r['differing'] for r in reports)} / {reports[0]['tokens']}")
        rows.append(f"| {' x '.join(map(str, layout))} | " + " | ".join(shown) + " |")
    return "\n".join(rows)


def run_rank(rank: int, world: int, port: int, args) -> None:
    from rlkit.bitwise import compare
    from rlkit.distributed import join_group
    from rlkit.model.config import preset
    from rlkit.model.qwen3 import build_model_on_device

    started = time.time()
    if args.dry_run:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
    else:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    join_group(dev.type, rank, world, port)
    cfg = preset(args.model)
    full = build_model_on_device(cfg, SEED, dev).eval()
    reqs = _requests(args.requests, args.max_tokens)
    timings = {"setup_s": time.time() - started}
    t = time.time()
    rollouts, ranks_agree = _rollouts(rank, full, reqs, dev)
    timings["rollouts_s"] = time.time() - t
    hf_state = full.state_dict()
    cells = {}
    for layout in args.layouts:
        t = time.time()
        cells[layout] = _trainer_cells(layout, cfg, hf_state, dev, rollouts)
        timings[f"trainer_{'x'.join(map(str, layout))}_s"] = time.time() - t
    gathered = [None] * world
    dist.all_gather_object(gathered, {"cells": cells, "timings": timings})
    if rank == 0:
        checks = [{"check": "rollout TP2: both ranks sampled the same tokens (strict and native)",
                   "ok": ranks_agree}]
        for path in PATHS:
            one, two = rollouts[(1, path)], rollouts[(2, path)]
            same = sum(a == b for a, b in zip(one["tokens"], two["tokens"]))
            row = {"check": f"{path}: rollout TP2 vs rollout TP1", "requests_same_tokens": same,
                   "requests": len(reqs), "tokens": int(one["raw"].numel())}
            for semantics in ("raw", "processed"):
                rep = compare(two[semantics], one[semantics]) if one["tokens"] == two["tokens"] else None
                row[f"mismatch_{semantics}"] = None if rep is None else rep.differing
                row[f"max_abs_diff_{semantics}"] = None if rep is None else rep.max_abs_diff
            if path == "strict":
                row["ok"] = same == len(reqs) and row["mismatch_raw"] == 0 and row["mismatch_processed"] == 0
            checks.append(row)
        by_layout = {layout: [g["cells"][layout] for g in gathered] for layout in args.layouts}
        out_cells = []
        for layout in args.layouts:
            for (p, path, semantics) in by_layout[layout][0]:
                ranks = [c[(p, path, semantics)] for c in by_layout[layout]]
                out_cells.append({"trainer": "x".join(map(str, layout)), "rollout_tp": p, "path": path,
                                  "semantics": semantics, "tokens": ranks[0]["tokens"],
                                  "worst_differing": max(r["differing"] for r in ranks), "ranks": ranks})
        tables = {"strict_raw": _table(args.layouts, by_layout, "strict", "raw"),
                  "strict_processed": _table(args.layouts, by_layout, "strict", "processed"),
                  "native_raw": _table(args.layouts, by_layout, "native", "raw")}
        strict_ok = all(c["worst_differing"] == 0 for c in out_cells if c["path"] == "strict")
        native_differing = sum(c["worst_differing"] for c in out_cells if c["path"] == "native")
        result = {"phase": "layouts", "model": args.model, "device": str(dev.type),
                  "dtype": str(cfg.dtype), "requests": len(reqs), "max_tokens": args.max_tokens,
                  "sampling": SAMPLING, "layouts": ["x".join(map(str, x)) for x in args.layouts],
                  "checks": checks, "cells": out_cells, "tables": tables,
                  "native_differing_tokens": native_differing,
                  "ok": strict_ok and all(c.get("ok", True) for c in checks),
                  "timings": [g["timings"] for g in gathered]}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "layouts-2gpu.json").write_text(json.dumps(result, indent=2))
        for c in checks:
            print(json.dumps(c), flush=True)
        print(f"\nstrict trainer_vs_decode (raw), mismatches / tokens (worst rank), {args.model}:\n"
              f"{tables['strict_raw']}\n\nstrict trainer_vs_decode_processed:\n{tables['strict_processed']}\n\n"
              f"native trainer_vs_decode (raw; the control):\n{tables['native_raw']}\n"
              f"\nlayouts phase: {'ok' if result['ok'] else 'FAILED'}; native control: {native_differing} "
              f"differing tokens over all cells; rank 0 timings {json.dumps(timings)}", flush=True)
    dist.destroy_process_group()


def layouts_phase(args) -> bool:
    from rlkit.distributed import free_port

    mp.start_processes(run_rank, args=(2, free_port(), args), nprocs=2, join=True, start_method="spawn")
    return json.loads((Path(args.out) / "layouts-2gpu.json").read_text())["ok"]


# -- phase `ray`: the RL loop with the RayRunner ------------------------------------------------------
def ray_config(args):
    from rlkit.config import RunConfig
    from rlkit.rollout.engine import EngineConfig
    from rlkit.train.trainer import OptimConfig

    common = dict(task="arith", runner="ray", trainer="megatron", trainer_cp=2, rollout_tp=args.ray_rollout_tp,
                  engines=1, shaping=0.1, warm_start_steps=0, checkpoint_every=0, locate_every=1, seed=SEED)
    if args.dry_run:
        return RunConfig(model="tiny", dtype="float32", device="cpu", steps=args.ray_steps, prompts_per_step=2,
                         samples_per_prompt=2, max_tokens=4, threads=1, optim=OptimConfig(lr=1e-3),
                         engine=EngineConfig(max_num_seqs=16, max_batch_tokens=512, num_pages=128), **common)
    return RunConfig(model=args.ray_model, dtype="bfloat16", device="cuda", steps=args.ray_steps,
                     prompts_per_step=4, samples_per_prompt=4, max_tokens=64, optim=OptimConfig(lr=1e-5),
                     engine=EngineConfig(page_size=16, num_pages=2048, max_num_seqs=16, max_batch_tokens=4096,
                                         max_model_len=1024), **common)


def ray_phase(args) -> bool:
    import ray

    from rlkit import loop

    cfg = ray_config(args)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # dry run: two GPUs declared, none used, so the placement runs as on the device
    init = dict(num_cpus=4, num_gpus=2) if args.dry_run else {}
    kw = {"gpus": 2, "num_cpus_per_actor": 0.5} if args.dry_run else {}
    for attempt in (1, 2):  # Ray's node start can time out on a loaded machine (lab/LOG.md): once more
        try:
            ray.init(include_dashboard=False, log_to_driver=False, **init)
            break
        except Exception as exc:  # noqa: BLE001 - Ray raises a plain Exception for it
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            print(f"ray.init: {exc}; starting it again", flush=True)
            ray.shutdown()
    work = Path(args.work or tempfile.mkdtemp(prefix="layouts-2gpu-")) / "ray-cp2"
    started = time.time()
    try:
        store = loop.run(work, cfg, progress=False, runner_kwargs=kw)
    finally:
        ray.shutdown()
    steps = store.steps()
    placement = store.info("placement") or {}
    ids = placement.get("ray_gpu_ids", {})
    distinct = {name: len({tuple(r) for r in ranks}) == len(ranks) for name, ranks in ids.items()}
    rows = [{"step": s.step, "compared_tokens": s.compared_tokens, "mismatch": s.mismatch_count,
             "max_abs_diff": s.max_abs_diff, "reward_mean": s.reward_mean, "loss": s.loss,
             "ratio_min": s.ratio_min, "ratio_max": s.ratio_max} for s in steps]
    syncs = store.syncs()
    checksums = [v.checksum for v in store.versions()]
    ok = (len(rows) == cfg.steps and all(r["mismatch"] == 0 and r["compared_tokens"] > 0 for r in rows)
          and all(s.ok for s in syncs) and bool(ids) and all(distinct.values()))
    result = {"phase": "ray", "config": cfg.to_dict(),
              "steps": rows, "syncs": len(syncs), "syncs_ok": all(s.ok for s in syncs),
              "distinct_weight_checksums": len(set(checksums)), "versions": len(checksums),
              "placement": placement, "ranks_on_distinct_gpus": distinct, "ok": ok,
              "seconds": time.time() - started, "run_dir": str(work)}
    store.close()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ray-cp2.json").write_text(json.dumps(result, indent=2))
    print(f"\nRay run: Megatron TP 1 x CP 2 trainer + one rollout engine of TP {cfg.rollout_tp}, {cfg.model}, "
          f"{cfg.device}; placement {json.dumps(ids)} (share {placement.get('share')})", flush=True)
    for r in rows:
        print(f"step {r['step']}: {r['mismatch']} / {r['compared_tokens']} tokens mismatch, max |d| "
              f"{r['max_abs_diff']}, reward {r['reward_mean']:.3f}, ratio {r['ratio_min']}..{r['ratio_max']}",
              flush=True)
    print(f"syncs {len(syncs)} all acknowledged: {result['syncs_ok']}; distinct weight checksums "
          f"{len(set(checksums))} of {len(checksums)} versions; ray phase: {'ok' if ok else 'FAILED'} "
          f"in {result['seconds']:.0f} s", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", default="layouts,ray", help="comma-separated: layouts, ray (default both)")
    ap.add_argument("--model", help="phase layouts' model preset (default qwen3-1.7b; tiny with --dry-run)")
    ap.add_argument("--requests", type=int, help="sampled requests besides the short one (default 16; 4)")
    ap.add_argument("--max-tokens", type=int, help="new tokens a request (default 128; 8)")
    ap.add_argument("--layouts", default=DEFAULT_LAYOUTS, help=f"trainer TPxCPxPP of two ranks (default "
                                                                f"{DEFAULT_LAYOUTS}; 1x1x2 also runs)")
    ap.add_argument("--ray-model", default="qwen3-0.6b", help="phase ray's model preset (tiny with --dry-run)")
    ap.add_argument("--ray-steps", type=int, help="RL steps of phase ray (default 3; 2)")
    ap.add_argument("--ray-rollout-tp", type=int, default=2, choices=[1, 2])
    ap.add_argument("--work", help="where phase ray's run store goes (default a new folder under /tmp)")
    ap.add_argument("--dry-run", action="store_true", help="the same code on the CPU (gloo, tiny preset)")
    ap.add_argument("--device", choices=["cuda", "cpu"], help="cpu: as --dry-run (older spelling)")
    args = ap.parse_args()
    args.dry_run = args.dry_run or args.device == "cpu"
    dry = args.dry_run
    args.model = args.model or ("tiny" if dry else "qwen3-1.7b")
    args.requests = args.requests or (4 if dry else 16)
    args.max_tokens = args.max_tokens or (8 if dry else 128)
    args.ray_steps = args.ray_steps or (2 if dry else 3)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or any(p not in ("layouts", "ray") for p in phases):
        ap.error(f"--phases {args.phases!r}: choose from layouts, ray")
    try:
        args.layouts = [tuple(int(x) for x in s.split("x")) for s in args.layouts.split(",")]
    except ValueError:
        ap.error(f"--layouts {args.layouts!r}: e.g. 2x1x1,1x2x1")
    bad = [x for x in args.layouts if len(x) != 3 or x[0] * x[1] * x[2] != 2]
    if bad:
        ap.error(f"--layouts: each TPxCPxPP must have two ranks in all, got {bad}")
    if not dry and torch.cuda.device_count() < 2:
        print(f"needs 2 GPUs, found {torch.cuda.device_count()} (--dry-run runs it on the CPU)")
        return 2
    ok = True
    for phase in phases:
        started = time.time()
        try:
            passed = layouts_phase(args) if phase == "layouts" else ray_phase(args)
        except Exception:  # noqa: BLE001 - the next phase still runs; the exit status says it failed
            traceback.print_exc()
            passed = False
        print(f"phase {phase}: {'ok' if passed else 'FAILED'} ({time.time() - started:.0f} s)", flush=True)
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
