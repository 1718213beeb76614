"""Typed timeline records: what the orchestration role remembers about every step of a run.

Each record is a frozen dataclass that checks itself when built and converts to and from a plain dict
(JSON-ready: `json.dumps(r.to_dict())` works, non-finite floats as JSON's NaN/Infinity extension):

- `WeightVersion`  a set of weights the trainer published (version, checksum, contract fingerprint);
- `SyncEvent`      one engine loading one version and acknowledging its checksum (`ok` when they match);
- `RolloutRecord`  one sampled response: which step, prompt, engine and weight version made it, its
                   tokens and the logprobs the rollout recorded while decoding;
- `Recompute`      the trainer's logprobs for a record's tokens, and the version/contract it used;
- `StepSummary`    one RL step: divergence metrics, loss, rewards, clip fraction, ops' paths, timings;
- `ToggleRequest`  someone (the dashboard) asked to switch an op's path;
- `ToggleEvent`    the run applied a switch at a step boundary;
- `CheckpointRef`  where the weights after a step were saved, for `--resume`.

Why the checks: a logprob list is stored as fp32 bits, so a record only accepts values that *are* fp32
values (pass `tensor.float().tolist()` or a tensor; an fp64 value that fp32 cannot hold is refused rather
than rounded silently), and its logprobs must line up with its tokens one to one.

    >>> rec = RolloutRecord.from_generation(result, step=3, prompt_id="arith-17", sample_index=0,
    ...                                     reward=1.0, sampling=cfg)
    >>> RolloutRecord.from_dict(rec.to_dict()) == rec
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rlkit.contract import OPS, PATHS
from rlkit.types import SAMPLING_RECORD_KEYS, SamplingParams

SAMPLING_KEYS = SAMPLING_RECORD_KEYS  # the keys a record stores, from the one sampling type
_INT32_MAX = 2**31 - 1


class RecordError(ValueError):
    """A record that cannot be built: names the record type, the field and what was wrong."""


def _fail(kind: str, name: str, why: str) -> RecordError:
    return RecordError(f"{kind}.{name}: {why}")


def fp32_values(kind: str, name: str, values: Any) -> list[float]:
    """The values as Python floats, each exactly an fp32 value; raises if one is not representable.

    Accepts a list/tuple of floats, a numpy array or a torch tensor (any float dtype; bf16/fp16 widen to
    fp32 exactly). -0.0, +-inf and NaN are kept."""
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().float().cpu().numpy()
    arr = np.asarray(values)
    if arr.dtype == np.float32:
        return arr.reshape(-1).tolist()
    if arr.size == 0:
        return []
    if arr.dtype.kind not in "fiu":
        raise _fail(kind, name, f"expected floats, got {arr.dtype}")
    wide = arr.astype(np.float64).reshape(-1)
    narrow = wide.astype(np.float32)
    # A value is an fp32 value iff widening its fp32 rounding gives the same fp64 bits back (NaN aside).
    lost = (narrow.astype(np.float64).view(np.uint64) != wide.view(np.uint64)) & ~np.isnan(wide)
    if lost.any():
        i = int(np.flatnonzero(lost)[0])
        raise _fail(kind, name, f"{int(lost.sum())} value(s) are not fp32 values (first: [{i}] = "
                                f"{float(wide[i])!r}); pass fp32 data, e.g. tensor.float().tolist()")
    return narrow.tolist()


def int32_values(kind: str, name: str, values: Any) -> list[int]:
    """Token ids as Python ints in [0, 2**31 - 1] (they are stored as int32)."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values).reshape(-1)
    if arr.size == 0:
        return []
    if arr.dtype.kind not in "iu":
        raise _fail(kind, name, f"expected integer token ids, got {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX:
        raise _fail(kind, name, f"token ids must lie in [0, {_INT32_MAX}], got [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64).tolist()


class _Record:
    """Shared dict conversion: `to_dict` is JSON-ready, `from_dict` names missing and unknown keys."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # deep copies, so the dict never aliases the record's lists

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise RecordError(f"{cls.__name__}: expected a dict, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        missing = sorted(n for n, f in fields.items() if n not in data
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if unknown or missing:
            raise RecordError(f"{cls.__name__}.from_dict: missing {missing or 'nothing'}, "
                              f"unknown {unknown or 'nothing'}")
        return cls(**data)

    # helpers for __post_init__ of frozen dataclasses: normalize types so a record read back from the
    # store compares equal to the one written (an int 1 given for a float field becomes 1.0).
    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _int(self, *names: str) -> None:
        for n in names:
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise _fail(type(self).__name__, n, f"expected an integer, got {v!r}")
            self._set(n, int(v))

    def _float(self, *names: str) -> None:
        for n in names:
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise _fail(type(self).__name__, n, f"expected a number, got {v!r}")
            self._set(n, float(v))

    def _str(self, *names: str) -> None:
        for n in names:
            if not isinstance(getattr(self, n), str):
                raise _fail(type(self).__name__, n, f"expected a string, got {getattr(self, n)!r}")


def check_op_path(op: str, path: str) -> None:
    """The op and path of a toggle must be ones the numerics contract knows."""
    if op not in OPS:
        raise RecordError(f"unknown op {op!r}; ops: {' | '.join(OPS)}")
    if path not in PATHS:
        raise RecordError(f"unknown path {path!r} for op {op}; paths: {' | '.join(PATHS)}")


@dataclass(frozen=True)
class WeightVersion(_Record):
    """A set of weights the trainer published; version 0 is the initial weights."""

    version: int
    """Monotonic version number: 0 for the initial weights, v + 1 after the update made from version v."""
    step: int
    """The step whose update produced these weights; -1 for the initial weights."""
    checksum: str
    """`rlkit.model.checkpoint.weights_checksum` of the weights; every engine must acknowledge it."""
    contract_fingerprint: str
    """Fingerprint of the numerics contract in effect when the version was published."""
    created_at: float
    """Wall-clock time (time.time()) of publication."""

    def __post_init__(self) -> None:
        self._int("version", "step")
        self._float("created_at")
        self._str("checksum", "contract_fingerprint")
        if self.version < 0:
            raise _fail("WeightVersion", "version", f"must be >= 0, got {self.version}")


@dataclass(frozen=True)
class SyncEvent(_Record):
    """One engine loading one weight version and acknowledging the checksum it computed after loading."""

    engine_id: str
    """The rollout engine that loaded the weights."""
    version: int
    """The weight version sent."""
    checksum_sent: str
    """The checksum the trainer published for that version."""
    checksum_acknowledged: str
    """The checksum the engine computed over the weights it holds after loading."""
    started_at: float
    """Wall-clock time the transfer started."""
    finished_at: float
    """Wall-clock time the acknowledgement arrived."""

    def __post_init__(self) -> None:
        self._int("version")
        self._float("started_at", "finished_at")
        self._str("engine_id", "checksum_sent", "checksum_acknowledged")

    @property
    def ok(self) -> bool:
        """True when the engine holds exactly the weights sent."""
        return self.checksum_sent == self.checksum_acknowledged

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at


@dataclass(frozen=True)
class RolloutRecord(_Record):
    """One sampled response and the logprobs the rollout engine recorded while decoding it."""

    record_id: str
    """Unique within the run; `RolloutRecord.make_id(step, prompt_id, sample_index)` is deterministic, so a
    resumed run gives the same ids."""
    step: int
    """The RL step whose rollout produced it."""
    prompt_id: str
    """The dataset prompt (records of one prompt form a GRPO group)."""
    sample_index: int
    """Index of this sample within its prompt's group."""
    engine_id: str
    """The engine that generated it."""
    weight_version: int
    """The weight version the engine held while generating (must be a stored WeightVersion)."""
    contract_fingerprint: str
    """The numerics contract the engine ran under."""
    prompt_ids: list[int]
    """Prompt token ids."""
    token_ids: list[int]
    """Generated token ids (the response), one per logprob."""
    rollout_logprobs: list[float]
    """The logprob of each generated token as the engine recorded it: fp32 values, kept bit for bit."""
    reward: float
    """The task reward of the response."""
    finish_reason: str
    """stop | length | error."""
    sampling: dict[str, Any]
    """The request's sampling: temperature, top_k, top_p, max_tokens, seed (more keys allowed)."""

    def __post_init__(self) -> None:
        self._str("record_id", "prompt_id", "engine_id", "contract_fingerprint", "finish_reason")
        self._int("step", "sample_index", "weight_version")
        self._float("reward")
        if not self.record_id:
            raise _fail("RolloutRecord", "record_id", "must not be empty")
        self._set("prompt_ids", int32_values("RolloutRecord", "prompt_ids", self.prompt_ids))
        self._set("token_ids", int32_values("RolloutRecord", "token_ids", self.token_ids))
        self._set("rollout_logprobs", fp32_values("RolloutRecord", "rollout_logprobs", self.rollout_logprobs))
        if len(self.token_ids) != len(self.rollout_logprobs):
            raise _fail("RolloutRecord", "rollout_logprobs",
                        f"{len(self.rollout_logprobs)} logprobs for {len(self.token_ids)} tokens "
                        f"(record {self.record_id})")
        self._set("sampling", sampling_dict(self.sampling))

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    def logprobs_array(self) -> np.ndarray:
        """The rollout logprobs as an fp32 numpy array (same bits as stored)."""
        return np.asarray(self.rollout_logprobs, dtype=np.float32)

    @staticmethod
    def make_id(step: int, prompt_id: str, sample_index: int) -> str:
        return f"s{step}/{prompt_id}/{sample_index}"

    @classmethod
    def from_generation(cls, result: Any, *, step: int, prompt_id: str, sample_index: int, reward: float,
                        sampling: Any, logprobs: str = "raw", record_id: str | None = None) -> "RolloutRecord":
        """Build from an engine's `GenerationResult`; `logprobs` picks its raw or processed logprobs."""
        if logprobs not in ("raw", "processed"):
            raise RecordError(f"logprobs={logprobs!r}; expected 'raw' or 'processed'")
        values = result.raw_logprobs if logprobs == "raw" else result.processed_logprobs
        if values is None:
            raise RecordError(f"generation {result.request_id} has no {logprobs} logprobs; request them with "
                              f"logprobs_mode={logprobs!r} or 'both'")
        if not result.ok:
            raise RecordError(f"generation {result.request_id} failed: {result.error}")
        return cls(record_id=record_id or cls.make_id(step, prompt_id, sample_index), step=step,
                   prompt_id=prompt_id, sample_index=sample_index, engine_id=result.engine_id,
                   weight_version=result.weight_version, contract_fingerprint=result.contract_fingerprint,
                   prompt_ids=list(result.prompt_ids), token_ids=list(result.token_ids),
                   rollout_logprobs=values, reward=reward, finish_reason=result.finish_reason,
                   sampling=sampling)


def sampling_dict(sampling: Any) -> dict[str, Any]:
    """A request's sampling (rlkit.types.SamplingParams or a dict) as a plain dict with the five keys
    every record carries; tuples become lists so the dict survives a JSON round trip unchanged."""
    if isinstance(sampling, SamplingParams):
        sampling = sampling.record()
    elif not isinstance(sampling, dict):
        raise RecordError(f"sampling: expected a dict or a SamplingParams, got {type(sampling).__name__}")
    missing = [k for k in SAMPLING_KEYS if k not in sampling]
    if missing:
        raise RecordError(f"sampling: missing {missing}; a record carries {list(SAMPLING_KEYS)}")
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in sampling.items()}


@dataclass(frozen=True)
class Recompute(_Record):
    """The trainer's logprobs for a record's tokens, computed before the update of `step`."""

    record_id: str
    """The RolloutRecord whose tokens were scored."""
    step: int
    """The step whose update used them."""
    weight_version: int
    """The weight version the trainer held when recomputing."""
    contract_fingerprint: str
    """The numerics contract the trainer ran under."""
    trainer_logprobs: list[float]
    """One fp32 logprob per generated token of the record, kept bit for bit."""

    def __post_init__(self) -> None:
        self._str("record_id", "contract_fingerprint")
        self._int("step", "weight_version")
        self._set("trainer_logprobs", fp32_values("Recompute", "trainer_logprobs", self.trainer_logprobs))

    def logprobs_array(self) -> np.ndarray:
        return np.asarray(self.trainer_logprobs, dtype=np.float32)


@dataclass(frozen=True)
class StepSummary(_Record):
    """One RL step, as the progress bar, `rlkit report` and the dashboard show it."""

    step: int
    """Step number, from 0."""
    weight_version: int
    """The version that generated this step's rollouts (and that the trainer recomputed with)."""
    compared_tokens: int
    """Tokens whose rollout and trainer logprobs were compared."""
    mismatch_count: int
    """Tokens whose two logprobs differ in any bit (signed zero included)."""
    max_abs_diff: float
    """Largest |trainer - rollout| over finite differences."""
    mean_abs_diff: float
    """Mean |trainer - rollout| over finite differences."""
    k3_kl: float
    """K3 estimate of KL(rollout || trainer)."""
    ratio_mean: float
    """Mean importance ratio exp(trainer - rollout)."""
    ratio_min: float
    """Smallest importance ratio."""
    ratio_max: float
    """Largest importance ratio."""
    ratio_outside: float
    """Fraction of tokens whose ratio lies outside [0.8, 1.2]."""
    loss: float
    """The policy loss of the update."""
    reward_mean: float
    """Mean reward over the step's records."""
    reward_std: float
    """Standard deviation of the rewards over the step's records."""
    clip_fraction: float
    """Fraction of tokens whose ratio was clipped."""
    ops_paths: dict[str, str]
    """Each op's path (strict | native) in effect during the step."""
    contract_fingerprint: str
    """Fingerprint of the contract in effect during the step."""
    timings: dict[str, float]
    """Seconds per phase (rollout, reward, recompute, update, sync, ...)."""
    first_divergence: dict[str, Any] | None
    """`FirstDivergence.to_dict()` when the locator ran and found one, else None."""
    valid: bool = True
    """False when the step failed (e.g. an engine acknowledged a wrong checksum): nothing from it counts."""
    invalid_reason: str = ""
    """Why the step is not valid (one line); empty when valid."""
    heldout_reward: float | None = None
    """Mean reward on the task's fixed held-out set with the weights this step rolled out with
    (RunConfig.heldout_every); None on steps that did not measure it, and in stores written before."""
    grad_norm: float | None = None
    """The update's global gradient norm before clipping; None where not recorded (older stores, imports)."""
    response_tokens_mean: float | None = None
    """Mean response length in tokens over the step's records (the stop token included)."""
    entropy_estimate: float | None = None
    """Mean of -log p over the sampled response tokens (the rollout's raw logprobs): a Monte Carlo estimate
    of the policy's per-token entropy, unbiased when the sampling is the model's own distribution
    (temperature 1, no top-k / top-p); None otherwise (it would estimate a cross-entropy)."""

    _FLOATS: ClassVar[tuple[str, ...]] = (
        "max_abs_diff", "mean_abs_diff", "k3_kl", "ratio_mean", "ratio_min", "ratio_max", "ratio_outside",
        "loss", "reward_mean", "reward_std", "clip_fraction")
    _OPTIONAL_FLOATS: ClassVar[tuple[str, ...]] = ("heldout_reward", "grad_norm", "response_tokens_mean",
                                                   "entropy_estimate")

    def __post_init__(self) -> None:
        self._int("step", "weight_version", "compared_tokens", "mismatch_count")
        self._float(*self._FLOATS)
        self._float(*(n for n in self._OPTIONAL_FLOATS if getattr(self, n) is not None))
        self._str("contract_fingerprint", "invalid_reason")
        if not isinstance(self.valid, bool):
            raise _fail("StepSummary", "valid", f"expected a bool, got {self.valid!r}")
        paths = dict(self.ops_paths)
        for op, path in paths.items():
            try:
                check_op_path(op, path)
            except RecordError as e:
                raise _fail("StepSummary", "ops_paths", str(e)) from None
        self._set("ops_paths", paths)
        self._set("timings", {str(k): float(v) for k, v in self.timings.items()})
        if self.first_divergence is not None and not isinstance(self.first_divergence, dict):
            raise _fail("StepSummary", "first_divergence", "expected a dict (FirstDivergence.to_dict()) or None")

    @classmethod
    def build(cls, *, step: int, weight_version: int, divergence: Any, **rest: Any) -> "StepSummary":
        """Fill the nine divergence fields from a `DivergenceStats` (or its dict); the rest by keyword."""
        stats = divergence.to_dict() if hasattr(divergence, "to_dict") else dict(divergence)
        return cls(step=step, weight_version=weight_version, **stats, **rest)

    @property
    def bitwise_equal(self) -> bool:
        """Every compared token agreed bit for bit (vacuously true with no tokens)."""
        return self.mismatch_count == 0


@dataclass(frozen=True)
class ToggleRequest(_Record):
    """A request to switch one op's path, applied by the run at its next step boundary."""

    request_id: int
    """Assigned by the store, increasing."""
    op: str
    """One of rlkit.contract.OPS."""
    path: str
    """strict | native."""
    requested_at: float
    """Wall-clock time of the request."""
    source: str
    """Who asked: dashboard | cli | notebook | ..."""

    def __post_init__(self) -> None:
        self._int("request_id")
        self._float("requested_at")
        self._str("op", "path", "source")
        check_op_path(self.op, self.path)


@dataclass(frozen=True)
class ToggleEvent(_Record):
    """An op's path switched at a step boundary; `step` is the first step run with the new path."""

    step: int
    """The first step run with the new path."""
    op: str
    """One of rlkit.contract.OPS."""
    path: str
    """strict | native: the op's path from `step` on."""
    requested_at: float
    """When it was asked for (equals applied_at for a toggle the run made itself)."""
    applied_at: float
    """When the run switched, before `step` started."""
    source: str
    """Who asked: dashboard | cli | notebook | ..."""
    new_fingerprint: str
    """Fingerprint of the contract after the switch."""
    request_id: int | None = None
    """The ToggleRequest it answers; the store marks that request applied in the same transaction."""

    def __post_init__(self) -> None:
        self._int("step")
        self._float("requested_at", "applied_at")
        self._str("op", "path", "source", "new_fingerprint")
        if self.request_id is not None:
            self._int("request_id")
        check_op_path(self.op, self.path)

    @property
    def latency(self) -> float:
        return self.applied_at - self.requested_at


@dataclass(frozen=True)
class CheckpointRef(_Record):
    """Where the weights after `step` were saved; `--resume` loads the last one."""

    step: int
    """The complete step whose update produced the saved weights."""
    path: str
    """File or folder of the checkpoint (relative paths are relative to the run directory)."""
    saved_at: float = 0.0
    """Wall-clock time the reference was stored."""

    def __post_init__(self) -> None:
        self._int("step")
        self._float("saved_at")
        self._str("path")


def _float_bits(values: list) -> np.ndarray:
    # fp64 bits: widening fp32 to fp64 is exact and keeps the sign of zero, so this compares fp32 lists too.
    return np.asarray(values, dtype=np.float64).view(np.uint64)


def _canonical(x: Any) -> Any:
    if isinstance(x, float):
        return ("f", int(_float_bits([x])[0]))
    if isinstance(x, dict):
        return ("d", tuple(sorted((k, _canonical(v)) for k, v in x.items())))
    if isinstance(x, (list, tuple)):
        return ("l", tuple(_canonical(v) for v in x))
    return x


def bitwise_differences(a: Any, b: Any) -> list[str]:
    """How two records differ, field by field, with floats compared on their bits (-0.0 differs from 0.0,
    NaN equals NaN); [] when they are identical. `==` on records is value equality and would miss a sign
    flip; resume tests and golden-run comparisons use this."""
    if type(a) is not type(b):
        return [f"record types differ: {type(a).__name__} vs {type(b).__name__}"]
    out = []
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if (isinstance(x, list) and isinstance(y, list) and len(x) == len(y) and x
                and all(isinstance(v, float) for v in x + y)):
            bad = np.flatnonzero(_float_bits(x) != _float_bits(y))
            if bad.size:
                i = int(bad[0])
                out.append(f"{f.name}: {bad.size} of {len(x)} values differ in bits, first [{i}]: "
                           f"{x[i]!r} vs {y[i]!r}")
        elif _canonical(x) != _canonical(y):
            out.append(f"{f.name}: {x!r} vs {y!r}")
    return out
