"""The supervised phase before RL, as one call: train a seeded model on a synthetic task until its held-out
reward lies in a target band (or a step / time budget runs out), and save it as an init checkpoint.

Why a band and not "as good as possible": RL learns from the spread of rewards within a prompt's samples.
A policy at 0.2-0.6 held-out reward gets both right and wrong samples on most prompts, so GRPO's advantages
are non-zero and the RL arms (RunConfig.init_checkpoint) have room to rise.

Steps (rlkit/train/warm_start.py trains; rlkit/heldout.py measures):
1. the seeded model of `model` in `dtype` (or the weights of `init_from`, to continue an earlier phase in a
   later device call; the optimizer starts fresh);
2. every `eval_every` steps, the weights rounded to `dtype` are loaded into an embedded engine (native
   ops: no comparison is at stake) that decodes the task's fixed held-out prompts ("sample" at the RL's
   temperature, or "greedy"); a reward inside [target_low, target_high] ends the phase at once, so the
   saved weights are the measured ones;
3. the weights go to `out_dir` (rlkit/model/init_checkpoint.py) with the evaluation history, the reason the
   phase stopped, and whether the final reward lies in the band.

    from rlkit.warmstart import WarmStartConfig, supervised_phase
    manifest = supervised_phase(WarmStartConfig(model="tiny", task="add2", max_steps=20), "ckpt/warm")

`rlkit warmstart --out DIR ...` is the command; a refused call leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlkit.config import learning_0_6b
from rlkit.contract import NumericsContract
from rlkit.data.tasks import TASKS
from rlkit.heldout import DECODES, HeldoutSet, decode_sampling
from rlkit.model import build_model, preset
from rlkit.model.init_checkpoint import InitCheckpointError, check_init_checkpoint, load_init_checkpoint
from rlkit.model.init_checkpoint import save_init_checkpoint
from rlkit.model.tokenizer import load_tokenizer
from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
from rlkit.runners.base import engine_copy
from rlkit.train.warm_start import BACKENDS, warm_start


@dataclass(frozen=True)
class WarmStartConfig:
    model: str = "tiny"
    """A model preset (rlkit.model.MODEL_PRESETS)."""
    dtype: str = "auto"
    """bfloat16 | float32 | auto (as RunConfig.dtype): the dtype of the saved weights; the RL run that
    starts from them must use the same."""
    device: str = "cpu"
    task: str = "add2"
    """A synthetic task (arith | add2 | add3 | add8w | add9c); its training split trains (on each problem's
    demonstration), its held-out split measures."""
    seed: int = 0
    """Seeds the init, the training batches and the held-out sampling."""
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 0
    backend: str = "rlkit"
    """Which forward trains (rlkit/train/warm_start.py): rlkit (the model's own, packed, native ops: one
    attention call per sequence) | transformers (transformers' Qwen3 on the same parameters, padded batch,
    bf16 autocast on CUDA). The held-out evaluation always runs rlkit's engine."""
    tf32: bool | None = None
    """Let the training step's fp32 GEMMs use TF32 (rlkit/train/warm_start.py); None: on for CUDA only."""
    repeatable: bool = True
    """Train under torch's deterministic algorithms (rlkit/train/warm_start.py), so the phase run again
    from the same seed for the same steps gives the same weights bit for bit (the learning runs rebuild
    one warm start in every device session and check its checksum)."""
    max_steps: int = 1000
    max_minutes: float = 0.0
    """Wall-clock budget of training and evaluation (0: none); checked after every step."""
    eval_every: int = 50
    eval_prompts: int = 256
    decode: str = "sample"
    """sample (at `temperature`, the RL rollouts' distribution) | greedy"""
    temperature: float = 1.0
    max_tokens: int = 0
    """New tokens per held-out answer (0: the task's default)."""
    target_low: float = 0.2
    target_high: float = 0.6
    init_from: str = ""
    """An init checkpoint to continue from (its model and dtype must be these)."""
    threads: int = 0
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(max_num_seqs=64, num_pages=1024,
                                                                      max_batch_tokens=4096, max_model_len=256))

    def __post_init__(self) -> None:
        problems = []
        if self.task not in TASKS or TASKS[self.task].generate is None:
            problems.append(f"task={self.task!r} (a synthetic task: "
                            f"{' | '.join(n for n, t in TASKS.items() if t.generate)})")
        if self.backend not in BACKENDS:
            problems.append(f"backend={self.backend!r} ({' | '.join(BACKENDS)})")
        if self.decode not in DECODES:
            problems.append(f"decode={self.decode!r} ({' | '.join(DECODES)})")
        if self.dtype not in ("bfloat16", "float32", "auto"):
            problems.append(f"dtype={self.dtype!r} (bfloat16 | float32 | auto)")
        if not 0.0 <= self.target_low <= self.target_high <= 1.0:
            problems.append(f"target band [{self.target_low}, {self.target_high}] (0 <= low <= high <= 1)")
        for name in ("batch_size", "max_steps", "eval_every", "eval_prompts"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        for name in ("warmup_steps", "max_minutes", "max_tokens", "threads", "seed"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if not (self.lr > 0 and self.temperature > 0):
            problems.append("lr and temperature must be > 0")
        if problems:
            raise ValueError("invalid warm-start config: " + "; ".join(problems))

    def resolved(self) -> "WarmStartConfig":
        """With a concrete dtype (from the device, as a run resolves "auto") and TF32 setting."""
        cfg = self
        if cfg.dtype == "auto":
            from rlkit.hardware import default_dtype

            cfg = dataclasses.replace(cfg, dtype=default_dtype(cfg.device)[0])
        if cfg.tf32 is None:
            cfg = dataclasses.replace(cfg, tf32=torch.device(cfg.device).type == "cuda")
        return cfg


def warmstart_0_6b(**overrides) -> WarmStartConfig:
    """The learning runs' warm start (lab/learning_h200.py): qwen3-0.6b shape from its seeded init, bf16
    on the H200, nine-digit addition from labelled column pairs trained on its whole working ("add9c",
    95 prompt + ~157 target tokens a problem), 64-problem batches (~16 k tokens, ~10 k of them trained)
    through transformers' Qwen3 on the model's parameters (bf16 autocast, TF32; rlkit's own native
    prefill runs one attention call per sequence), AdamW 3e-4 after 50 warmup steps, the held-out reward
    (256 prompts, sampled at temperature 1 like the RL rollouts, up to the task's 192 new tokens each)
    every 20 steps, within an 8-minute budget per device call. Why 64 and not add2's 256 problems: 256 x
    ~250 tokens would keep ~64 k tokens of the eager forward's activations alive, estimated > 100 GiB for
    this shape. The evaluation engine has the RL arms' settings (rlkit.config.learning_0_6b): all 256
    held-out prompts decode at once."""
    cfg = WarmStartConfig(model="qwen3-0.6b", dtype="bfloat16", device="cuda", task="add9c", seed=1234,
                          backend="transformers",
                          batch_size=64, lr=3e-4, warmup_steps=50, max_steps=20_000, max_minutes=8.0,
                          eval_every=20, eval_prompts=256, engine=learning_0_6b().engine)
    return dataclasses.replace(cfg, **overrides)


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"--out {out_dir}: exists and is not an empty folder; the checkpoint goes into a new one")


def preflight(cfg: WarmStartConfig, out_dir: Path) -> WarmStartConfig:
    """Refuse (ValueError, one line) before anything is made: the output folder, the device, the model
    preset, the checkpoint to continue from. Returns the resolved config."""
    from rlkit.rundir import check_device

    _check_out_dir(out_dir)
    check_device(cfg.device)
    preset(cfg.model)
    cfg = cfg.resolved()
    if cfg.init_from:
        check_init_checkpoint(cfg.init_from, model_name=cfg.model, dtype=cfg.dtype)
    return cfg


def supervised_phase(cfg: WarmStartConfig, out_dir, *, progress: bool = False,
                     stop: threading.Event | None = None, log=None) -> dict:
    """Run the phase and write the init checkpoint into `out_dir` (new or empty); returns its manifest.
    `log(dict)` receives every held-out evaluation. On an error or a stop request nothing is left in
    `out_dir`."""
    out_dir = Path(out_dir)
    cfg = preflight(cfg, out_dir)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    made = not out_dir.exists()
    try:
        return _phase(cfg, out_dir, progress, stop, log)
    except BaseException:
        if made:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:  # it was an empty folder: empty it again
            for child in out_dir.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _phase(cfg: WarmStartConfig, out_dir: Path, progress: bool, stop, log) -> dict:
    tok = load_tokenizer()
    model = build_model(preset(cfg.model).with_dtype(cfg.dtype), seed=cfg.seed, device=cfg.device)
    start = None
    if cfg.init_from:
        start = load_init_checkpoint(model, cfg.init_from, model_name=cfg.model, dtype=cfg.dtype)
    task = TASKS[cfg.task]
    sampling = decode_sampling(cfg.decode, temperature=cfg.temperature,
                               max_tokens=cfg.max_tokens or task.default_max_tokens, seed=cfg.seed)
    held = HeldoutSet.build(cfg.task, cfg.eval_prompts, sampling, tok)
    engine = EmbeddedEngine(engine_copy(model), NumericsContract.native(), cfg.engine, engine_id="warmstart-eval")
    history: list[dict] = []
    t0 = time.monotonic()
    band = (cfg.target_low, cfg.target_high)

    def evaluate(step: int, loss: float | None) -> dict:
        engine.load_weights(model.state_dict(), step)  # fp32 while training: copied in rounds to `dtype`
        score = held.score(engine.generate(held.requests()), tok)
        row = {"step": step, "loss": loss, "elapsed_s": round(time.monotonic() - t0, 3), **score.to_dict()}
        history.append(row)
        if log is not None:
            log(row)
        return row

    evaluate(0, None)
    reason = ["step budget"]

    def until(p) -> bool:
        out_of_time = cfg.max_minutes and time.monotonic() - t0 >= cfg.max_minutes * 60
        if p.step % cfg.eval_every == 0 or out_of_time or p.step == cfg.max_steps:
            row = evaluate(p.step, p.loss)
            if band[0] <= row["reward"] <= band[1]:
                reason[0] = "in the target band"
                return True
            if row["reward"] > band[1]:
                reason[0] = "above the target band (it rose past it between two evaluations)"
                return True
        if out_of_time:
            reason[0] = "time budget"
            return True
        return False

    in_band_at_start = band[0] <= history[0]["reward"] <= band[1]
    losses = [] if in_band_at_start else warm_start(
        model, cfg.max_steps, cfg.seed, task=cfg.task, batch_size=cfg.batch_size, lr=cfg.lr,
        warmup_steps=cfg.warmup_steps, tf32=bool(cfg.tf32), backend=cfg.backend, repeatable=cfg.repeatable,
        progress=progress, stop=stop, until=until)
    if in_band_at_start:
        reason[0] = "in the target band before training"
    if history[-1]["step"] != len(losses):  # the weights saved are the weights measured last
        evaluate(len(losses), losses[-1] if losses else None)
    final = history[-1]
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "engine"}
    made_by = {"phase": "supervised warm start", "settings": settings, "steps": len(losses),
               "stopped_because": reason[0], "heldout": final, "in_band": band[0] <= final["reward"] <= band[1],
               "history": history, "continued_from": None if start is None else start["weights_checksum"],
               "elapsed_s": round(time.monotonic() - t0, 3)}
    return save_init_checkpoint(model, out_dir, model_name=cfg.model, made_by=made_by)


__all__ = ["WarmStartConfig", "warmstart_0_6b", "supervised_phase", "preflight", "InitCheckpointError"]
