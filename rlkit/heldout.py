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
