"""Where a step's strict/native gap lies, kernel family by family: one trainer step and a few decode
steps of the RL-step shapes, profiled apart (the whole loop under torch.profiler is too many events:
lab/LOG.md 2026-12-01 session 5, the profiled validation run did not finish in 166 s).

For each path (strict, native): a seeded model of the shape's preset, the trainer's `train_step` on a
batch of the shape (prompts x samples sequences of prompt + response tokens, random ids, GRPO advantages
of +-1) once to compile, then under torch.profiler; and the embedded engine generating `--decode-tokens`
tokens for the same number of requests (CUDA graphs as in a run), once to capture, then profiled.
Writes OUT/profile-SHAPE-PART-PATH.txt (kernels by device time, per family and per kernel: the report of
lab/rl_step_ratio_h200.py) and OUT/profile_step.jsonl (long-format rows: the wall time of each part and
each family's device ms), and prints a family table strict vs native last. Nothing asserts.

    python3 lab/profile_step_h200.py --out $OUT [--shape validation] [--decode-tokens 64]
    python3 lab/profile_step_h200.py --out $OUT --shape learning --no-profile --parts train,prefill,decode \
        --micro-batch-tokens 8192,16384,32768    # wall and peak memory only, each micro-batch size
With --no-profile each part runs once untimed, then --repeat times timed (rows: the median wall and the peak
GiB allocated); `prefill` is the prompts and one token, so decode minus prefill is the decode steps alone.
    python lab/profile_step_h200.py --dry-run --out /tmp/prof      # CPU, tiny preset
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rl_step_ratio_h200 import FAMILIES, profile_report, release_gpu_memory, step_shapes, timed_events  # lab/ is this folder
from rlkit.bench.provenance import commit
from rlkit.rollout.engine import EmbeddedEngine
from rlkit.rollout.types import GenerationRequest
from rlkit.runners.base import engine_copy, seeded_model
from rlkit.train.trainer import EmbeddedTrainer, TrainBatch


def family_ms(prof) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, ms, _ in timed_events(prof):
        if ms > 0:
            fam = next((f for sub, f in FAMILIES if sub.lower() in key.lower()), "other")
            out[fam] = out.get(fam, 0.0) + ms
    return out


PROMPT_TOKENS = {"learning": 95}
"""Prompt length by shape (add9c's prompts are 95 tokens); others 143, the validation run's mean DAPO prompt
(its store)."""


def batch_of(cfg, vocab: int, gen: torch.Generator, plen: int = 143) -> TrainBatch:
    n = cfg.prompts_per_step * cfg.samples_per_prompt
    rlen = cfg.max_tokens or 16
    seqs = [torch.randint(0, vocab, (plen + rlen,), generator=gen).tolist() for _ in range(n)]
    return TrainBatch(seqs, [plen] * n, [torch.full((rlen,), -1.0) for _ in range(n)],
                      [1.0 if i % 2 else -1.0 for i in range(n)], cfg.sampling_params)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_part(fn, acts, label: str):
    """(the profiler run, its wall s); first the part once to compile, capture and warm the allocator,
    then once timed without the profiler, printed before profiling (a profile of many host events can
    take longer than the call has left: seen on the H200 with 256 sequences x 96 decode steps)."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    print(f"{label}: unprofiled wall {time.perf_counter() - t0:.3f} s", flush=True)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        sync()
    return prof, time.perf_counter() - t0


def timed_part(fn, repeat: int) -> tuple[list[float], float]:
    """Wall seconds of `repeat` runs of `fn` after one untimed run, and the peak GiB allocated over them."""
    fn()
    sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        walls.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    return walls, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="validation")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--paths", default="strict,native", help="which paths to profile")
    ap.add_argument("--parts", default="train,decode",
                    help="which parts to profile: train, decode (prefill + --decode-tokens), prefill (the "
                         "prompts and one token)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny preset")
    ap.add_argument("--micro-batch-tokens", default="",
                    help="comma list: run each part once a value, the trainer's micro-batch and pack size set "
                         "to it (default: the shape's own)")
    ap.add_argument("--no-profile", action="store_true",
                    help="time each part --repeat times without the profiler (wall and peak memory) instead")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs a part with --no-profile")
    a = ap.parse_args()
    shapes = step_shapes(a.dry_run)
    if a.shape not in shapes:
        print(f"--shape: unknown {a.shape!r}; choose from {', '.join(shapes)}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    device = "cpu (dry run)" if a.dry_run else torch.cuda.get_device_name()
    sha, rows, fams = commit(), [], {}
    paths, parts = a.paths.split(","), a.parts.split(",")
    if set(paths) - {"strict", "native"} or set(parts) - {"train", "decode", "prefill"}:
        print(f"--paths {a.paths} / --parts {a.parts}: expected strict,native / train,decode,prefill",
              file=sys.stderr)
        return 2
    micro = [int(x) for x in a.micro_batch_tokens.split(",") if x] or [None]
    for path, mbt in ((p, m) for p in paths for m in micro):
        cfg = shapes[a.shape].replace(path=path).with_resolved_dtype()[0]
        if mbt:
            cfg = cfg.replace(optim=dataclasses.replace(cfg.optim, micro_batch_tokens=mbt, max_batch_tokens=mbt))
        label = path if mbt is None else f"{path} mbt={mbt}"
        if cfg.threads:  # 0: torch's default
            torch.set_num_threads(cfg.threads)
        contract = cfg.contract()
        model = seeded_model(cfg)
        gen = torch.Generator().manual_seed(cfg.seed)
        trainer = EmbeddedTrainer(model, contract, cfg.optim)
        plen = PROMPT_TOKENS.get(a.shape, 143)
        batch = batch_of(cfg, model.config.vocab_size, gen, plen)
        engine = EmbeddedEngine(engine_copy(model), contract, cfg.engine)
        sampling = dataclasses.replace(cfg.sampling(), max_tokens=a.decode_tokens)
        prompts = [tuple(s[:plen]) for s in batch.sequences]

        def decode(params=sampling) -> None:
            engine.generate([GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts)])

        first_token = dataclasses.replace(sampling, max_tokens=1)
        for part, fn in (("train", lambda: trainer.train_step(batch)), ("decode", decode),
                         ("prefill", lambda: decode(first_token))):
            if part not in parts:
                continue
            if a.no_profile:
                walls, peak = timed_part(fn, a.repeat)
                print(f"{part} {label}: wall {' '.join(f'{w:.3f}' for w in walls)} s, peak {peak:.1f} GiB",
                      flush=True)
                rows.append(dict(op="profile_step", impl=path, shape=f"{a.shape} {part}", metric="wall_ms",
                                 median=statistics.median(walls) * 1e3, micro_batch_tokens=mbt,
                                 peak_allocated_gib=peak, device=device, commit=sha))
                continue
            prof, wall = profile_part(fn, acts, f"{part} {label}")
            report = profile_report(prof, f"{a.shape} {part} {path}: wall {wall:.3f} s")
            (a.out / f"profile-{a.shape}-{part}-{path}{f'-mbt{mbt}' if mbt else ''}.txt").write_text(report)
            fam = family_ms(prof)
            fams[(part, path)] = fam | {"wall": wall * 1e3}
            rows.append(dict(op="profile_step", impl=path, shape=f"{a.shape} {part}", metric="wall_ms",
                             median=wall * 1e3, device=device, commit=sha))
            rows += [dict(op="profile_step", impl=path, shape=f"{a.shape} {part}", metric=f"ms:{f}",
                          median=ms, device=device, commit=sha) for f, ms in fam.items()]
            print(f"{part} {path}: wall {wall:.3f} s", flush=True)
        del trainer, engine, model
        release_gpu_memory()
    (a.out / "profile_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if a.no_profile:
        return 0
    for part in parts:
        names = sorted(set().union(*(fams[(part, p)] for p in paths)), key=lambda f: -fams[(part, paths[0])].get(f, 0.0))
        print(f"\n{part:6} {'family':22} " + " ".join(f"{p + ' ms':>10}" for p in paths))
        for f in names:
            print(f"{part:6} {f:22} " + " ".join(f"{fams[(part, p)].get(f, 0.0):10.1f}" for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
