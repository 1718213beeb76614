"""The headline of issue 16: RL step time, strict / native, with the rollout / train / sync split.

For each step shape below, two fresh runs from the same seed and data order: every op strict, then every
op native (the native control: cuBLAS GEMMs, SDPA prefill, the split-K paged flash-decoding, the same
sampler, decode from CUDA graphs on both sides). Each run does --steps RL steps or stops at its time
budget (a stop request ends it between steps); the first --warmup steps (default 1: step 0) are left
out of the medians (compilation, graph capture, allocator warm-up; on a fresh machine with a cold Triton
cache step 1 still compiles, so give 2 or more there). Per path: the median step time and its parts; then strict / native
for each.

Step shapes (rlkit.config.validation_0_6b with overrides; random weights, DAPO-Math-17k, seed 1234):
- validation: qwen3-0.6b shape, 2 prompts x 8 samples, 512-token responses (the 200-step validation run);
- trainer-heavy: qwen3-1.7b shape, 2 x 8, 2k-token responses;
- source: qwen3-0.6b shape, 8 prompts x 8 samples, responses up to 6,912 tokens (the source system's step
  shape scaled to one H200); the engine frees its KV cache while the trainer trains (`release_when_idle`),
  so the step also fits an 80 GB card;
- learning: issue 17's learning arm (rlkit.config.learning_0_6b: add9c, 16 x 16 samples decoded as one
  batch of 256) from seeded weights, 160-token responses (the warm-started arm writes ~157).

On the lent H200 (rlkit installed editable first, offline; the data travel in an ignored folder):
    python3 -m pip install -q --no-deps --no-build-isolation -e .
    RLKIT_DATA=.thirdparty/data RLKIT_COMMIT=<sha> python3 lab/rl_step_ratio_h200.py --out $OUT \\
        --shapes validation,trainer-heavy --steps 4 --minutes 2
    python lab/rl_step_ratio_h200.py --dry-run --out /tmp/ratio   # CPU, tiny preset, 16-token responses
The source shape takes about five minutes of device time a path (two steps of ~2.5 min): run one path a
call (`--paths strict`, then `--paths native`; each call's rows are written as its path finishes) and
join them here with `--combine A.jsonl B.jsonl --out DIR`.
With --interleave, each shape is one run instead of two: its steps alternate strict and native (every
op toggled at each step boundary, as the dashboard's toggles do), so both paths run in the same process,
on the same warm GPU, with the same allocator and caches; the first --warmup steps (compiles, graph
capture for each path) are left out and the ratio is taken pair by pair (a strict step and the native step
after it). Separate runs put the paths minutes apart; on 2026-12-02 two such measurements of the
validation shape read 0.87 and 1.65 (the second's strict run had one timed step, still compiling):
lab/LOG.md.
The cuBLAS setting (session 16): importing rlkit turns cuBLAS's workspace off for the strict GEMM's cuBLAS
route (kernels/gemm_cublas.py), and with it split-K for the native GEMMs of the same process. The native
control a user runs keeps torch's defaults: run `--paths native` with RLKIT_GEMM_CUBLAS=0 in its
environment (the two-run design). Under --interleave both paths share one process and so the setting; every
run writes a `cublas_no_workspace` row (1: the process ran without a workspace) so the table's rows say
which cuBLAS they timed.
With --profile, each run is recorded by torch.profiler (every step, step 0 too: use few steps; measured
2026-12-01: the validation shape's 4 x 512 decode steps did not finish profiling in 166 s) and
$OUT/profile-SHAPE-PATH.txt gets its kernels by device time (the top 60, and totals per kernel family),
so the strict/native gap can be read kernel by kernel.

Writes $OUT/rl_step_ratio.jsonl (long format, the benchmarks' rows: op "rl_step", impl = the path or
"strict/native", shape, metric, median, device, commit; `rlkit.bench.kernels.render` draws BENCHMARKS.md's
RL-step table from them) and prints the table last. On CUDA each run also gets two memory rows: `peak_allocated_gib` (torch.cuda.max_memory_allocated,
reset before the run) and `left_allocated_gib` (still allocated after the run returned and gc + empty_cache
ran: the next run's starting point, ~0 when the loop released its engines and trainer). Nothing here asserts: it is a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from rlkit.bench.provenance import commit
from rlkit.config import learning_0_6b, validation_0_6b
from rlkit.loop import run
from rlkit.rollout.engine import EngineConfig

PARTS = ("step_s", "rollout_s", "train_s", "sync_s")
TRAINER_HEAVY_OPTIM = dataclasses.replace(validation_0_6b().optim, micro_batch_tokens=8192)
"""The long-response shapes train in micro-batches of 8,192 tokens on both paths, as a trainer would: one
backward over 16 x 2k tokens keeps every layer's activations alive at once (the native path's eager
autograd ops ran out of the H200's 140 GB that way, lab/LOG.md 2026-12-01 session 3)."""


def step_shapes(dry_run: bool) -> dict:
    """name -> RunConfig (without steps and path)."""
    if dry_run:  # the same pipeline on the CPU: tiny preset, short responses
        base = dict(model="tiny", device="cpu", dtype="float32", max_tokens=16, threads=1,
                    engine=EngineConfig(page_size=16, num_pages=256, max_num_seqs=16, max_batch_tokens=256,
                                        max_model_len=512, cuda_graphs=False))
        return {"validation": validation_0_6b(**base),
                "source": validation_0_6b(**dict(base, prompts_per_step=4, samples_per_prompt=2))}
    return {
        "validation": validation_0_6b(),
        "trainer-heavy": validation_0_6b(
            model="qwen3-1.7b", max_tokens=2048, optim=TRAINER_HEAVY_OPTIM,
            engine=EngineConfig(page_size=16, num_pages=4096, max_num_seqs=16, max_batch_tokens=4096,
                                max_model_len=4096)),
        # the KV cache holds every sequence's whole budget (64 x 8,192 / 16 pages: all 64 run at once) and
        # is freed while the trainer trains, as a colocated vLLM sleeps: 60 GB of cache beside the trainer
        # did not fit an 80 GB card (lab/LOG.md 2026-12-06, sessions 28 and 29)
        "source": validation_0_6b(
            prompts_per_step=8, samples_per_prompt=8, max_tokens=6912, optim=TRAINER_HEAVY_OPTIM,
            engine=EngineConfig(page_size=16, num_pages=32768, max_num_seqs=64, max_batch_tokens=8192,
                                max_model_len=8192, release_when_idle=True)),
        # issue 17's learning arm (256 add9c samples a step, one decode batch of 256) from seeded weights,
        # not the warm start: responses run to max_tokens, 160 here, about the warm-started arm's 157
        "learning": learning_0_6b(heldout_every=0, max_tokens=160),
    }


def open_store_when_created(run_dir: Path, done: threading.Event):
    """The run store at `run_dir` once the run has created it, or None if `done` is set first (for the
    threads that watch a run from beside it)."""
    from rlkit.timeline.store import DB_NAME, RunStore

    while not (run_dir / DB_NAME).is_file():
        if done.wait(0.05):
            return None
    return RunStore.open(run_dir)


class StepEvents:
    """What ran inside a run besides its steps (--events): each Triton/Gluon kernel compiled in this process
    (triton.knobs' post-compile hook) and each Python garbage collection (gc.callbacks), put in the step
    they fell in by watching the run store for step commits. For the slow strict steps after the warm-up
    (lab/LOG.md 2026-12-04 session 20): kernels first met there, or collector pauses, or neither."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.compiles, self.collections, self.commits = run_dir, [], [], []
        self._gc_start = 0.0
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def _compiled(self, *args, **kwargs):
        fn = kwargs.get("fn")
        name = getattr(fn, "name", None) or "?"
        self.compiles.append((time.perf_counter(), name, self._specialization(fn, kwargs.get("compile") or {})))
        return None  # never skips a kernel

    @staticmethod
    def _specialization(fn, compile_info: dict) -> dict[str, str]:
        """What a compile was specialized on, argument by argument: its type, its constexpr value, and the
        attributes Triton inferred (an integer's divisibility by 16, a pointer's alignment), plus warps and
        stages."""
        names = list(getattr(getattr(fn, "jit_function", None), "arg_names", []) or [])

        def arg(key) -> str:
            idx = key[0] if isinstance(key, tuple) and key else key
            return names[idx] if isinstance(idx, int) and idx < len(names) else str(key)

        spec = {f"{k}": str(v) for k, v in (compile_info.get("signature") or {}).items()}
        spec |= {f"{arg(k)}=": str(v) for k, v in (compile_info.get("constants") or {}).items()}
        for attrs in compile_info.get("configs") or []:
            spec |= {f"{arg(k)}@": str(v) for k, v in (attrs or {}).items()}
        return spec | {"warps/stages": f"{compile_info.get('num_warps')}/{compile_info.get('num_stages')}"}

    def new_specializations(self) -> list[str]:
        """Each compile of a kernel already compiled before in this run: the arguments (and options) whose
        specialization differs from its first compile, e.g. an integer now divisible by 16."""
        first: dict[str, dict[str, str]] = {}
        lines = []
        for t, name, types in self.compiles:
            if name not in first:
                first[name] = types
                continue
            diff = {k: (first[name].get(k), types.get(k)) for k in first[name].keys() | types.keys()
                    if first[name].get(k) != types.get(k)}
            lines.append(f"  step {self.step_of(t)} {name}: " + (", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items())
                                                            or "the same specialization")[:400])
        return lines

    def _gc(self, phase, info):
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.collections.append((time.perf_counter(), time.perf_counter() - self._gc_start, info.get("generation")))

    def _watch(self):
        store = open_store_when_created(self.run_dir, self._done)
        if store is None:
            return
        try:
            seen = None
            while not self._done.wait(0.02):
                last = store.last_step()
                if last is not None and last != seen:
                    seen = last
                    self.commits.append((time.perf_counter(), last))
        finally:
            store.close()

    def __enter__(self):
        import triton

        triton.knobs.runtime.jit_post_compile_hook = self._compiled
        gc.callbacks.append(self._gc)
        self._watcher.start()
        return self

    def __exit__(self, *exc):
        import triton

        triton.knobs.runtime.jit_post_compile_hook = None
        gc.callbacks.remove(self._gc)
        self._done.set()
        self._watcher.join()

    def step_of(self, t: float) -> int:
        """The step running at perf_counter time t: one past the last step committed before t."""
        return 1 + max((step for when, step in self.commits if when <= t), default=-1)

    def report(self) -> str:
        by_step: dict[int, dict] = {}
        for t, name, _ in self.compiles:
            by_step.setdefault(self.step_of(t), {"compiles": [], "gc_s": 0.0, "gc2": 0})["compiles"].append(name)
        for t, took, gen in self.collections:
            e = by_step.setdefault(self.step_of(t), {"compiles": [], "gc_s": 0.0, "gc2": 0})
            e["gc_s"] += took
            e["gc2"] += gen == 2
        lines = []
        for step in sorted(by_step):
            e = by_step[step]
            names = sorted(set(e["compiles"]))
            lines.append(f"  step {step}: {len(e['compiles'])} kernels compiled ({', '.join(names)[:300]}); "
                         f"gc {e['gc_s'] * 1e3:.1f} ms ({e['gc2']} full collections)")
        return "\n".join(lines + ["recompiles:"] + self.new_specializations())


def timed_run(run_dir: Path, cfg, minutes: float, events: bool = False) -> tuple[list, dict[str, float]]:
    """Run `cfg` into a new `run_dir` until its steps are done or `minutes` pass: its step summaries, and
    on CUDA its GPU memory (peak allocated during the run; what is still allocated once the run returned
    and its memory was released: the next run must start on an empty GPU)."""
    stop = threading.Event()
    timer = threading.Timer(minutes * 60, stop.set)
    on_gpu = cfg.device.startswith("cuda") and torch.cuda.is_available()
    release_gpu_memory()
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    timer.start()
    watch = StepEvents(run_dir) if events else contextlib.nullcontext()
    try:
        with watch:
            store = run(run_dir, cfg, progress=False, stop=stop)
        if events:
            print(f"events in {run_dir.name}:\n{watch.report()}", flush=True)
    finally:
        timer.cancel()
    with store:
        steps = store.steps()
    memory = {}
    if on_gpu:
        memory["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        release_gpu_memory()
        memory["left_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
    return steps, memory


FAMILIES = (  # kernel-name substring -> family, first match wins (profile summaries)
    ("_gemm_", "strict GEMM"), ("_attn_kernel", "strict attention"), ("_logprob", "strict logprob"),
    ("_row_cumsum", "top-p scan"), ("rms_norm", "RMSNorm"), ("rope", "RoPE"), ("swiglu", "SwiGLU"),
    ("silu", "SwiGLU"), ("flash", "SDPA flash"), ("attention", "attention (other)"), ("gemm", "cuBLAS GEMM"),
    ("xmma", "cuBLAS GEMM"), ("nvjet", "cuBLAS GEMM"), ("cutlass", "cuBLAS GEMM"), ("softmax", "softmax"),
    ("nccl", "NCCL"), ("reduce", "reductions"), ("elementwise", "elementwise"), ("copy", "copies"),
    ("Memcpy", "copies"), ("Memset", "memset"))


def timed_events(prof) -> list[tuple[str, float, int]]:
    """(name, ms, calls) of what ran: on a GPU the device's own events only (kernels, copies, memsets;
    a CPU op's device time is its kernels', so counting both counted them twice: lab/LOG.md session 6);
    without one each op's own CPU time."""
    gpu = torch.cuda.is_available()
    cuda = torch.autograd.DeviceType.CUDA
    return [(e.key, (e.self_device_time_total if gpu else e.self_cpu_time_total) / 1e3, e.count)
            for e in prof.key_averages() if not gpu or getattr(e, "device_type", None) == cuda]


def profile_report(prof, title: str) -> str:
    """Device time per kernel (top 60) and per family, from a finished torch.profiler run (without a
    GPU: each op's own CPU time)."""
    gpu = torch.cuda.is_available()
    rows = timed_events(prof)
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: -r[1])
    total = sum(r[1] for r in rows) or 1.0
    families: dict[str, float] = {}
    for key, ms, _ in rows:
        fam = next((f for sub, f in FAMILIES if sub.lower() in key.lower()), "other")
        families[fam] = families.get(fam, 0.0) + ms
    lines = [f"# {title}: {'device' if gpu else 'CPU self'} time {total:.1f} ms in all", "", "family ms share"]
    lines += [f"{f} {ms:.1f} {ms / total:.3f}" for f, ms in sorted(families.items(), key=lambda x: -x[1])]
    lines += ["", "kernel ms calls share"]
    lines += [f"{key[:110]} {ms:.2f} {n} {ms / total:.3f}" for key, ms, n in rows[:60]]
    if gpu:  # where the host's time goes (launches, syncs, Python-side ops): a host-bound loop shows here
        host = sorted(((e.key, e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()),
                      key=lambda r: -r[1])
        lines += ["", "host op self-CPU-ms calls"]
        lines += [f"{key[:110]} {ms:.1f} {n}" for key, ms, n in host[:30]]
    return "\n".join(lines) + "\n"


def release_gpu_memory() -> None:
    """Free what a finished run left: the loop closes its runner (engines with their KV cache and decode
    graphs, trainer with its optimizer); collect cycles, then hand the allocator's cached blocks back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def medians(steps, warmup: int = 1) -> dict[str, float]:
    """A run's medians over its steps after `warmup` (step 0 compiles and captures; with a cold Triton
    cache step 1 still compiles), and its mismatches over every step."""
    return summary(steps[warmup:] or steps, steps)


def summary(timed, counted) -> dict[str, float]:
    """Median seconds per part over `timed`; mismatched and compared tokens over `counted`."""
    return {part: statistics.median(s.timings[part] for s in timed) for part in PARTS} | {
        "steps_timed": float(len(timed)), "mismatch_count": float(sum(s.mismatch_count for s in counted)),
        "compared_tokens": float(sum(s.compared_tokens for s in counted))}


def alternate_paths(run_dir: Path, done: threading.Event) -> None:
    """Watch the run at `run_dir` and toggle every op once a step: once step k - 1 is committed and step k
    is well under way, ask for step k + 1's path (native for even steps, strict for odd ones), all ops in
    one transaction. "Well under way": a quarter of step k - 1's time later (at most 2 s), since the loop
    reads the requests at step k's boundary some milliseconds after the commit (a request posted at once
    landed in step k one time in three on the CPU, 2026-12-02). Step 0 gives no signal, so steps 0 and 1
    both run the run's own path (strict) and the pattern is s s n s n ...; each step's `ops_paths` says
    what it ran (`interleaved_ratios` reads that, not this plan)."""
    from rlkit.contract import OPS

    store = open_store_when_created(run_dir, done)
    if store is None:
        return
    seen = None
    try:
        while not done.wait(0.02):
            last = store.last_step()
            if last is None or last == seen:
                continue
            seen = last
            took = store.steps()[-1].timings.get("step_s", 0.0)
            if done.wait(min(2.0, max(0.05, took / 4))) or store.last_step() != last:
                continue  # the run ended, or step last + 1 is already over: no plan for it
            path = "native" if (last + 2) % 2 == 0 else "strict"
            store.request_toggles({op: path for op in OPS}, "rl_step_ratio --interleave")  # one transaction
    finally:
        store.close()


def step_path(s) -> str | None:
    """'strict' or 'native' when every op of the step ran that path, else None."""
    paths = set(s.ops_paths.values())
    return paths.pop() if len(paths) == 1 else None


def interleaved_ratios(steps, warmup: int) -> tuple[dict, dict, list[dict]]:
    """From an alternating run: each path's medians over its steps after `warmup` (its mismatches over all
    of its steps), the per-part median of pair ratios (strict step / the native step right after it) and
    the pairs themselves."""
    timed = [s for s in steps[warmup:] if step_path(s)]
    result = {}
    for path in ("strict", "native"):
        mine = [s for s in timed if step_path(s) == path]
        if mine:
            result[path] = summary(mine, [s for s in steps if step_path(s) == path])
    pairs = [{"strict_step": a.step, "native_step": b.step} | {
                part: a.timings[part] / b.timings[part] for part in PARTS if b.timings[part] > 0}
             for a, b in zip(timed, timed[1:])
             if step_path(a) == "strict" and step_path(b) == "native" and b.step == a.step + 1]
    ratio = {part: statistics.median(p[part] for p in pairs) for part in PARTS if pairs and part in pairs[0]}
    return result, ratio, pairs


def per_step(steps, warmup: int = 1) -> dict[str, list[float]]:
    """Each timed step's seconds per part (the warm-up left out, as in `medians`): the spread behind a median."""
    timed = steps[warmup:] or steps
    return {part: [round(s.timings[part], 3) for s in timed] for part in PARTS}


def combine(files: list[str], out: Path) -> int:
    """Ratio rows from per-path rows measured in separate calls (each file's rows keep their commit; the
    ratio row takes the strict run's): `OUT/rl_step_ratio.jsonl` gets every row and the ratios."""
    rows = [json.loads(line) for f in files for line in Path(f).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["impl"] != "strict/native"]
    by = {(r["shape"], r["impl"], r["metric"]): r for r in rows}
    for shape in sorted({r["shape"] for r in rows}):
        if not all((shape, path, "step_s") in by for path in ("strict", "native")):
            print(f"{shape}: needs both a strict and a native run", file=sys.stderr)
            return 2
        for part in PARTS:
            s, n = by[(shape, "strict", part)], by[(shape, "native", part)]
            if n["median"] > 0:
                rows.append(dict(s, impl="strict/native", metric=part, median=s["median"] / n["median"]))
                print(f"{shape} {part}: strict {s['median']:.3f} native {n['median']:.3f} "
                      f"ratio {s['median'] / n['median']:.3f}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_step_ratio.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="validation,trainer-heavy,source")
    ap.add_argument("--steps", type=int, default=4, help="RL steps a run (the first --warmup are not timed)")
    ap.add_argument("--minutes", type=float, default=2.0, help="time budget a run")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny preset, 16-token responses")
    ap.add_argument("--profile", action="store_true", help="record each run with torch.profiler (see above)")
    ap.add_argument("--paths", default="strict,native",
                    help="the paths to run (one path a device call for the long shapes; then --combine)")
    ap.add_argument("--interleave", action="store_true",
                    help="one run a shape, its steps alternating strict and native; ratios pair by pair")
    ap.add_argument("--warmup", type=int, default=None,
                    help="steps left out at the start of each run (default 1; with --interleave 3: the pattern "
                         "is s s n | s n s n ...). On a fresh machine step 1 still compiles: 2 or more")
    ap.add_argument("--events", action="store_true",
                    help="print each step's kernel compiles and garbage collections (StepEvents)")
    ap.add_argument("--contract", default=None,
                    help="the numerics contract of both paths (default rlkit.contract.DEFAULT_NAME); another one "
                         "labels each row's shape with it, e.g. 'validation [qwen3-dense-strict-v6]'")
    ap.add_argument("--combine", nargs="+", metavar="ROWS.jsonl",
                    help="no run: the strict/native rows of these files (one path each, or both) -> ratio rows")
    a = ap.parse_args()
    if a.combine:
        return combine(a.combine, a.out)
    shapes = step_shapes(a.dry_run)
    unknown = [s for s in a.shapes.split(",") if s not in shapes]
    if unknown:
        print(f"--shapes: unknown {unknown}; choose from {', '.join(shapes)}", file=sys.stderr)
        return 2
    from rlkit.contract import DEFAULT_NAME, NAMES

    if a.contract is not None and a.contract not in NAMES:
        print(f"--contract: unknown {a.contract!r}; choose from {', '.join(NAMES)}", file=sys.stderr)
        return 2
    if a.contract not in (None, DEFAULT_NAME):  # rows of another contract never share a label with the default's
        shapes = {f"{n} [{a.contract}]": cfg.replace(contract_name=a.contract) for n, cfg in shapes.items()}
        a.shapes = ",".join(f"{n} [{a.contract}]" for n in a.shapes.split(","))
    a.out.mkdir(parents=True, exist_ok=True)
    device = "cpu (dry run)" if a.dry_run else torch.cuda.get_device_name()
    sha, rows, table = commit(), [], []
    paths = [p for p in ("strict", "native") if p in a.paths.split(",")]
    if a.warmup is None:
        a.warmup = 3 if a.interleave else 1
    warmup = a.warmup
    if a.interleave:
        if a.profile or a.paths != "strict,native":
            print("--interleave runs both paths in one run and does not profile: drop --paths / --profile",
                  file=sys.stderr)
            return 2
        if a.steps < warmup + 2:
            print(f"--interleave: --steps {a.steps} leaves no strict/native pair after --warmup {warmup}",
                  file=sys.stderr)
            return 2
        for name in a.shapes.split(","):
            rows += interleaved_shape(a, name, shapes[name], device, sha, table)
            (a.out / "rl_step_ratio.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print_table(table)
        return 0
    for name in a.shapes.split(","):
        result = {}
        for path in paths:
            # no checkpoints: a timing run never resumes, and the last step's save of a 1.7b trainer (bf16
            # weights, fp32 masters, AdamW state: ~24 GB a path) filled the device's disk for the next
            # command of the call (lab/LOG.md 2026-12-01 session 6); step_s never included it
            cfg = shapes[name].replace(steps=a.steps, path=path, checkpoint_every=0)
            t0 = time.time()
            if a.profile:
                acts = [torch.profiler.ProfilerActivity.CPU] + (
                    [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
                with torch.profiler.profile(activities=acts) as prof:
                    steps, memory = timed_run(a.out / f"run-{_slug(name)}-{path}", cfg, a.minutes)
                report = profile_report(prof, f"{name} {path}, {len(steps)} steps")
                (a.out / f"profile-{name}-{path}.txt").write_text(report)
                print(report[:1500], flush=True)
            else:
                steps, memory = timed_run(a.out / f"run-{_slug(name)}-{path}", cfg, a.minutes, a.events)
            result[path] = medians(steps, warmup)
            print(f"{name} {path}: {len(steps)} steps in {time.time() - t0:.0f} s: "
                  + " ".join(f"{k} {v:.3f}" for k, v in (result[path] | memory).items()), flush=True)
            values = per_step(steps, warmup)
            print(f"  per step: " + "; ".join(f"{k} {v}" for k, v in values.items()), flush=True)
            rows += [dict(op="rl_step", impl=path, shape=name, metric=k, median=v, device=device, commit=sha,
                          warmup=warmup) | ({"values": values[k]} if k in values else {})
                     for k, v in (result[path] | memory | cublas_setting()).items()]
            (a.out / "rl_step_ratio.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # per path
        if len(result) < 2:
            continue
        ratio = {part: result["strict"][part] / result["native"][part] for part in PARTS
                 if result["native"][part] > 0}
        rows += [dict(op="rl_step", impl="strict/native", shape=name, metric=k, median=v, device=device,
                      commit=sha) for k, v in ratio.items()]
        table.append((name, result, ratio))
        (a.out / "rl_step_ratio.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print_table(table)
    return 0


def cublas_setting() -> dict[str, float]:
    """{"cublas_no_workspace": 1.0} when this process runs cuBLAS without a workspace (rlkit's setting for
    its cuBLAS route), else 0.0 (torch's defaults: RLKIT_GEMM_CUBLAS=0, or the user's own values)."""
    from rlkit.kernels import gemm_cublas

    return {"cublas_no_workspace": float(gemm_cublas.environment_problem() is None)}


def print_table(table) -> None:
    print(f"\n{'shape':14} {'path':7} " + " ".join(f"{p:>10}" for p in PARTS) + "  (median seconds, warm-up left out)")
    for name, result, ratio in table:
        for path in ("strict", "native"):
            print(f"{name:14} {path:7} " + " ".join(f"{result[path][p]:10.3f}" for p in PARTS))
        print(f"{name:14} {'ratio':7} " + " ".join(f"{ratio.get(p, float('nan')):10.2f}" for p in PARTS))


def _slug(label: str) -> str:
    """A shape label as a directory name: 'validation [qwen3-dense-strict-v6]' -> 'validation-qwen3-dense-strict-v6'."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", label).strip("-")


def interleaved_shape(a, name: str, cfg, device: str, sha: str, table: list) -> list[dict]:
    """One alternating run of shape `name`: its rows (each path's medians, the median pair ratios with
    every pair's value, the run's memory), and its line in `table` when it has a pair."""
    cfg = cfg.replace(steps=a.steps, path="strict", checkpoint_every=0)
    run_dir = a.out / f"run-{_slug(name)}-interleaved"
    done = threading.Event()
    watcher = threading.Thread(target=alternate_paths, args=(run_dir, done), daemon=True)
    t0 = time.time()
    watcher.start()
    try:
        steps, memory = timed_run(run_dir, cfg, a.minutes)
    finally:
        done.set()
        watcher.join()
    result, ratio, pairs = interleaved_ratios(steps, a.warmup)
    print(f"{name} interleaved: {len(steps)} steps in {time.time() - t0:.0f} s, {len(pairs)} pairs after "
          f"{a.warmup} warm-up steps", flush=True)
    for s in steps:
        print(f"  step {s.step} {step_path(s) or 'mixed'}: " + " ".join(f"{p} {s.timings[p]:.3f}" for p in PARTS)
              + f" mismatches {s.mismatch_count}/{s.compared_tokens}", flush=True)
    common = dict(op="rl_step", shape=name, device=device, commit=sha, design="alternating", warmup=a.warmup)
    rows = [dict(common, impl=path, metric=k, median=v) for path, r in result.items() for k, v in r.items()]
    rows += [dict(common, impl="strict+native", metric=k, median=v) for k, v in (memory | cublas_setting()).items()]
    if not ratio:
        print(f"{name}: no strict/native pair after the warm-up; no ratio", flush=True)
        return rows
    rows += [dict(common, impl="strict/native", metric=part, median=v, values=[round(p[part], 4) for p in pairs])
             for part, v in ratio.items()]
    table.append((name, result, ratio))
    return rows


if __name__ == "__main__":
    sys.exit(main())
