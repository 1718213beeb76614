"""Forward parity at the qwen3-8b shape on one H200: what the rollout engine recorded while decoding vs
what the trainer recomputes, over >= 100,000 response tokens, strict path; the native path as control.

The model is Qwen3-8B's real dimensions (36 layers, hidden 4096, 32/8 heads, vocab 151,936, untied
lm_head) with seeded random bf16 weights drawn on the GPU (std 0.02, norms 1). Prompts are
DAPO-Math-17k problems in DAPO's template and Qwen3's chat template. The engine generates
`--requests` responses of `--max-tokens` tokens each (temperature 1.0, decode replayed from CUDA
graphs) and records every token's logprob; the trainer recomputes all of them in packed full-sequence
forwards (longest-first packs of `--pack-tokens`). Strict: every logprob must be equal bit for bit. The
native control runs a smaller batch through the same chain and reports its mismatches.

    python3 -m pip install -q --no-deps --no-build-isolation -e .   # once per fresh machine, offline
    RLKIT_DATA=.device_data python3 lab/parity_8b_h200.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from rlkit import NumericsContract, ops
from rlkit.data.tasks import task
from rlkit.divergence import logprob_divergence
from rlkit.model.config import preset
from rlkit.model.qwen3 import build_model_on_device
from rlkit.model.tokenizer import chat_prompt_ids, load_tokenizer
from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
from rlkit.rollout.types import GenerationRequest
from rlkit.train.recompute import response_logprobs
from rlkit.types import SamplingParams


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def chain(model, contract, prompts, max_tokens: int, pack_tokens: int, label: str) -> dict:
    n = len(prompts)
    longest = max(len(p) for p in prompts) + max_tokens
    page = 16
    cfg = EngineConfig(page_size=page, num_pages=n * (-(-longest // page)), max_num_seqs=n,
                       max_batch_tokens=8192, max_model_len=longest)
    engine = EmbeddedEngine(model, contract, cfg)
    sampling = SamplingParams(max_tokens=max_tokens, seed=1234, stop_token_ids=())
    reqs = [GenerationRequest(f"{label}-{i}", tuple(p), sampling) for i, p in enumerate(prompts)]
    sync()
    t0 = time.time()
    results = engine.generate(reqs)
    sync()
    t_gen = time.time() - t0
    errors = [r.error for r in results if not r.ok]
    if errors:
        raise RuntimeError(errors[0])
    t0 = time.time()
    with ops.use_contract(contract):
        trainer = response_logprobs(model, [r.prompt_ids + r.token_ids for r in results],
                                    [len(r.prompt_ids) for r in results], max_batch_tokens=pack_tokens)
    sync()
    t_train = time.time() - t0
    div = logprob_divergence([torch.tensor(r.raw_logprobs) for r in results], [t.cpu() for t in trainer])
    replays = engine.graphs.steps if engine.graphs is not None else 0
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    out = {"label": label, "contract": contract.fingerprint(), "requests": n, "max_tokens": max_tokens,
           **div.to_dict(), "generate_s": t_gen, "recompute_s": t_train, "graph_replays": replays}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="qwen3-8b")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--max-tokens", type=int, default=1100)
    ap.add_argument("--native-requests", type=int, default=16)
    ap.add_argument("--native-max-tokens", type=int, default=256)
    ap.add_argument("--pack-tokens", type=int, default=16384)
    ap.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test with --preset tiny)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = build_model_on_device(preset(a.preset), 1234, a.device).eval()
    tok = load_tokenizer()
    problems = task("dapo").problems(0, a.requests, 1234)
    prompts = [chat_prompt_ids(p.user_message(), tok) for p in problems]
    print(f"{a.preset}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, built in "
          f"{time.time() - t0:.0f} s; prompts {min(map(len, prompts))}-{max(map(len, prompts))} tokens", flush=True)
    rows = [chain(model, NumericsContract.default(), prompts, a.max_tokens, a.pack_tokens, "strict")]
    print(json.dumps(rows[-1]), flush=True)
    rows.append(chain(model, NumericsContract.native(), prompts[: a.native_requests], a.native_max_tokens,
                      a.pack_tokens, "native"))
    print(json.dumps(rows[-1]), flush=True)
    (out / "parity-8b.json").write_text(json.dumps({"preset": a.preset, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                                                    "torch": torch.__version__, "rows": rows}, indent=2))
    strict = rows[0]
    print(f"{a.preset} strict: {strict['compared_tokens']} compared tokens, {strict['mismatch_count']} mismatches, "
          f"max_abs_diff {strict['max_abs_diff']}; native control: {rows[1]['mismatch_count']}/"
          f"{rows[1]['compared_tokens']} mismatches, max_abs_diff {rows[1]['max_abs_diff']:.4g}", flush=True)
    return 0 if strict["mismatch_count"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
