"""Trainer TP != rollout TP on two GPUs (NCCL): the layout part of the 8-GPU issue that two GPUs can run.

On `nvidia-h200-x2`, one process a GPU, qwen3-0.6b shape, random bf16 weights drawn on each GPU from the
same seed (identical on both), strict contract unless said otherwise:
1. rollout TP 2: rlkit's embedded engine sharded over the two GPUs (rlkit/model/parallel.py; eager
   decode) generates `--requests` responses and records every token's logprob;
2. rollout TP 1 on GPU 0 (decode from CUDA graphs) generates the same requests: tokens and logprobs must
   equal TP 2's bit for bit;
3. a Megatron trainer at TP 2 over NCCL (Megatron's GPTModel with rlkit's strict spec) recomputes the
   TP-1 rollout's sequences: bit for bit what the TP-1 engine recorded (trainer TP 2 vs rollout TP 1),
   and the TP-2 rollout's (trainer TP 2 vs rollout TP 2);
4. native control: rollout TP 2 vs TP 1 on the native path.
Writes $OUT/layouts-2gpu.json and prints one line per check.

    python3 -m pip install -q --no-deps --no-build-isolation -e .   # rlkit itself, offline
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RLKIT_DATA=.device_data \
        python3 lab/layouts_2gpu.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[var] = value  # NVLink multicast stays off (the machine's documentation), also in children


def run_rank(rank: int, world: int, port: int, args) -> None:
    from rlkit import NumericsContract
    from rlkit.bitwise import compare
    from rlkit.distributed import join_group
    from rlkit.model.parallel import TensorParallel
    from rlkit.model.config import preset
    from rlkit.model.qwen3 import Qwen3ForCausalLM, build_model_on_device
    from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
    from rlkit.rollout.types import GenerationRequest
    from rlkit.types import SamplingParams

    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dev, cfg = torch.device("cuda", rank), preset("qwen3-0.6b")
    else:  # a smoke test of this script on the CPU (gloo, the tiny preset)
        torch.set_num_threads(1)
        dev, cfg = torch.device("cpu"), preset("tiny")
    join_group(args.device, rank, world, port)
    full = build_model_on_device(cfg, 1234, dev).eval()
    with torch.device(dev):
        shard = Qwen3ForCausalLM(cfg, TensorParallel(world, rank, dist.group.WORLD)).eval()
    shard.load_state_dict(shard.shard(full.state_dict()))
    g = torch.Generator().manual_seed(5)
    reqs = [GenerationRequest(f"r{i}", tuple(torch.randint(0, 151_000, (int(torch.randint(8, 200, (1,), generator=g)),),
                                                           generator=g).tolist()),
                              SamplingParams(max_tokens=args.max_tokens, seed=i, stop_token_ids=()))
            for i in range(args.requests)]
    engine_cfg = EngineConfig(num_pages=4096, max_num_seqs=args.requests, max_batch_tokens=4096, max_model_len=1024)
    rows, out = [], {}

    def record(results):
        return [r.token_ids for r in results], torch.cat([torch.tensor(r.raw_logprobs) for r in results])

    for path, contract in (("strict", NumericsContract.default()), ("native", NumericsContract.native())):
        out[("tp2", path)] = record(EmbeddedEngine(shard, contract, engine_cfg).generate(reqs))
        if rank == 0:
            out[("tp1", path)] = record(EmbeddedEngine(full, contract, engine_cfg).generate(reqs))
    if rank == 0:
        for path in ("strict", "native"):
            (tok2, lp2), (tok1, lp1) = out[("tp2", path)], out[("tp1", path)]
            same = sum(a == b for a, b in zip(tok1, tok2))
            rep = compare(lp2, lp1) if tok1 == tok2 else None
            rows.append({"check": f"{path}: rollout TP2 vs rollout TP1", "requests_same_tokens": same,
                         "tokens": int(lp1.numel()), "mismatch": None if rep is None else rep.differing,
                         "max_abs_diff": None if rep is None else rep.max_abs_diff})
    # the Megatron trainer at TP 2 recomputes the TP-1 rollout's and the TP-2 rollout's sequences
    from rlkit.train.megatron import MegatronTrainConfig, MegatronTrainer

    both = [out.get(("tp1", "strict")), out[("tp2", "strict")]]
    shared = [both[0][0] if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    trainer = MegatronTrainer(cfg, full.state_dict(), NumericsContract.default(), MegatronTrainConfig(tp=world),
                              device=dev)
    for label, tokens in (("rollout TP1", shared[0]), ("rollout TP2", out[("tp2", "strict")][0])):
        seqs = [list(r.prompt_ids) + t for r, t in zip(reqs, tokens)]
        lp = torch.cat([x.cpu() for x in trainer.response_logprobs(seqs, [len(r.prompt_ids) for r in reqs])])
        if rank == 0:
            want = both[0][1] if label == "rollout TP1" else both[1][1]
            rep = compare(lp, want)
            rows.append({"check": f"strict: Megatron trainer TP2 vs {label}", "tokens": int(want.numel()),
                         "mismatch": rep.differing, "max_abs_diff": rep.max_abs_diff})
    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "layouts-2gpu.json").write_text(json.dumps(rows, indent=2))
        for r in rows:
            print(json.dumps(r), flush=True)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"needs 2 GPUs, found {torch.cuda.device_count()}")
        return 2
    from rlkit.distributed import free_port

    mp.start_processes(run_rank, args=(2, free_port(), args), nprocs=2, join=True, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
