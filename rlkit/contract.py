"""The numerics contract: the data that both the trainer and the rollout engine execute.

A `NumericsContract` says, for every op of a dense Qwen3 forward, which path runs (`strict` or `native`)
and, for the strict path, every parameter that decides the bits of the result: how each reduction is cut
(GEMM K chunks, attention splits and blocks, vocab chunks, the top-p scan block), the CPU GEMM's row
tile, where the RMSNorm weight multiply rounds, and what the GPU compiler may fuse. What has exactly one
implementation (every tree is the canonical pairwise tree of kernels/tree.py, every accumulation fp32,
every rounding once where the reference rounds) is stated in the section docstrings, not as fields.
Every field has a reader in `rlkit.kernels` (paths: in `rlkit.ops`); nothing else decides their bits.

Where a value is refused: when the contract is built. A contract is shared by both sides of a run, so
a value no kernel implements (a K chunk count that is not a power of two, FMA fusion, ...) fails where
it is written with a `ContractError` naming the field, never later on one side. Within the accepted
values, a GPU kernel that does not cover a case (e.g. a K chunk count above 8) runs the torch reference
for it, which defines the contract (kernels/*.py say which cases each kernel covers).

Why frozen data and not flags spread over modules: the contract's `fingerprint()` is stored in every
rollout record and every trainer recompute, and comparison code refuses to compare records made under
different fingerprints. A toggle (`contract.with_ops(attention="native")`) is a new contract with a new
fingerprint, so a record always says exactly which numerics produced it.

Versions. The fingerprint hashes the canonical JSON of the contract in its version's field set, so it
changes with any field's value, any op's path, the name, the version, and the field set itself.
`qwen3-dense-strict-v2` dropped v1's fields that no code read (each had one allowed value) and added
`logprob.top_p_scan_block` and `gpu.fp_fusion`, which v1's kernels fixed at 1024 and False; the kernels
compute the same bits under both. `qwen3-dense-strict-v3` adds `gemm.column_k_chunks`: the
K-chunk tree stays only where tensor parallelism splits K (the row-parallel o_proj and down_proj); the
column-parallel layers and the lm_head, whose K is never split across ranks, sum K in one fp32 chain
(column_k_chunks = 1), which every layout invariance allows and which runs at cuBLAS speed on the GPU
(lab/KERNELS_NOTES.md). Its bits differ from v2's in those layers. `qwen3-dense-strict-v4` adds
`attention.split_merge` and `attention.row_sum`: split states fold in split order (no merge stack)
and a block's probabilities are summed by the matrix unit that computes p.V, so the attention kernel
may run a small tile in decode and a large one in prefill and still give every mode the same bits; its
key blocks are 64 positions and its splits 512 (32 and 256 before).
Its attention bits differ from v3's; everything else is v3's. `qwen3-dense-strict-v5` adds
`gemm.chunk_merge`: a row-parallel GEMM's four chunk sums are added in chunk order instead of the pairwise
tree, so a GPU program that sums every chunk of a tile holds two accumulators instead of three (on the
H200 its o/down projections ran 10-20 % faster than v4's at M >= 1024); a TP rank then contributes its
chunk sums unmerged. Its row-parallel GEMM bits differ from v4's; everything else is v4's.
`qwen3-dense-strict-v6` (the default, `DEFAULT_NAME`) sets `gemm.chunk_merge = "chained"`: a row-parallel chunk's sum
starts from the running fp32 sum of the chunks before it instead of from zero, so on the GPU the layer is
one chain over K, the column layers' arithmetic (any tile, cuBLAS without split-K), and no kernel holds a
second accumulator; under tensor parallelism the ranks pass that running sum on in rank order (rank r
continues the chain of ranks 0..r-1; kernels/collectives.py `chain`). Its row-parallel bits differ from
v5's; everything else is v5's. Older versions stay selectable
(`NumericsContract.named(...)`): each serializes its own field set and keeps the fingerprints its runs
recorded (v1: b8dbda3e304b4df3, all strict). A run's records are compared only with records of the same
fingerprint, so runs of two versions are never compared (`rlkit.divergence.check_fingerprints` names both
contracts).

    >>> from rlkit import NumericsContract
    >>> c = NumericsContract.default()
    >>> c.fingerprint()            # stable across processes and machines
    >>> c.with_ops(attention="native").paths.attention
    'native'
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

OPS = ("rms_norm", "linear", "swiglu", "rope", "attention", "logprob", "all_reduce")
PATHS = ("strict", "native")


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


CHUNK_MERGES = ("chained", "sequential", "pairwise_tree")


@dataclass(frozen=True)
class GemmSpec(_Section):
    """GEMM (every linear layer and the lm_head): y[m, n] = sum_k x[m, k] * w[n, k].

    Fixed by the structure (not fields): products and sums in fp32 (bf16 inputs widen exactly; bf16 x
    bf16 products are exact in fp32); the combined fp32 sum rounds once to the output dtype."""

    k_chunks: int = 4
    """K is cut into this many equal contiguous chunks. Each chunk is summed on its own in fp32 and the
    chunk partials meet in the pairwise tree. A power of two, so that a row-parallel layer split over
    TP ranks (TP dividing k_chunks) owns whole subtrees: TP 1, 2 and 4 then give the same bits. From
    version 3 this applies to the row-parallel layers only (o_proj, down_proj; kernels/gemm.py `chunk_count`)."""
    column_k_chunks: int | None = 1
    """Version 3: the K chunks of every other GEMM (the column-parallel q/k/v, gate/up and the lm_head,
    whose K no layout splits). 1 = one fp32 accumulator over all of K, in K order. None = the same as
    `k_chunks` (versions 1 and 2, which have no such field, are exactly that)."""
    row_tile: int = 16
    """Rows per GEMM call on the CPU: every strict backend GEMM call has exactly this many rows (padded),
    so the backend's blocking, and each row's reduction order, never depends on the batch size."""
    k_tile: int = 64
    """GPU kernels: K elements per pipelined step inside a chunk; steps accumulate sequentially in order."""
    chunk_merge: str = "chained"
    """Version 5: how the fp32 chunk partials of one output element meet. "sequential": added in chunk
    order, ((c0 + c1) + c2) + c3, so a kernel computing every chunk of a tile holds two accumulators at
    most (the running chunk and the sum so far); a TP rank then contributes its chunks' partials
    unmerged and the gathered C partials are added in that order. "pairwise_tree" (versions 1-4): the
    canonical pairwise tree ((c0 + c1) + (c2 + c3)), three accumulators while c3 is summed; a TP rank
    contributes its subtree. "chained" (version 6): no chunk starts from zero but the first; chunk c's
    products accumulate onto the fp32 sum of chunks 0..c-1 (the device GEMM's accumulator input: on the
    GPU the tensor-core chain simply runs on, so the whole K is one chain in K order; on the CPU the
    backend's fp32 GEMM with that sum as C, beta = 1, per row tile); a TP rank receives the running sum of
    the ranks before it and passes its own on, in rank order."""

    def validate(self) -> None:
        _one_of("gemm.chunk_merge", self.chunk_merge, CHUNK_MERGES)
        for name in ("k_chunks", "column_k_chunks"):
            value = getattr(self, name)
            if name == "column_k_chunks" and value is None:
                continue
            _positive_int(f"gemm.{name}", value)
            if not _power_of_two(value):
                raise ContractError(f"gemm.{name}", value, "a power of two (1, 2, 4, 8, ...)")
        _positive_int("gemm.row_tile", self.row_tile)
        _positive_int("gemm.k_tile", self.k_tile)
        if not _power_of_two(self.k_tile) or self.k_tile < 16:
            raise ContractError("gemm.k_tile", self.k_tile, "a power of two >= 16 (one tensor-core k step)")


@dataclass(frozen=True)
class AttentionSpec(_Section):
    """Causal GQA attention; the same schedule for varlen prefill, chunked prefill and paged decode.

    Fixed by the structure: scores = (q.k) * head_dim**-0.5 in fp32; q.k over head_dim and p.V over a
    block are fp32 sums (pairwise trees in the reference, the tensor cores' k order on the GPU); a split
    with no visible key is an exact pass-through when split states merge."""

    split_size: int = 512
    """KV positions [s*split, (s+1)*split) form split s. A query at position p uses splits 0..p//split,
    whether it is computed in a prefill, a chunked prefill or a decode step. 512 from version 4 (256
    before: CHANGED_IN)."""
    block_size: int = 64
    """Inside a split, keys are consumed in blocks of this many positions, in order, by an online softmax.
    Blocks are aligned to absolute positions, so a query sees the same blocks in every mode. 64 from
    version 4 (32 before: CHANGED_IN)."""
    split_merge: str = "sequential"
    """Version 4: how split states (max, sum, unnormalized output) merge through their log-sum-exp.
    "sequential": folded into one running state in split order, ((s0 + s1) + s2) + ..., so a prefill
    holds two states, never a stack. "pairwise_tree" (versions 1-3): the canonical pairwise tree over
    split index, which a kernel evaluates with a stack of up to log2(splits) states."""
    row_sum: str = "tensor_core"
    """Version 4: how a block's probabilities p enter the running sum. "tensor_core": p rounded to the
    value dtype (as p.V uses it) times a column of ones, accumulated in fp32 by the same matrix unit as
    p.V, so its order is the unit's and not the tile's: a kernel may pick its tile per mode (decode a
    16-row tile, prefill a larger one). "tile_reduce" (versions 1-3): an fp32 row reduction of p, whose
    order follows the tile's register layout, so every mode must run one and the same tile."""

    def validate(self) -> None:
        _positive_int("attention.split_size", self.split_size)
        _positive_int("attention.block_size", self.block_size)
        if self.split_size % self.block_size:
            raise ContractError(
                "attention.split_size", self.split_size,
                f"a multiple of attention.block_size ({self.block_size})")
        _one_of("attention.split_merge", self.split_merge, ("sequential", "pairwise_tree"))
        _one_of("attention.row_sum", self.row_sum, ("tensor_core", "tile_reduce"))


@dataclass(frozen=True)
class LogprobSpec(_Section):
    """log p(token) = logit[token] - logsumexp(logits), from the lm_head GEMM (GemmSpec) rounded once to
    fp32 (never to the model dtype). Processed logprobs: logits / temperature in fp32 (a division), then
    top-k, then top-p, then renormalize (rlkit.types.SamplingParams)."""

    vocab_chunk: int = 8192
    """The vocabulary is cut into chunks of this many entries (the last one shorter); each chunk yields
    (max, sum of exp(x - max)) with a pairwise tree; chunks merge by a pairwise LSE tree in fp32."""
    row_block: int = 256
    """Rows processed at once, so no [tokens x vocab] fp32 tensor is held for raw logprobs."""
    top_p_scan_block: int = 1024
    """GPU top-p: the cumulative probability of a row is scanned in blocks of this many entries, in
    order, the running total carried between blocks (kernels/logprob.py `_row_cumsum_kernel`). The
    block decides the order of the fp32 additions, so it decides which token crosses top_p at a
    near-tie. (The CPU reference scans sequentially.) A power of two."""

    def validate(self) -> None:
        _positive_int("logprob.vocab_chunk", self.vocab_chunk)
        _positive_int("logprob.row_block", self.row_block)
        _positive_int("logprob.top_p_scan_block", self.top_p_scan_block)
        if not _power_of_two(self.top_p_scan_block):
            raise ContractError("logprob.top_p_scan_block", self.top_p_scan_block, "a power of two")


@dataclass(frozen=True)
class RmsNormSpec(_Section):
    """y = weight * (x * rsqrt(mean(x^2) + eps)), with an optional residual add before it.

    Fixed by the structure: fp32 squares summed over the hidden dim by a pairwise tree, times 1/hidden;
    the residual add rounds to the model dtype before the norm reads it."""

    weight_multiply: str = "model_dtype"
    """`model_dtype`: normalize in fp32, round to the model dtype, multiply by the weight there (the HF
    Qwen3 order); `float32`: multiply in fp32 and round once."""

    def validate(self) -> None:
        _one_of("rms_norm.weight_multiply", self.weight_multiply, ("model_dtype", "float32"))


@dataclass(frozen=True)
class GpuSpec(_Section):
    """What the GPU kernels' compiler may do to the arithmetic the kernel source writes."""

    fp_fusion: bool = False
    """Whether the compiler may contract a*b + c into one fused multiply-add (one rounding instead of
    two). Only False is implemented: two kernels that share a helper (attention's split state in the
    fused and the split-parallel launch) must round where the source says, and with fusion the
    compiler decides per kernel (kernels/_triton.py `launch_options`)."""

    def validate(self) -> None:
        if self.fp_fusion is not False:
            raise ContractError("gpu.fp_fusion", self.fp_fusion,
                                "False (the kernels round where their source says; fusion is not implemented)")


_SECTIONS = {
    "paths": OpPaths, "gemm": GemmSpec, "attention": AttentionSpec, "logprob": LogprobSpec,
    "rms_norm": RmsNormSpec, "gpu": GpuSpec,
}

V1_NAME = "qwen3-dense-strict-v1"
V2_NAME = "qwen3-dense-strict-v2"
V3_NAME = "qwen3-dense-strict-v3"
V4_NAME = "qwen3-dense-strict-v4"
V5_NAME = "qwen3-dense-strict-v5"
V6_NAME = "qwen3-dense-strict-v6"
VERSIONS = (1, 2, 3, 4, 5, 6)
NAMES = {V6_NAME: 6, V5_NAME: 5, V4_NAME: 4, V3_NAME: 3, V2_NAME: 2, V1_NAME: 1}
"""Every released contract, newest first, with its version."""
DEFAULT_NAME = V6_NAME
"""What `NumericsContract.default()` and a run's configuration use: the fastest version that passes every
invariance test on the CPU and the H200 (v6 since 2026-12-05, lab/LOG.md; v5 before)."""

V1_FIXED: dict[str, dict[str, str]] = {
    "gemm": {"combine": "pairwise_tree", "accumulate": "float32", "output_rounding": "once"},
    "attention": {"split_combine": "pairwise_tree", "dot_reduction": "pairwise_tree", "accumulate": "float32",
                  "score_scale": "multiply_after_dot"},
    "logprob": {"logits_dtype": "float32", "temperature_op": "divide"},
    "rms_norm": {"sum_of_squares": "pairwise_tree", "residual_add": "model_dtype"},
    "elementwise": {"swiglu": "float32_once", "rope_tables": "float64_then_float32", "rope_apply": "float32_once"},
    "collectives": {"combine": "pairwise_tree", "wire_dtype": "float32"},
    "primitives": {"exp": "exp", "log": "log", "rsqrt": "rsqrt", "sigmoid": "1/(1+exp(-x))"},
}
"""Version 1 wrote these fields, each with the one value every kernel implements (no code read them);
version 2 states them in the section docstrings instead. A v1 contract still serializes them, so its
JSON, and its fingerprint, are what v1 stores hold."""

ADDED_IN: dict[int, dict[str, dict[str, Any]]] = {
    2: {"logprob": {"top_p_scan_block": 1024}, "gpu": {"fp_fusion": False}},
    3: {"gemm": {"column_k_chunks": None}},
    4: {"attention": {"split_merge": "pairwise_tree", "row_sum": "tile_reduce"}},
    5: {"gemm": {"chunk_merge": "pairwise_tree"}},
}
"""Fields each version added, with the one value a contract of an earlier version has (what its kernels
did): an earlier version does not write them and accepts no other value."""


CHANGED_IN: dict[int, dict[str, dict[str, Any]]] = {
    4: {"attention": {"block_size": 32, "split_size": 256}},
    6: {"gemm": {"chunk_merge": "sequential"}},
}
"""Defaults a version changed, with the value every earlier version has: {version: {section: {field:
earlier value}}}. Every version writes these fields, so stores read back unchanged; `named()` builds an
earlier version with its own values."""

NEWER_VALUES: dict[int, dict[str, dict[str, Any]]] = {}
"""Values of versions newer than the default (the dataclasses' defaults are DEFAULT_NAME's): {version:
{section: {field: value}}}; `named()` builds such a version with them. When a newer version becomes the
default, its values move into the dataclasses and the default's old ones into CHANGED_IN."""


def absent_fields(version: int) -> dict[str, dict[str, Any]]:
    """{section: {field: fixed value}} of every field a contract of `version` does not have."""
    out: dict[str, dict[str, Any]] = {}
    for added, sections in ADDED_IN.items():
        if added > version:
            for section, fields in sections.items():
                out.setdefault(section, {}).update(fields)
    return out


@dataclass(frozen=True)
class NumericsContract:
    """A named, versioned, frozen numerics contract. Build with `default()` and derive with `with_ops`."""

    name: str = V6_NAME
    version: int = 6
    """The field defaults are DEFAULT_NAME's (`NumericsContract()` is `default()`). The structure of the fields: 1 (the v1 field set, V1_FIXED included), 2, 3, 4, 5 or 6 (this class's
    fields); ADDED_IN says which fields each version added."""
    paths: OpPaths = field(default_factory=OpPaths)
    gemm: GemmSpec = field(default_factory=GemmSpec)
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    logprob: LogprobSpec = field(default_factory=LogprobSpec)
    rms_norm: RmsNormSpec = field(default_factory=RmsNormSpec)
    gpu: GpuSpec = field(default_factory=GpuSpec)

    def __post_init__(self) -> None:
        self.validate()

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def default(cls) -> "NumericsContract":
        """DEFAULT_NAME (`qwen3-dense-strict-v6`) with every op on the strict path."""
        return cls.named(DEFAULT_NAME)

    @classmethod
    def v1(cls) -> "NumericsContract":
        """`qwen3-dense-strict-v1`: v2's bits under v1's field set and fingerprint (runs recorded before
        v2 carry it)."""
        return cls.named(V1_NAME)

    @classmethod
    def named(cls, name: str) -> "NumericsContract":
        """A released contract by name, every op strict, with that version's defaults."""
        if name not in NAMES:
            raise ContractError("name", name, " | ".join(NAMES))
        version = NAMES[name]
        defaults: dict[str, dict[str, Any]] = {}
        for changed, fields_by_section in sorted(CHANGED_IN.items(), reverse=True):
            if changed > version:
                for section, fields in fields_by_section.items():
                    defaults.setdefault(section, {}).update(fields)
        for newer, fields_by_section in sorted(NEWER_VALUES.items()):
            if newer <= version:
                for section, fields in fields_by_section.items():
                    defaults.setdefault(section, {}).update(fields)
        for section, fields in absent_fields(version).items():  # a field the version lacks: its fixed value
            defaults.setdefault(section, {}).update(fields)
        sections = {section: dataclasses.replace(_SECTIONS[section](), **fields)
                    for section, fields in defaults.items()}
        return cls(name=name, version=version, **sections)

    @classmethod
    def native(cls) -> "NumericsContract":
        """The default contract with every op on the native path (what frameworks do today)."""
        return cls.default().with_every_op("native")

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
        if self.version not in VERSIONS:
            raise ContractError("version", self.version, " | ".join(map(str, VERSIONS)))
        for section, kind in _SECTIONS.items():
            value = getattr(self, section)
            if not isinstance(value, kind):
                raise ContractError(section, value, f"a {kind.__name__}")
            value.validate()
        for section, fields in absent_fields(self.version).items():
            for key, fixed in fields.items():
                if getattr(getattr(self, section), key) != fixed:
                    raise ContractError(f"{section}.{key}", getattr(getattr(self, section), key),
                                        f"{fixed!r} (version {self.version} fixes it; a later version can change it)")
        if self.gemm.chunk_merge == "chained" and self.version < 6:
            raise ContractError("gemm.chunk_merge", "chained",
                                f"sequential | pairwise_tree (the chained merge is version 6's; this is version {self.version})")

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
        """The contract as plain data in its version's field set (what `to_json` and the fingerprint
        read): the dataclass without the fields later versions added (ADDED_IN); version 1 also with
        V1_FIXED's fields: exactly what each version's stores hold."""
        data = dataclasses.asdict(self)
        for section, fields in absent_fields(self.version).items():
            for key in fields:
                del data[section][key]
            if not data[section]:
                del data[section]
        if self.version == 1:
            for section, fields in V1_FIXED.items():
                data.setdefault(section, {}).update(fields)
        return data

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; the fingerprint hashes exactly this text."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NumericsContract":
        if not isinstance(data, dict):
            raise ContractError("contract", type(data).__name__, "a JSON object")
        version = data.get("version", 2)
        if version not in VERSIONS:
            raise ContractError("version", version, " | ".join(map(str, VERSIONS)))
        fixed = V1_FIXED if version == 1 else {}
        absent = absent_fields(version)
        known = {"name", "version", *_SECTIONS, *fixed}
        for key in data:
            if key not in known:
                raise ContractError(key, data[key], "fields " + ", ".join(sorted(known)))
        kwargs: dict[str, Any] = {k: data[k] for k in ("name", "version") if k in data}
        for section in known - {"name", "version"}:
            if section not in data:
                continue
            raw = data[section]
            if not isinstance(raw, dict):
                raise ContractError(section, raw, "a JSON object")
            kind = _SECTIONS.get(section)
            names = {f.name for f in dataclasses.fields(kind)} if kind else set()
            names -= set(absent.get(section, {}))
            for key in raw:
                if key in fixed.get(section, {}):
                    if raw[key] != fixed[section][key]:
                        raise ContractError(f"{section}.{key}", raw[key], repr(fixed[section][key]))
                elif key not in names:
                    raise ContractError(f"{section}.{key}", raw[key],
                                        ", ".join(sorted(names | set(fixed.get(section, {})))))
            if kind is not None:
                kwargs[section] = kind(**{k: v for k, v in raw.items() if k in names},
                                       **absent.get(section, {}))
        for section, fields in absent.items():  # a section the JSON does not have at all
            if section not in kwargs:
                kwargs[section] = dataclasses.replace(_SECTIONS[section](), **fields)
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

    @classmethod
    def from_fingerprint(cls, fingerprint: str) -> "NumericsContract | None":
        """The released contract (any version, any per-op paths) with this fingerprint, or None (a
        contract with other parameters: only its JSON says what it was)."""
        for base in map(cls.named, NAMES):
            for paths in itertools.product(PATHS, repeat=len(OPS)):
                c = base.with_ops(**dict(zip(OPS, paths)))
                if c.fingerprint() == fingerprint:
                    return c
        return None

    def summary(self) -> str:
        paths = " ".join(f"{op}={self.path(op)}" for op in OPS)
        return f"{self.name} v{self.version} [{self.fingerprint()}] {paths}"
