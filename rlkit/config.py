"""RunConfig: everything an RL run needs, as one frozen dataclass; run presets are named functions.

    cfg = lab_default(path="native")          # the lab's default: tiny model, arithmetic, 50 steps
    cfg = RunConfig(model="qwen3-0.6b", task="dapo", device="cuda", ...)

Two kinds of preset, named apart: a *model* preset (`rlkit.model.MODEL_PRESETS`, e.g. "tiny", "qwen3-8b")
is a Qwen3Config, and `RunConfig.model` names one; a *run* preset (`RUN_PRESETS` here, e.g. "lab") is a
complete RunConfig. The config is frozen all the way down (per-op overrides are a tuple of pairs), and
stored in the run's store at creation as `to_dict()`; `rlkit run --resume DIR` rebuilds it from there with
`from_dict` (which also reads stores written before the model field was named `model`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from rlkit.contract import DEFAULT_NAME, NAMES, OPS, V2_NAME, NumericsContract
from rlkit.data.tasks import TASKS
from rlkit.rollout.engine import EngineConfig
from rlkit.train.trainer import OptimConfig
from rlkit.types import DEFAULT_MAX_TOKENS, SamplingParams


@dataclass(frozen=True)
class RunConfig:
    model: str = "tiny"
    """A model preset (rlkit.model.MODEL_PRESETS): tiny | qwen3-0.6b | qwen3-1.7b | qwen3-4b | qwen3-8b."""
    dtype: str = "auto"
    """bfloat16 | float32 (the one spelling; the CLI's bf16 / fp32 map onto it) | auto. A new run resolves
    "auto" once, from the device (rlkit.hardware: bf16 on GPUs and on CPUs with AMX or AVX-512 BF16, fp32
    on other CPUs), and stores the concrete dtype with the reason in the run's metadata; a resumed run
    keeps it."""
    device: str = "cpu"
    task: str = "arith"
    """arith | add2 | add3 | add8w | add9c | gsm8k | dapo (rlkit.data.tasks.TASKS)"""
    steps: int = 50
    contract_name: str = DEFAULT_NAME
    """The numerics contract (a released name, rlkit.contract.NAMES; rlkit.contract.DEFAULT_NAME by default). A store
    written before this field existed was made under qwen3-dense-strict-v2 and reads back as that."""
    path: str = "strict"
    """The path of every op at the start (before `ops`)."""
    ops: tuple[tuple[str, str], ...] = ()
    """Per-op overrides as sorted (op, path) pairs, e.g. (("attention", "native"),). A mapping
    ({"attention": "native"}) is accepted and stored as its sorted pairs, so the config stays frozen."""
    seed: int = 0
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    max_tokens: int = 0
    """0: the task's default."""
    temperature: float = 1.0
    """Sampling (with top_k, top_p, max_tokens and seed): the CLI's flags; `sampling()` gives them as the
    one sampling type, rlkit.types.SamplingParams."""
    top_k: int = 0
    top_p: float = 1.0
    staleness: int = 0
    """A record may enter the update of a version at most this many versions newer than its own."""
    shaping: float = 0.0
    """Weight of a shaping term added to the task reward: the share of the response's characters that
    are ASCII (rlkit.data.rewards.ascii_share, a language-consistency reward). 0: the task reward
    alone. A random-weight model earns a task reward of 0 on every sample, so every advantage and
    every gradient is 0 and its weights never move; the shaping term differs between samples, which
    gives the validation run moving weights."""
    warm_start_steps: int = 0
    """Supervised steps on the arithmetic task before step 0 (tiny models need a start to learn)."""
    init_checkpoint: str = ""
    """A warm-start checkpoint folder (`rlkit warmstart`, rlkit/model/init_checkpoint.py) whose weights
    are version 0 instead of the seeded init: its model shape and dtype must be the run's, and the weights
    loaded must have the checksum its manifest recorded. The run stores that checksum ("init_checkpoint"
    in the store's info) and version 0 of the timeline carries it, so two arms started from one folder
    provably start from the same bits. Empty: the seeded init (and `warm_start_steps`)."""
    heldout_every: int = 0
    """Measure the reward on the task's fixed held-out set (`heldout_prompts` prompts, one sample each, the
    run's sampling) with the weights of every this many steps, before that step's rollout; stored in the
    step's summary (`heldout_reward`). 0: never."""
    heldout_prompts: int = 64
    optim: OptimConfig = field(default_factory=OptimConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    runner: str = "local"
    """local | ray"""
    trainer: str = "embedded"
    """embedded (rlkit's Qwen3 + AdamW) | megatron (Megatron-core GPTModel with rlkit's strict spec, at
    `trainer_tp` x `trainer_cp` x `trainer_pp`)"""
    engines: int = 1
    rollout_tp: int = 1
    """Tensor-parallel ranks of each rollout engine (runner "ray": one actor per rank, in their own
    process group; rlkit/model/parallel.py). The trainer's layout is its own (`trainer_tp`)."""
    trainer_tp: int = 1
    """Megatron trainer's tensor-parallel size (trainer "megatron"; > 1 needs runner "ray": one actor
    per rank)."""
    trainer_pp: int = 1
    """Megatron trainer's pipeline-parallel size (as trainer_tp)."""
    trainer_cp: int = 1
    """Megatron trainer's context-parallel size: each packed batch split over this many ranks (as
    trainer_tp; any sequence lengths: rlkit/train/megatron/context_parallel.py)."""
    checkpoint_every: int = 1
    """Save the trainer's state every this many steps, at the last step, and at the step a stop request
    ends the run on (0: never; a run without checkpoints cannot resume). A resumed run redoes the steps
    after its last checkpoint, bit for bit."""
    locate_every: int = 5
    """On steps with mismatches, run the first-divergence locator every this many steps (0: never)."""
    locate_records: int = 4
    threads: int = 0
    """torch threads for the trainer and the engines (0: leave torch's default). Runs compared bit for
    bit across runners must use the same value."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", _op_pairs(self.ops))
        problems = []
        if self.contract_name not in NAMES:
            problems.append(f"contract_name={self.contract_name!r} ({' | '.join(NAMES)})")
        if self.path not in ("strict", "native"):
            problems.append(f"path={self.path!r} (strict | native)")
        for op, path in self.ops:
            if op not in OPS or path not in ("strict", "native"):
                problems.append(f"ops {op}={path}")
        if self.task not in TASKS:
            problems.append(f"task={self.task!r} ({' | '.join(TASKS)})")
        if self.init_checkpoint and self.warm_start_steps:
            problems.append("init_checkpoint and warm_start_steps: a run starts from one or the other")
        if self.heldout_every and self.heldout_prompts < 1:
            problems.append("heldout_prompts must be >= 1 when heldout_every is set")
        if self.runner not in ("local", "ray"):
            problems.append(f"runner={self.runner!r} (local | ray)")
        if self.trainer not in ("embedded", "megatron"):
            problems.append(f"trainer={self.trainer!r} (embedded | megatron)")
        if self.dtype not in ("bfloat16", "float32", "auto"):
            problems.append(f"dtype={self.dtype!r} (bfloat16 | float32 | auto)")
        if self.rollout_tp > 1 and self.runner != "ray":
            problems.append(f"rollout_tp={self.rollout_tp} needs runner='ray' (one process per rank)")
        if self.trainer_ranks > 1 and (self.trainer != "megatron" or self.runner != "ray"):
            problems.append(f"trainer_tp={self.trainer_tp} x trainer_cp={self.trainer_cp} x trainer_pp="
                            f"{self.trainer_pp} needs trainer='megatron' and runner='ray' (one process per rank)")
        if self.trainer == "megatron" and self.optim.micro_batch_tokens is not None:
            problems.append("optim.micro_batch_tokens is the embedded trainer's (the Megatron trainer takes "
                            "the whole batch in one backward)")
        for name in ("steps", "prompts_per_step", "samples_per_prompt", "engines", "rollout_tp", "trainer_tp",
                     "trainer_pp", "trainer_cp"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        for name in ("max_tokens", "staleness", "warm_start_steps", "locate_every", "threads", "seed",
                     "checkpoint_every", "shaping", "heldout_every", "heldout_prompts"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if problems:
            raise ValueError("invalid run config: " + "; ".join(problems))
        self.sampling()  # validates temperature / top_k / top_p

    @property
    def trainer_ranks(self) -> int:
        """Processes of the trainer: TP x CP x PP (the RayRunner places one actor per rank)."""
        return self.trainer_tp * self.trainer_cp * self.trainer_pp

    def sampling(self, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> SamplingParams:
        """Every rollout request's sampling; `max_tokens` 0 takes `default_max_tokens` (the task's)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p,
                              max_tokens=self.max_tokens or default_max_tokens, seed=self.seed)

    @property
    def sampling_params(self) -> SamplingParams:
        """`sampling()` (the processed distribution is what callers read here)."""
        return self.sampling()

    def with_resolved_dtype(self) -> tuple["RunConfig", str]:
        """The config with a concrete dtype, and why that dtype ("auto": chosen from the device)."""
        if self.dtype != "auto":
            return self, f"{self.dtype} was asked for"
        from rlkit.hardware import default_dtype

        dtype, why = default_dtype(self.device)
        return self.replace(dtype=dtype), f"auto: {why}"

    def contract(self) -> NumericsContract:
        base = NumericsContract.named(self.contract_name).with_every_op(self.path)
        return base.with_ops(**dict(self.ops)) if self.ops else base

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: the per-op overrides as an {op: path} mapping."""
        data = dataclasses.asdict(self)
        data["ops"] = dict(self.ops)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        data = dict(data)
        if "preset" in data:  # stores written before the field was named `model`
            data.setdefault("model", data.pop("preset"))
        data.setdefault("contract_name", V2_NAME)  # stores written before contract v3
        optim = data.pop("optim", {})
        engine = data.pop("engine", {})
        if "betas" in optim:
            optim["betas"] = tuple(optim["betas"])
        return cls(**data, optim=OptimConfig(**optim), engine=EngineConfig(**engine))

    def replace(self, **kw) -> "RunConfig":
        return dataclasses.replace(self, **kw)


def _op_pairs(ops) -> tuple[tuple[str, str], ...]:
    """Per-op overrides from a mapping or (op, path) pairs (a JSON list of lists too) -> sorted pairs."""
    try:
        return tuple(sorted(dict(ops).items()))
    except (TypeError, ValueError):
        raise ValueError(f"invalid run config: ops={ops!r} (a mapping op -> strict | native)") from None


def lab_default(**overrides) -> RunConfig:
    """The lab's default run: the tiny Qwen3 learning single-digit addition on the CPU in minutes.
    A brief supervised warm start gives it a reward above zero; RL then raises it."""
    cfg = RunConfig(model="tiny", task="arith", steps=50, prompts_per_step=8, samples_per_prompt=8,
                    max_tokens=4, warm_start_steps=100, optim=OptimConfig(lr=1e-3), threads=1,
                    engine=EngineConfig(max_num_seqs=64, max_batch_tokens=2048, num_pages=512))
    return cfg.replace(**overrides)


def validation_0_6b(**overrides) -> RunConfig:
    """The H200 validation run (lab/validate_h200.py): qwen3-0.6b shape (random init), DAPO-Math-17k,
    seed 1234, 2 prompts x 8 samples a step, 512-token responses; decode from CUDA graphs. The ASCII
    shaping term (`shaping`) gives a random model non-zero advantages, so its weights move every step.
    Checkpoints only at the end and where a stop request ends a stretch, so the run continues in the
    next device call (`--resume`)."""
    cfg = RunConfig(model="qwen3-0.6b", dtype="bfloat16", device="cuda", task="dapo", steps=200, seed=1234,
                    prompts_per_step=2, samples_per_prompt=8, max_tokens=512, shaping=0.1, locate_every=0,
                    checkpoint_every=200,
                    engine=EngineConfig(page_size=16, num_pages=2048, max_num_seqs=16, max_batch_tokens=4096,
                                        max_model_len=1024),
                    optim=OptimConfig(lr=1e-6, max_batch_tokens=16384))
    return cfg.replace(**overrides)


def learning_0_6b(**overrides) -> RunConfig:
    """One arm of the learning runs (lab/learning_h200.py): qwen3-0.6b shape started from a warm-start
    checkpoint (`init_checkpoint`, rlkit/warmstart.py), nine-digit addition worked column by column from
    labelled column pairs ("add9c": 95-token prompts, 153-162-token responses, ~157 on average;
    rlkit/data/arith.py), seed 1234, 16 prompts x 16 samples a step (group spread for GRPO): 256 x 157 =
    ~40 k compared response tokens a step, ~12 M in 300 steps (issue 17 asks >= 10 M). The held-out
    reward (256 prompts) every 10 steps, a checkpoint every 50 steps and where a stop request ends a device
    call. The engine holds the whole step at once: 256 sequences of up to 288 positions (the 95-token
    prompt + the task's 192 new tokens) in 256 x 18 pages of 16, and the step's ~24 k prompt tokens
    prefill in 16,384-token forwards. The trainer takes the ~65 k tokens (prompt + response) of a step in
    two 32,768-token micro-batches, each one packed forward: on the H200 a train step took 0.71 s strict /
    0.67 s native against 1.43 / 0.98 s in 8,192-token ones (fewer, larger launches: the trainer was bound
    by the host's launch rate), at a peak of 65 / 76 GiB (lab/LOG.md 2026-12-02, session 10). The learning
    rate is a first guess for RL after a supervised start from scratch at 3e-4 (not tuned)."""
    cfg = RunConfig(model="qwen3-0.6b", dtype="bfloat16", device="cuda", task="add9c", steps=300, seed=1234,
                    prompts_per_step=16, samples_per_prompt=16, locate_every=0, checkpoint_every=50,
                    heldout_every=10, heldout_prompts=256,
                    engine=EngineConfig(page_size=16, num_pages=4608, max_num_seqs=256, max_batch_tokens=16384,
                                        max_model_len=288),
                    optim=OptimConfig(lr=1e-5, max_batch_tokens=32768, micro_batch_tokens=32768))
    return cfg.replace(**overrides)


RUN_PRESETS = {"lab": lab_default, "validation-0.6b": validation_0_6b, "learning-0.6b": learning_0_6b}
"""Run presets by name (complete RunConfigs); model presets are rlkit.model.MODEL_PRESETS."""
