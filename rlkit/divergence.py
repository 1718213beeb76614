"""Divergence between the logprobs a rollout recorded and the logprobs a trainer recomputed.

- `logprob_divergence(rollout, trainer)`: compared_tokens, mismatch_count (bitwise: torch.equal plus sign
  bits), max/mean |diff|, the K3 estimate of KL(rollout || trainer), and importance-ratio statistics
  (ratio = exp(trainer - rollout); mean, min, max, fraction outside [0.8, 1.2]).
- `check_fingerprints`: records made under different numerics contracts are never compared.
- `ActivationRecorder` + `first_divergence`: run both sides with every op's output captured (forward hooks
  on the model's leaf op modules), line the rows up by (sequence, position), and report the first
  (layer, op) in execution order whose outputs differ, with the diff statistics there.
- `locate_first_divergence`: both sides of one comparison recorded that way (the trainer's packed forward,
  an engine's teacher-forced replay of the same tokens) — what the parity report and both runners call.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch
from torch import nn

from rlkit import ops
from rlkit.bitwise import differs
from rlkit.contract import NumericsContract
from rlkit.model.qwen3 import ForwardBatch


class FingerprintMismatch(ValueError):
    """Two records were made under different numerics contracts."""


def _describe(fp: str) -> str:
    known = NumericsContract.from_fingerprint(fp)
    return fp if known is None else f"{fp} ({known.summary().split(' [')[0]}, {_paths_text(known)})"


def _paths_text(contract: NumericsContract) -> str:
    native = [op for op, path in contract.op_paths().items() if path == "native"]
    if not native:
        return "all strict"
    return "all native" if len(native) == len(contract.op_paths()) else "native " + ",".join(native)


def check_fingerprints(rollout_fp: str, trainer_fp: str) -> None:
    """Records made under different numerics contracts (another version, another path of any op) are
    never compared: one line naming both contracts where they are released ones."""
    if rollout_fp != trainer_fp:
        raise FingerprintMismatch(
            f"refusing to compare: rollout contract {_describe(rollout_fp)} != trainer contract "
            f"{_describe(trainer_fp)}; records made under different numerics contracts are never compared")


@dataclass(frozen=True)
class DivergenceStats:
    compared_tokens: int
    mismatch_count: int
    max_abs_diff: float
    mean_abs_diff: float
    k3_kl: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    ratio_outside: float
    """Fraction of tokens whose importance ratio lies outside [0.8, 1.2]."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def empty(cls) -> "DivergenceStats":
        return cls(0, 0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0)


def flatten(x) -> torch.Tensor:
    """Token logprobs as one fp32 CPU tensor, from a tensor or a list of per-sequence tensors/lists."""
    if isinstance(x, torch.Tensor):
        return x.detach().float().reshape(-1).cpu()
    parts = [torch.as_tensor(t, dtype=torch.float32).detach().reshape(-1).cpu() for t in x]
    return torch.cat(parts) if parts else torch.zeros(0)


def logprob_divergence(rollout, trainer) -> DivergenceStats:
    """Stats over aligned token logprobs (tensors or lists of per-sequence tensors/lists)."""
    r, t = flatten(rollout), flatten(trainer)
    if r.shape != t.shape:
        raise ValueError(f"rollout has {r.numel()} tokens, trainer {t.numel()}")
    n = r.numel()
    if n == 0:
        return DivergenceStats.empty()
    mismatch = int(differs(r, t).sum())
    delta = t.double() - r.double()
    finite = torch.isfinite(delta)
    absd = delta[finite].abs()
    log_ratio = delta.clamp(-50, 50)
    ratio = torch.exp(log_ratio)
    k3 = (ratio - 1 - log_ratio)[finite]
    return DivergenceStats(
        compared_tokens=n,
        mismatch_count=mismatch,
        max_abs_diff=float(absd.max()) if absd.numel() else (0.0 if mismatch == 0 else float("inf")),
        mean_abs_diff=float(absd.mean()) if absd.numel() else 0.0,
        k3_kl=float(k3.mean()) if k3.numel() else 0.0,
        ratio_mean=float(ratio[finite].mean()) if finite.any() else 1.0,
        ratio_min=float(ratio[finite].min()) if finite.any() else 1.0,
        ratio_max=float(ratio[finite].max()) if finite.any() else 1.0,
        ratio_outside=float(((ratio < 0.8) | (ratio > 1.2)).double().mean()),
    )


# -- first-divergence locator -----------------------------------------------------------------------
_OP_OF_MODULE = {"RMSNorm": "rms_norm", "Linear": "linear", "Rope": "rope", "AttentionCore": "attention",
                 "SwiGLU": "swiglu"}


def op_site(module_name: str) -> tuple[str, str]:
    """'model.layers.3.self_attn.q_proj' -> ('3', 'self_attn.q_proj'); 'model.norm' -> ('final', 'norm')."""
    m = re.search(r"layers\.(\d+)\.(.+)$", module_name)
    if m:
        return m.group(1), m.group(2)
    return "final", module_name.split(".")[-1]


@dataclass
class _Call:
    name: str
    op: str
    output: torch.Tensor
    keys: list[tuple[str, int]]


@dataclass
class ActivationRecorder:
    """Capture every leaf op's output during forward passes of rlkit's Qwen3.

        rec = ActivationRecorder(model)
        with rec:
            ...  # any number of forwards (a packed prefill, or an engine's prefill + decode steps)
        rows = rec.rows()   # {module name: {(seq_id, position): output row}}
    Each forward's ForwardBatch must carry seq_ids (the engine and ForwardBatch.packed set them).
    """

    model: nn.Module
    calls: list[_Call] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    _keys: list[tuple[str, int]] = field(default_factory=list)
    _handles: list = field(default_factory=list)

    def __enter__(self) -> "ActivationRecorder":
        root = self.model

        def on_batch(_module, args):
            batch = args[0]
            cu = batch.layout.cu_seqlens_q.tolist()
            ids = batch.seq_ids or [str(i) for i in range(len(cu) - 1)]
            pos = batch.positions.tolist()
            keys = []
            for s in range(len(cu) - 1):
                keys.extend((ids[s], pos[r]) for r in range(cu[s], cu[s + 1]))
            self._keys = keys

        self._handles.append(root.register_forward_pre_hook(on_batch))
        for name, module in root.named_modules():
            op = _OP_OF_MODULE.get(type(module).__name__)
            if op is None:
                continue

            def hook(_m, _args, out, name=name, op=op):
                y = out[0] if isinstance(out, tuple) else out
                if name not in self.order:
                    self.order.append(name)
                self.calls.append(_Call(name, op, y.detach().clone(), list(self._keys)))

            self._handles.append(module.register_forward_hook(hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def rows(self) -> dict[str, dict[tuple[str, int], torch.Tensor]]:
        out: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
        for call in self.calls:
            table = out.setdefault(call.name, {})
            for r, key in enumerate(call.keys):
                table[key] = call.output[r]
        return out

    def op_of(self, name: str) -> str:
        return next(c.op for c in self.calls if c.name == name)


@dataclass(frozen=True)
class FirstDivergence:
    layer: str
    op: str
    site: str
    module: str
    differing_rows: int
    compared_rows: int
    differing_elements: int
    max_abs_diff: float
    first_key: tuple[str, int]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["first_key"] = list(self.first_key)
        return d


def first_divergence(a: ActivationRecorder, b: ActivationRecorder,
                     keys: Sequence[tuple[str, int]] | None = None) -> FirstDivergence | None:
    """The first op (in a's execution order) whose output rows differ between the two recordings, over
    the (sequence, position) rows both saw (or `keys`). None when every op agrees bit for bit."""
    rows_a, rows_b = a.rows(), b.rows()
    for name in a.order:
        if name not in rows_b:
            continue
        ta, tb = rows_a[name], rows_b[name]
        common = [k for k in (keys or ta.keys()) if k in ta and k in tb]
        if not common:
            continue
        xa = torch.stack([ta[k] for k in common]).float()
        xb = torch.stack([tb[k] for k in common]).float()
        diff = differs(xa, xb).reshape(len(common), -1)
        bad_rows = diff.any(-1)
        if bad_rows.any():
            delta = (xa.double() - xb.double()).abs()
            layer, site = op_site(name)
            first = common[int(bad_rows.nonzero()[0])]
            return FirstDivergence(layer, a.op_of(name), site, name, int(bad_rows.sum()), len(common),
                                   int(diff.sum()), float(delta[torch.isfinite(delta)].max()), first)
    return None


def locate_first_divergence(model, contract, engine, seqs, plens, ids) -> dict | None:
    """Trainer packed forward vs the engine's teacher-forced decode of the same tokens, every op captured."""
    trainer_rec = ActivationRecorder(model)
    with trainer_rec, ops.use_contract(contract), torch.no_grad():
        hidden = model(ForwardBatch.packed([torch.tensor(s, device=model.device) for s in seqs], seq_ids=ids))
    rollout_rec = ActivationRecorder(model)
    with rollout_rec:
        replayed = engine.replay([s[:p] for s, p in zip(seqs, plens)], [s[p:] for s, p in zip(seqs, plens)],
                                 request_ids=ids)
    # compare the rows the decode produced: the last prompt position and every response position
    keys = [(rid, pos) for rid, s, p in zip(ids, seqs, plens) for pos in range(p - 1, len(s))]
    found = first_divergence(trainer_rec, rollout_rec, keys)
    if found is not None:
        return found.to_dict()
    with ops.use_contract(contract), torch.no_grad():
        offsets = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
        rows = torch.cat([torch.arange(int(offsets[i]) + p - 1, int(offsets[i]) + len(s) - 1)
                          for i, (s, p) in enumerate(zip(seqs, plens))])
        targets = torch.cat([torch.tensor(s[p:]) for s, p in zip(seqs, plens)]).to(model.device)
        trainer_lp = model.logprobs(hidden[rows.to(model.device)], targets)
    stats = logprob_divergence(torch.cat(replayed), trainer_lp)
    if stats.mismatch_count:
        return {"layer": "head", "op": "logprob", "site": "lm_head + log-softmax", "module": "lm_head",
                "differing_rows": stats.mismatch_count, "compared_rows": stats.compared_tokens,
                "differing_elements": stats.mismatch_count, "max_abs_diff": stats.max_abs_diff, "first_key": None}
    return None
