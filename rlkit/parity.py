"""The parity chain: the proof that the rollout's recorded logprob equals the trainer's recompute.

Three links, each compared bit for bit, and their end-to-end consequence:
1. trainer_batch_invariance — trainer forward on batch composition A == on composition B
   (all sequences packed together vs each packed alone, in reverse order);
2. trainer_vs_rollout_prefill — trainer full-sequence forward == the rollout engine's prefill of the
   same sequence (paged KV cache, chunked prefill);
3. decode_vs_rollout_prefill — the logprobs the engine recorded while decoding, token by token ==
   the engine's prefill of the whole sequence;
=> trainer_vs_decode — what the rollout recorded == what the trainer recomputes (raw semantics; and
   trainer_vs_decode_processed when sampling was not the identity).

When trainer_vs_decode mismatches, the first-divergence locator replays the rollout with activation
capture and reports the first (layer, op) whose outputs differ from the trainer's.

    from rlkit.parity import parity_settings, run_parity
    report = run_parity(parity_settings(model="tiny", path="strict"))
    print(report.table())
"""

from __future__ import annotations

import dataclasses

import json
import sys
from dataclasses import dataclass, field, fields

import torch

from rlkit import ops
from rlkit.config import RunConfig
from rlkit.contract import NumericsContract
from rlkit.divergence import DivergenceStats, flatten, locate_first_divergence, logprob_divergence
from rlkit.model import build_model, preset
from rlkit.model.config import DTYPE_ALIASES
from rlkit.rollout import EmbeddedEngine, EngineConfig, GenerationRequest
from rlkit.train.recompute import response_logprobs
from rlkit.types import SamplingParams

ROLLOUTS = ("embedded", "vllm")


def _parity_run() -> RunConfig:
    """The parity chain's defaults for the fields it shares with a run: the tiny model in bf16 on the CPU,
    every op strict, 128-token responses, an engine of 8 sequences and 128-token steps."""
    return RunConfig(model="tiny", task="dapo", max_tokens=128,
                     engine=EngineConfig(max_batch_tokens=128, max_num_seqs=8))


@dataclass(frozen=True)
class ParitySettings:
    """What `rlkit parity` runs: a RunConfig's model, dtype, device, paths and per-op overrides, seed,
    sampling, response length and engine (`run`, spelled and validated as for a run), plus the fields only
    the parity chain has. `parity_settings(**fields)` builds one from flat keywords."""

    run: RunConfig = field(default_factory=_parity_run)
    rollout: str = "embedded"
    """embedded | vllm"""
    prompts: int = 16
    """DAPO-Math-17k prompts rolled out (one sample each)."""
    contract: NumericsContract | None = None
    """A full contract (tests use small split sizes); `run.path` and `run.ops` are applied on top of it."""
    trainer_batch_tokens: int = 2048
    locate: bool = True

    def __post_init__(self) -> None:
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"--rollout {self.rollout!r}; expected one of {', '.join(ROLLOUTS)}")
        if self.prompts < 1 or self.run.max_tokens < 1:
            raise ValueError("--prompts and --max-tokens must be >= 1")
        if self.run.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda asked, but torch sees no CUDA device on this machine")

    def build_contract(self) -> NumericsContract:
        if self.contract is None:
            return self.run.contract()
        base = self.contract.with_every_op(self.run.path)
        return base.with_ops(**dict(self.run.ops)) if self.run.ops else base


_OWN_FIELDS = frozenset(f.name for f in fields(ParitySettings)) - {"run"}


def parity_settings(**overrides) -> ParitySettings:
    """ParitySettings from flat keywords: its own fields (rollout, prompts, contract, trainer_batch_tokens,
    locate) and any RunConfig field (model, dtype, device, path, ops, seed, max_tokens, temperature, top_k,
    top_p, engine), over the parity defaults.

        parity_settings(model="tiny", dtype="float32", path="native", prompts=2, max_tokens=8)
    """
    own = {k: v for k, v in overrides.items() if k in _OWN_FIELDS}
    run = _parity_run().replace(**{k: v for k, v in overrides.items() if k not in own})
    return ParitySettings(run=run, **own)


@dataclass
class ParityReport:
    contract: NumericsContract
    settings: ParitySettings
    links: dict[str, DivergenceStats | None]
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]
    first_divergence: dict | None
    notes: list[str] = field(default_factory=list)
    sequence_lengths: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "contract": self.contract.fingerprint(),
            "contract_name": self.contract.name,
            "path": self.settings.run.path,
            "ops": self.contract.op_paths(),
            "preset": self.settings.run.model, "dtype": self.settings.run.dtype, "rollout": self.settings.rollout,
            "links": {k: (None if v is None else v.to_dict()) for k, v in self.links.items()},
            "first_divergence": self.first_divergence,
            "notes": self.notes,
        }

    def table(self) -> str:
        lines = [f"contract {self.contract.summary()}",
                 f"preset {self.settings.run.model} {self.settings.run.dtype} rollout={self.settings.rollout}",
                 f"{'link':34} {'compared':>9} {'mismatch':>9} {'max_abs_diff':>13}"]
        for name, s in self.links.items():
            if s is None:
                lines.append(f"{name:34} {'(not run)':>9}")
            else:
                lines.append(f"{name:34} {s.compared_tokens:9d} {s.mismatch_count:9d} {s.max_abs_diff:13.6g}")
        fd = self.first_divergence
        lines.append("first divergence: " + ("none" if fd is None else
                                             f"layer {fd['layer']} op {fd['op']} ({fd.get('site', '')}), "
                                             f"{fd.get('differing_rows', '?')} rows, max |diff| "
                                             f"{fd.get('max_abs_diff', 0):.3g}"))
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def dapo_prompts(n: int) -> list[tuple[str, list[int]]]:
    from rlkit.data import load_dapo
    from rlkit.model.tokenizer import chat_prompt_ids, load_tokenizer

    tok = load_tokenizer()
    return [(p.prompt_id, chat_prompt_ids(p.user_message(), tok)) for p in load_dapo(limit=n)]


def build_rollout(settings: ParitySettings, model, contract):
    if settings.rollout == "embedded":
        return EmbeddedEngine(model, contract, settings.run.engine, engine_id="parity-engine")
    try:
        from rlkit.rollout.vllm_engine import build_vllm_engine
    except ImportError as exc:
        raise RuntimeError(f"--rollout vllm needs vLLM (pip install -r requirements-vllm.txt): {exc}") from None
    return build_vllm_engine(model, contract, engine_id="parity-vllm")


def run_parity(settings: ParitySettings, log=None) -> ParityReport:
    log = log or (lambda msg: print(msg, file=sys.stderr))
    contract = settings.build_contract()
    run, _ = settings.run.with_resolved_dtype()  # "auto": this device's dtype, named in the report
    settings = dataclasses.replace(settings, run=run)
    cfg = preset(run.model).with_dtype(run.dtype)
    log(f"building {run.model} ({cfg.num_parameters() / 1e6:.1f} M params, {cfg.dtype}) on {run.device}")
    model = build_model(cfg, seed=run.seed, device=run.device)
    engine = build_rollout(settings, model, contract)
    prompts = dapo_prompts(settings.prompts)
    sampling = run.sampling()
    requests = [GenerationRequest(f"{pid}-s{run.seed}", tuple(ids), sampling) for pid, ids in prompts]
    log(f"rollout: {len(requests)} DAPO-Math-17k prompts, up to {run.max_tokens} tokens each")
    results = engine.generate(requests, progress=True)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError("rollout failed: " + "; ".join(failed))
    seqs = [r.prompt_ids + r.token_ids for r in results]
    plens = [len(r.prompt_ids) for r in results]
    ids = [r.request_id for r in results]
    links: dict[str, DivergenceStats | None] = {}
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    notes: list[str] = []

    def add(name, a, b):
        pairs[name] = (flatten(a), flatten(b))
        links[name] = logprob_divergence(*pairs[name])

    log("trainer: packed recompute (two batch compositions)")
    with ops.use_contract(contract):
        full = response_logprobs(model, seqs, [1] * len(seqs), max_batch_tokens=settings.trainer_batch_tokens)
        alone = [response_logprobs(model, [s], [1], max_batch_tokens=1)[0] for s in reversed(seqs)][::-1]
    add("trainer_batch_invariance", full, alone)
    if hasattr(engine, "score"):
        log("rollout: prefill of the whole sequences")
        prefill = engine.score(seqs)
        add("trainer_vs_rollout_prefill", full, prefill)
        add("decode_vs_rollout_prefill", [r.raw_logprobs for r in results],
            [p[plen - 1 :] for p, plen in zip(prefill, plens)])
    else:
        links["trainer_vs_rollout_prefill"] = links["decode_vs_rollout_prefill"] = None
        notes.append(f"the {settings.rollout} engine offers no prefill scoring: links 2 and 3 not run")
    trainer_resp = [f[plen - 1 :] for f, plen in zip(full, plens)]
    add("trainer_vs_decode", [r.raw_logprobs for r in results], trainer_resp)
    if not sampling.is_identity:
        with ops.use_contract(contract):
            processed = response_logprobs(model, seqs, plens, [sampling] * len(seqs),
                                          max_batch_tokens=settings.trainer_batch_tokens)
        add("trainer_vs_decode_processed", [r.processed_logprobs for r in results], processed)
    fd = None
    # Located when logprobs differ, and whenever an op is native: activations can differ where bf16
    # rounding hides it in the logprobs, and "where does native first differ" is the question then.
    wanted = links["trainer_vs_decode"].mismatch_count or not contract.all_strict
    if settings.locate and wanted and hasattr(engine, "replay"):
        log("locating the first divergence (activation capture, teacher-forced replay)")
        fd = locate_first_divergence(model, contract, engine, seqs, plens, ids)
    return ParityReport(contract, settings, links, pairs, fd, notes, [len(s) for s in seqs])


def report_json(report: ParityReport) -> str:
    return json.dumps(report.to_json(), indent=2)


def settings_from_args(args) -> ParitySettings:
    """`rlkit parity`'s arguments -> ParitySettings (the CLI's bf16 / fp32 -> the config's dtype names)."""
    contract_ops = NumericsContract.parse_ops(args.ops) if args.ops else {}
    return parity_settings(model=args.preset, contract_name=args.contract, path=args.path, ops=contract_ops,
                           rollout=args.rollout,
                           prompts=args.prompts, max_tokens=args.max_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed, dtype=DTYPE_ALIASES[args.dtype],
                           device=args.device)


__all__ = ["ParitySettings", "ParityReport", "parity_settings", "run_parity", "report_json", "settings_from_args"]
