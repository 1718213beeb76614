"""What goes into a rollout engine and what comes out; shared by the embedded and the vLLM engines."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.types import SamplingParams

LOGPROB_MODES = ("raw", "processed", "both")


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
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
