"""What goes into a rollout engine and what comes out; shared by the embedded and the vLLM engines."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.kernels.logprob import SamplingParams
from rlkit.model.tokenizer import STOP_IDS

LOGPROB_MODES = ("raw", "processed", "both")


@dataclass(frozen=True)
class SamplingConfig:
    """Per-request sampling. `seed` makes the request's draws reproducible whatever its batch."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = STOP_IDS
    seed: int = 0

    def __post_init__(self) -> None:
        self.params  # validates temperature / top_k / top_p
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r}; expected an integer >= 1")

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    logprobs_mode: str = "both"
    """raw: the model's distribution; processed: after temperature/top-k/top-p; both."""

    def __post_init__(self) -> None:
        if self.logprobs_mode not in LOGPROB_MODES:
            raise ValueError(f"logprobs_mode={self.logprobs_mode!r}; expected one of {LOGPROB_MODES}")
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")


@dataclass
class GenerationResult:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    raw_logprobs: list[float] | None = None
    processed_logprobs: list[float] | None = None
    finish_reason: str = ""
    """stop | length | error"""
    weight_version: int = -1
    contract_fingerprint: str = ""
    engine_id: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
