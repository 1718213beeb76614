"""H200 check: Megatron-core trainer logprobs == embedded-rollout decode logprobs, TP 1, bf16, qwen3-0.6b.

What: random-init Qwen3 at the qwen3-0.6b shape (seeded, identical on every machine), the embedded engine
generates a few sampled responses on the GPU recording each token's logprob (paged decode), and
rlkit's Megatron trainer (Megatron's GPTModel with rlkit's strict ModuleSpec) recomputes them over the
packed sequences. Strict: the two must be bitwise equal; native: the negative control. Two GEMM
diagnostics sit beside it, because Megatron's layout fuses what rlkit's Qwen3 keeps apart: the fused
QKV GEMM (N = (H + 2G) * D) vs separate q/k/v GEMMs, and the fused gate/up (fc1) GEMM vs gate and up,
on the same rows. The strict GEMM's CPU backend is column-invariant for shard widths >= 16; on a GPU the
torch reference calls cuBLAS per K chunk, whose kernel choice may depend on N: if the fused rows
differ, that is where a trainer/rollout mismatch starts.

Run on the lent H200 (Python 3.12, torch 2.11, no registry there: carry megatron-core as a wheel):
    # here, once (2.6 MB):
    pip download megatron-core==0.16.1 --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 -d shared/wheels
    # there (rlkit itself editable, offline):
    python3 -m pip install -q --no-deps --no-build-isolation -e .
    pip install --no-deps shared/wheels/megatron_core-0.16.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
    RLKIT_DATA=shared/data python lab/megatron_h200.py [--preset qwen3-0.6b] [--requests 8] [--max-tokens 64]
(megatron-core needs torch, numpy and packaging, all present on the H200 image.)

Prints a table: check | tokens | mismatches | max |delta| | seconds, and exits non-zero when the strict
row mismatches.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from rlkit import NumericsContract, ops
from rlkit.bitwise import compare
from rlkit.model import build_model, preset
from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
from rlkit.rollout.types import GenerationRequest
from rlkit.train.megatron import MegatronTrainConfig, MegatronTrainer, convert
from rlkit.types import SamplingParams


def requests(n: int, max_tokens: int, vocab: int) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        plen = int(torch.randint(4, 48, (1,), generator=g))
        prompt = tuple(torch.randint(0, vocab, (plen,), generator=g).tolist())
        sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i, stop_token_ids=())
        out.append(GenerationRequest(f"h200-{i}", prompt, sampling, logprobs_mode="raw"))
    return out


def fused_gemm_rows(model, cfg, contract: NumericsContract, device) -> list[tuple[str, int, int, float]]:
    """(name, elements, differing, max |delta|) for fused vs separate GEMMs of layer 0, 37 rows."""
    hf = {k: v for k, v in model.state_dict().items() if k.startswith("model.layers.0.")}
    meg = convert.hf_to_megatron({**hf, "model.embed_tokens.weight": model.model.embed_tokens.weight,
                                  "model.norm.weight": model.model.norm.weight},
                                 dataclasses.replace(cfg, num_hidden_layers=1))
    x = torch.randn(37, cfg.hidden_size, generator=torch.Generator().manual_seed(3)).to(cfg.torch_dtype).to(device)
    rows = []
    with ops.use_contract(contract), torch.no_grad():
        fused = ops.linear(x, meg["decoder.layers.0.self_attention.linear_qkv.weight"])
        q, k, v = convert.split_qkv(fused.T, cfg)  # columns of the fused output, back in q/k/v order
        sep = [ops.linear(x, hf[f"model.layers.0.self_attn.{p}_proj.weight"]) for p in "qkv"]
        for name, a, b in (("qkv fused vs q", q.T, sep[0]), ("qkv fused vs k", k.T, sep[1]),
                           ("qkv fused vs v", v.T, sep[2])):
            r = compare(a.contiguous(), b, name)
            rows.append((name, r.total, r.differing, r.max_abs_diff))
        fc1 = ops.linear(x, meg["decoder.layers.0.mlp.linear_fc1.weight"])
        gate, up = fc1.chunk(2, dim=-1)
        for name, a, p in (("fc1 fused vs gate", gate, "gate"), ("fc1 fused vs up", up, "up")):
            r = compare(a.contiguous(), ops.linear(x, hf[f"model.layers.0.mlp.{p}_proj.weight"]), name)
            rows.append((name, r.total, r.differing, r.max_abs_diff))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = preset(args.preset).with_dtype(args.dtype)
    print(f"# {cfg.name} {cfg.dtype} on {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, TF32 matmul={torch.backends.cuda.matmul.allow_tf32}")
    t0 = time.time()
    model = build_model(cfg, seed=0, device=device)
    reqs = requests(args.requests, args.max_tokens, cfg.vocab_size)
    trainer = MegatronTrainer(cfg, model.state_dict(), NumericsContract.default(),
                              MegatronTrainConfig(tp=1, pp=1), device=device)
    print(f"# built rlkit Qwen3 + Megatron GPTModel in {time.time() - t0:.1f} s")
    table = []
    for name, contract in (("strict", NumericsContract.default()), ("native", NumericsContract.native())):
        t0 = time.time()
        engine = EmbeddedEngine(model, contract, EngineConfig(max_model_len=args.max_tokens + 64))
        results = engine.generate(reqs)
        t_gen = time.time() - t0
        seqs = [list(r.prompt_ids) + r.token_ids for r in results]
        plens = [len(r.prompt_ids) for r in results]
        trainer.contract = contract
        t0 = time.time()
        got = torch.cat(trainer.response_logprobs(seqs, plens))
        t_rec = time.time() - t0
        recorded = torch.cat([torch.tensor(r.raw_logprobs, dtype=torch.float32) for r in results])
        rep = compare(got.cpu(), recorded, f"{name}: Megatron TP1 recompute vs engine decode")
        table.append((f"{name} logprobs (Megatron vs decode)", rep.total, rep.differing, rep.max_abs_diff,
                      f"gen {t_gen:.1f} / recompute {t_rec:.1f}"))
        if rep.differing:
            print(rep)
    for row in fused_gemm_rows(model, cfg, NumericsContract.default(), device):
        table.append((f"strict GEMM {row[0]}", row[1], row[2], row[3], ""))
    print(f"\n| {'check':<44} | {'tokens/elems':>12} | {'mismatches':>10} | {'max |delta|':>11} | seconds")
    print(f"|{'-' * 46}|{'-' * 14}|{'-' * 12}|{'-' * 13}|---------")
    for check, n, bad, delta, secs in table:
        print(f"| {check:<44} | {n:>12} | {bad:>10} | {delta:>11.3g} | {secs}")
    return 1 if table[0][2] else 0


if __name__ == "__main__":
    sys.exit(main())
