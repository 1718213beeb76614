"""Where the embedded engine's time goes on the CPU at a learning run's decode batch: 256 requests of the
tiny preset (fp32, 20-token prompts, 40 new tokens at temperature 1) through `EmbeddedEngine.generate`
under cProfile; prints the wall time and the 25 functions with the most time of their own. A measurement
for lab/LOG.md, not a test.

    .venv/bin/python lab/profile_engine_cpu.py [--requests 256] [--tokens 40]
    .venv/bin/python lab/profile_engine_cpu.py --host    # the engine's own host work a decode step

With --host the model is the tiny preset cut to one layer, hidden 32 and a 256-entry vocabulary, and decode
runs through the GPU's path (`DecodeGraphs`' static buffers, eager: capture=False), so the model's
arithmetic is small and what is left is the engine's Python: scheduling, the buffers' fill, sampling's
launches, bookkeeping. Per decode step that is the time a GPU waits for the host between graph replays.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import time

import torch

from rlkit.contract import NumericsContract
from rlkit.model import build_model, preset
from rlkit.rollout.decode_graphs import DecodeGraphs
from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
from rlkit.rollout.types import GenerationRequest
from rlkit.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--host", action="store_true", help="a model of negligible arithmetic, the GPU's decode path")
    a = ap.parse_args()
    torch.set_num_threads(2)
    config = preset("tiny").with_dtype("float32")
    if a.host:
        config = dataclasses.replace(config, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=256)
    model = build_model(config, seed=0)
    length = 20 + a.tokens
    pages = -(-length // 16)
    engine = EmbeddedEngine(model, NumericsContract(), EngineConfig(
        page_size=16, num_pages=a.requests * pages + 8, max_num_seqs=a.requests, max_batch_tokens=16384,
        max_model_len=pages * 16))
    if a.host:
        engine.graphs = DecodeGraphs(model, engine.cache, a.requests, pages * 16, capture=False)
    sampling = SamplingParams(max_tokens=a.tokens, seed=1, temperature=1.0)
    requests = [GenerationRequest(f"r{i}", list(range(10, 30)), sampling) for i in range(a.requests)]
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    engine.generate(requests)
    prof.disable()
    wall = time.perf_counter() - t0
    print(f"{a.requests} requests x {a.tokens} tokens: {wall:.2f} s (profiled), {wall / a.tokens * 1e3:.1f} ms a step")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
