"""The numerics contract: the data that both the trainer and the rollout engine execute.

A `NumericsContract` says, for every op of a dense Qwen3 forward, which path runs (`strict` or `native`)
and, for the strict path, everything that decides the bits of the result: how each reduction is cut and
merged, the precision of every intermediate, where each rounding sits and which math primitives are used.
The strict implementations in `rlkit.kernels` read these fields; nothing else decides their bits.

Why frozen data and not flags spread over modules: the contract's `fingerprint()` is stored in every
rollout record and every trainer recompute, and comparison code refuses to compare records made under
different fingerprints. A toggle (`contract.with_ops(attention="native")`) is a new contract with a new
fingerprint, so a record always says exactly which numerics produced it.

    >>> from rlkit import NumericsContract
    >>> c = NumericsContract.default()
    >>> c.fingerprint()            # stable across processes and machines
    >>> c.with_ops(attention="native").paths.attention
    'native'
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

OPS = ("rms_norm", "linear", "swiglu", "rope", "attention", "logprob", "all_reduce")
PATHS = ("strict", "native")
ACCUMULATE_DTYPES = ("float32",)


class ContractError(ValueError):
    """An invalid contract: names the field, the value given and the values allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str):
        self.field_name, self.value, self.allowed = field_name, value, allowed
        super().__init__(f"invalid numerics contract: {field_name}={value!r}; allowed: {allowed}")


def _power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ContractError(name, value, "a positive integer")


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ContractError(name, value, " | ".join(allowed))


class _Section:
    """A contract section checks itself when built, so a bad value fails where it is written."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:  # pragma: no cover - every section defines it
        raise NotImplementedError


@dataclass(frozen=True)
class OpPaths(_Section):
    """Which implementation each op runs: `strict` (the contract's kernels) or `native` (plain torch)."""

    rms_norm: str = "strict"
    linear: str = "strict"
    swiglu: str = "strict"
    rope: str = "strict"
    attention: str = "strict"
    logprob: str = "strict"
    all_reduce: str = "strict"

    def validate(self) -> None:
        for op in OPS:
            _one_of(f"paths.{op}", getattr(self, op), PATHS)


@dataclass(frozen=True)
class GemmSpec(_Section):
    """GEMM (every linear layer and the lm_head): y[m, n] = sum_k x[m, k] * w[n, k]."""

    k_chunks: int = 4
    """K is cut into this many equal contiguous chunks. Each chunk is summed on its own in fp32 and the
    chunk partials are combined by `combine` in fp32. A power of two, so that a row-parallel layer split
    over TP ranks (TP dividing k_chunks) owns whole subtrees: TP 1, 2 and 4 then give the same bits."""
    combine: str = "pairwise_tree"
    """How chunk partials merge: adjacent pairs, level by level ((c0+c1)+(c2+c3))."""
    row_tile: int = 16
    """Rows per GEMM call on the CPU: every strict backend GEMM call has exactly this many rows (padded),
    so the backend's blocking, and each row's reduction order, never depends on the batch size."""
    k_tile: int = 64
    """GPU kernels: K elements per pipelined step inside a chunk; steps accumulate sequentially in order."""
    accumulate: str = "float32"
    """Products and sums in fp32 (bf16 inputs are widened exactly; bf16*bf16 products are exact in fp32)."""
    output_rounding: str = "once"
    """The combined fp32 sum is rounded to the output dtype once, round-to-nearest-even."""

    def validate(self) -> None:
        _positive_int("gemm.k_chunks", self.k_chunks)
        if not _power_of_two(self.k_chunks):
            raise ContractError("gemm.k_chunks", self.k_chunks, "a power of two (1, 2, 4, 8, ...)")
        _one_of("gemm.combine", self.combine, ("pairwise_tree",))
        _positive_int("gemm.row_tile", self.row_tile)
        _positive_int("gemm.k_tile", self.k_tile)
        _one_of("gemm.accumulate", self.accumulate, ACCUMULATE_DTYPES)
        _one_of("gemm.output_rounding", self.output_rounding, ("once",))


@dataclass(frozen=True)
class AttentionSpec(_Section):
    """Causal GQA attention; the same schedule for varlen prefill, chunked prefill and paged decode."""

    split_size: int = 256
    """KV positions [s*split, (s+1)*split) form split s. A query at position p uses splits 0..p//split,
    whether it is computed in a prefill, a chunked prefill or a decode step."""
    block_size: int = 32
    """Inside a split, keys are consumed in blocks of this many positions, in order, by an online softmax.
    Blocks are aligned to absolute positions, so a query sees the same blocks in every mode."""
    split_combine: str = "pairwise_tree"
    """Split states (max, sum, unnormalized output) merge through their log-sum-exp in a pairwise tree
    over split index; a split with no visible key is an exact pass-through."""
    dot_reduction: str = "pairwise_tree"
    """q.k over head_dim and p.V over a block: fp32 pairwise trees."""
    accumulate: str = "float32"
    score_scale: str = "multiply_after_dot"
    """scores = (q.k) * head_dim**-0.5 in fp32."""

    def validate(self) -> None:
        _positive_int("attention.split_size", self.split_size)
        _positive_int("attention.block_size", self.block_size)
        if self.split_size % self.block_size:
            raise ContractError(
                "attention.split_size", self.split_size,
                f"a multiple of attention.block_size ({self.block_size})")
        _one_of("attention.split_combine", self.split_combine, ("pairwise_tree",))
        _one_of("attention.dot_reduction", self.dot_reduction, ("pairwise_tree",))
        _one_of("attention.accumulate", self.accumulate, ACCUMULATE_DTYPES)
        _one_of("attention.score_scale", self.score_scale, ("multiply_after_dot",))


@dataclass(frozen=True)
class LogprobSpec(_Section):
    """log p(token) = logit[token] - logsumexp(logits), from the lm_head GEMM (GemmSpec) in fp32."""

    vocab_chunk: int = 8192
    """The vocabulary is cut into chunks of this many entries (the last one shorter); each chunk yields
    (max, sum of exp(x - max)) with a pairwise tree; chunks merge by a pairwise LSE tree in fp32."""
    logits_dtype: str = "float32"
    """The lm_head result is kept in fp32 (its GEMM's single rounding is to fp32, not to the model dtype)."""
    row_block: int = 256
    """Rows processed at once, so no [tokens x vocab] fp32 tensor is held for raw logprobs."""
    temperature_op: str = "divide"
    """Processed logprobs: logits / temperature in fp32, then top-k, then top-p, then renormalize."""

    def validate(self) -> None:
        _positive_int("logprob.vocab_chunk", self.vocab_chunk)
        _one_of("logprob.logits_dtype", self.logits_dtype, ACCUMULATE_DTYPES)
        _positive_int("logprob.row_block", self.row_block)
        _one_of("logprob.temperature_op", self.temperature_op, ("divide",))


@dataclass(frozen=True)
class RmsNormSpec(_Section):
    """y = weight * (x * rsqrt(mean(x^2) + eps)), with an optional residual add before it."""

    sum_of_squares: str = "pairwise_tree"
    """fp32 squares summed over the hidden dim by a pairwise tree, then multiplied by 1/hidden."""
    weight_multiply: str = "model_dtype"
    """`model_dtype`: normalize in fp32, round to the model dtype, multiply by the weight there (the HF
    Qwen3 order); `float32`: multiply in fp32 and round once."""
    residual_add: str = "model_dtype"
    """The residual add rounds to the model dtype before the norm reads it."""

    def validate(self) -> None:
        _one_of("rms_norm.sum_of_squares", self.sum_of_squares, ("pairwise_tree",))
        _one_of("rms_norm.weight_multiply", self.weight_multiply, ("model_dtype", "float32"))
        _one_of("rms_norm.residual_add", self.residual_add, ("model_dtype",))


@dataclass(frozen=True)
class ElementwiseSpec(_Section):
    """SwiGLU and RoPE: where the fp32 -> model-dtype roundings sit."""

    swiglu: str = "float32_once"
    """silu(gate) * up computed in fp32 as gate * sigmoid(gate) * up, rounded once."""
    rope_tables: str = "float64_then_float32"
    """cos/sin computed in float64 on the CPU from (position, inv_freq) and rounded to fp32 once; the same
    table on every device."""
    rope_apply: str = "float32_once"
    """x * cos + rotate_half(x) * sin in fp32, rounded once."""

    def validate(self) -> None:
        _one_of("elementwise.swiglu", self.swiglu, ("float32_once",))
        _one_of("elementwise.rope_tables", self.rope_tables, ("float64_then_float32",))
        _one_of("elementwise.rope_apply", self.rope_apply, ("float32_once",))


@dataclass(frozen=True)
class CollectiveSpec(_Section):
    """all_reduce: every rank contributes one fp32 partial; all are gathered and combined in rank order
    by the same pairwise tree as the GEMM's chunks (never a ring or the library's choice)."""

    combine: str = "pairwise_tree"
    wire_dtype: str = "float32"

    def validate(self) -> None:
        _one_of("collectives.combine", self.combine, ("pairwise_tree",))
        _one_of("collectives.wire_dtype", self.wire_dtype, ACCUMULATE_DTYPES)


@dataclass(frozen=True)
class Primitives(_Section):
    """The math primitives the strict path calls, by name. On the CPU they are torch's; GPU kernels name
    their own (e.g. exp through exp2) in the kernel files."""

    exp: str = "exp"
    log: str = "log"
    rsqrt: str = "rsqrt"
    sigmoid: str = "1/(1+exp(-x))"

    def validate(self) -> None:
        _one_of("primitives.exp", self.exp, ("exp",))
        _one_of("primitives.log", self.log, ("log",))
        _one_of("primitives.rsqrt", self.rsqrt, ("rsqrt",))
        _one_of("primitives.sigmoid", self.sigmoid, ("1/(1+exp(-x))",))


_SECTIONS = {
    "paths": OpPaths, "gemm": GemmSpec, "attention": AttentionSpec, "logprob": LogprobSpec,
    "rms_norm": RmsNormSpec, "elementwise": ElementwiseSpec, "collectives": CollectiveSpec,
    "primitives": Primitives,
}


@dataclass(frozen=True)
class NumericsContract:
    """A named, versioned, frozen numerics contract. Build with `default()` and derive with `with_ops`."""

    name: str = "qwen3-dense-strict-v1"
    version: int = 1
    paths: OpPaths = field(default_factory=OpPaths)
    gemm: GemmSpec = field(default_factory=GemmSpec)
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    logprob: LogprobSpec = field(default_factory=LogprobSpec)
    rms_norm: RmsNormSpec = field(default_factory=RmsNormSpec)
    elementwise: ElementwiseSpec = field(default_factory=ElementwiseSpec)
    collectives: CollectiveSpec = field(default_factory=CollectiveSpec)
    primitives: Primitives = field(default_factory=Primitives)

    def __post_init__(self) -> None:
        self.validate()

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def default(cls) -> "NumericsContract":
        """`qwen3-dense-strict-v1` with every op on the strict path."""
        return cls()

    @classmethod
    def native(cls) -> "NumericsContract":
        """The same contract with every op on the native path (what frameworks do today)."""
        return cls().with_every_op("native")

    def with_every_op(self, path: str) -> "NumericsContract":
        """A new contract with every op on `path` (strict | native), the other fields kept."""
        return self.with_ops(**{op: path for op in OPS})

    def with_ops(self, **paths: str) -> "NumericsContract":
        """A new contract with the given ops switched, e.g. `with_ops(attention="native")`."""
        for op, path in paths.items():
            if op not in OPS:
                raise ContractError("paths", op, " | ".join(OPS))
            _one_of(f"paths.{op}", path, PATHS)
        return dataclasses.replace(self, paths=dataclasses.replace(self.paths, **paths))

    def replace(self, **sections: Any) -> "NumericsContract":
        """A new contract with whole sections or fields replaced, e.g.
        `replace(attention=AttentionSpec(split_size=64, block_size=16))`."""
        return dataclasses.replace(self, **sections)

    @classmethod
    def parse_ops(cls, text: str) -> dict[str, str]:
        """Parse a CLI `--ops attention=native,linear=strict` value into keyword arguments for with_ops."""
        out: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            op, sep, path = item.partition("=")
            if not sep:
                raise ContractError("ops", item, "op=path pairs, e.g. attention=native")
            op, path = op.strip(), path.strip()
            if op not in OPS:
                raise ContractError("ops", op, " | ".join(OPS))
            _one_of(f"paths.{op}", path, PATHS)
            out[op] = path
        return out

    # -- checks and identity ------------------------------------------------------------------
    def validate(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ContractError("name", self.name, "a non-empty string")
        _positive_int("version", self.version)
        for section, kind in _SECTIONS.items():
            value = getattr(self, section)
            if not isinstance(value, kind):
                raise ContractError(section, value, f"a {kind.__name__}")
            value.validate()

    def path(self, op: str) -> str:
        if op not in OPS:
            raise ContractError("op", op, " | ".join(OPS))
        return getattr(self.paths, op)

    def op_paths(self) -> dict[str, str]:
        """{op: path} for every op, in OPS order (what records and summaries store)."""
        return {op: self.path(op) for op in OPS}

    @property
    def all_strict(self) -> bool:
        return all(self.path(op) == "strict" for op in OPS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; the fingerprint hashes exactly this text."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NumericsContract":
        if not isinstance(data, dict):
            raise ContractError("contract", type(data).__name__, "a JSON object")
        known = {"name", "version", *_SECTIONS}
        for key in data:
            if key not in known:
                raise ContractError(key, data[key], "fields " + ", ".join(sorted(known)))
        kwargs: dict[str, Any] = {k: data[k] for k in ("name", "version") if k in data}
        for section, kind in _SECTIONS.items():
            if section not in data:
                continue
            raw = data[section]
            names = {f.name for f in dataclasses.fields(kind)}
            if not isinstance(raw, dict):
                raise ContractError(section, raw, "a JSON object")
            for key in raw:
                if key not in names:
                    raise ContractError(f"{section}.{key}", raw[key], ", ".join(sorted(names)))
            kwargs[section] = kind(**raw)
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> "NumericsContract":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ContractError("json", text[:40], f"valid JSON ({exc.msg})") from None
        return cls.from_dict(data)

    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the canonical JSON: the same in every process and machine."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def summary(self) -> str:
        paths = " ".join(f"{op}={self.path(op)}" for op in OPS)
        return f"{self.name} v{self.version} [{self.fingerprint()}] {paths}"
