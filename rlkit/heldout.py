"""The held-out reward: a task's fixed held-out prompts, one sample each, decoded by a rollout engine.

One definition serves both places that measure a policy: the supervised warm start (rlkit/warmstart.py,
which stops once the reward lies in a target band) and the RL loop (`RunConfig.heldout_every`, stored in
the step's summary). Request ids are fixed ("heldout-<i>"), and a request's sampling noise comes from its
own generator seeded by (seed, request id): every evaluation of every run with one seed draws the same
noise, so two arms' held-out curves differ by their weights alone, and generating them changes nothing
in the training rollouts.

    held = HeldoutSet.build("add8w", 256, SamplingParams(max_tokens=192, seed=0))   # the task's default_max_tokens
    score = held.score(engine.generate(held.requests()))
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.data.datasets import Problem
from rlkit.data.tasks import Task, task as get_task
from rlkit.model.tokenizer import chat_prompt_ids, decode, load_tokenizer
from rlkit.rollout.types import GenerationRequest, GenerationResult
from rlkit.types import SamplingParams

DECODES = ("sample", "greedy")


def decode_sampling(decode_mode: str, *, temperature: float, max_tokens: int, seed: int) -> SamplingParams:
    """The sampling of an evaluation: "sample" at `temperature`, or "greedy" (top_k=1)."""
    if decode_mode not in DECODES:
        raise ValueError(f"decode {decode_mode!r}: expected one of {', '.join(DECODES)}")
    if decode_mode == "greedy":
        return SamplingParams(temperature=1.0, top_k=1, max_tokens=max_tokens, seed=seed)
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)


@dataclass(frozen=True)
class HeldoutScore:
    reward: float
    """Mean reward over the held-out prompts."""
    n: int
    response_tokens_mean: float
    """Mean response length in tokens (the stop token included)."""

    def to_dict(self) -> dict:
        return {"reward": self.reward, "n": self.n, "response_tokens_mean": self.response_tokens_mean}


@dataclass(frozen=True)
class HeldoutSet:
    task: Task
    problems: tuple[Problem, ...]
    prompts: tuple[tuple[int, ...], ...]
    sampling: SamplingParams

    @classmethod
    def build(cls, task_name: str, n: int, sampling: SamplingParams, tokenizer=None) -> "HeldoutSet":
        if n < 1:
            raise ValueError(f"a held-out set needs at least one prompt, got {n}")
        t = get_task(task_name)
        tok = tokenizer or load_tokenizer()
        problems = tuple(t.heldout(n))
        return cls(t, problems, tuple(tuple(chat_prompt_ids(p.user_message(), tok)) for p in problems), sampling)

    def requests(self) -> list[GenerationRequest]:
        return [GenerationRequest(f"heldout-{i}", prompt, self.sampling, logprobs_mode="raw")
                for i, prompt in enumerate(self.prompts)]

    def score(self, results: list[GenerationResult], tokenizer=None) -> HeldoutScore:
        errors = [r.error for r in results if not r.ok]
        if errors:
            raise RuntimeError(f"held-out generation failed: {errors[0]}")
        if len(results) != len(self.problems):
            raise ValueError(f"{len(results)} held-out results for {len(self.problems)} prompts")
        tok = tokenizer or load_tokenizer()
        rewards = [self.task.reward(decode(r.token_ids, tok), p.answer) for r, p in zip(results, self.problems)]
        return HeldoutScore(sum(rewards) / len(rewards), len(rewards),
                            sum(len(r.token_ids) for r in results) / len(results))


@dataclass(frozen=True)
class HeldoutRise:
    """How far a run's held-out reward rose from its first evaluation, measured against the run's own
    evaluation-to-evaluation noise (issue 17: "rises above its warm-start value by more than its noise").

    `noise` is the standard deviation of the change from one evaluation to the next over the whole run.
    It counts the real learning between evaluations as noise too, so it overstates the noise of a run
    that is still climbing: a rise that clears it clears the sampling noise with room to spare. The
    held-out prompts and their sampling noise are fixed (HeldoutSet), so two evaluations differ by the
    weights alone; `sampling_se` is the binomial standard error of one evaluation's mean at `start`,
    for a 0/1 reward over `n_prompts` prompts."""

    steps: tuple[int, ...]
    rewards: tuple[float, ...]
    tail: int
    n_prompts: int | None

    @property
    def start(self) -> float:
        """The first evaluation: a run's step 0 scores the weights it started from."""
        return self.rewards[0]

    @property
    def end(self) -> float:
        """The mean of the last `tail` evaluations."""
        last = self.rewards[-self.tail:]
        return sum(last) / len(last)

    @property
    def rise(self) -> float:
        return self.end - self.start

    @property
    def noise(self) -> float:
        changes = [b - a for a, b in zip(self.rewards, self.rewards[1:])]
        mean = sum(changes) / len(changes)
        return (sum((c - mean) ** 2 for c in changes) / (len(changes) - 1)) ** 0.5

    @property
    def sampling_se(self) -> float | None:
        if not self.n_prompts:
            return None
        return (self.start * (1 - self.start) / self.n_prompts) ** 0.5

    def summary(self) -> str:
        se = "" if self.sampling_se is None else f"; one evaluation's binomial s.e. at the start {self.sampling_se:.3f}"
        return (f"held-out reward {self.start:.3f} at step {self.steps[0]} -> {self.end:.3f} (mean of the last "
                f"{self.tail} of {len(self.rewards)} evaluations): a rise of {self.rise:+.3f}, "
                f"{self.rise / self.noise:.1f}x the evaluation-to-evaluation noise {self.noise:.3f}{se}")


def heldout_rise(steps, tail: int = 5, n_prompts: int | None = None) -> HeldoutRise:
    """The held-out rise of a run from its step summaries (RunStore.steps()); the steps that did not
    evaluate (heldout_reward None) are left out. Needs at least `tail` + 2 evaluations."""
    if tail < 1:
        raise ValueError(f"tail must be at least 1, got {tail}")
    held = [(s.step, s.heldout_reward) for s in steps if s.heldout_reward is not None]
    if len(held) < tail + 2:
        raise ValueError(f"{len(held)} held-out evaluations; the rise against the noise needs at least {tail + 2} "
                         f"(RunConfig.heldout_every sets how often a run evaluates)")
    return HeldoutRise(tuple(s for s, _ in held), tuple(float(r) for _, r in held), tail, n_prompts)
