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

    from rlkit.parity import ParitySettings, run_parity
    report = run_parity(ParitySettings(preset="tiny", path="strict"))
    print(report.table())
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import torch

from rlkit import ops
from rlkit.contract import NumericsContract
from rlkit.divergence import ActivationRecorder, DivergenceStats, first_divergence, flatten, logprob_divergence
from rlkit.model import build_model, preset
from rlkit.model.config import DTYPE_ALIASES
from rlkit.model.qwen3 import ForwardBatch
from rlkit.rollout import EmbeddedEngine, EngineConfig, GenerationRequest
from rlkit.train.recompute import response_logprobs
from rlkit.types import SamplingParams

ROLLOUTS = ("embedded", "vllm")


@dataclass(frozen=True)
class ParitySettings:
    preset: str = "tiny"
    path: str = "strict"
    """strict | native: the path of every op, before `ops` overrides."""
    ops: dict = field(default_factory=dict)
    rollout: str = "embedded"
    prompts: int = 16
    max_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "bf16"
    device: str = "cpu"
    contract: NumericsContract | None = None
    """A full contract (tests use small split sizes); `path` and `ops` are applied on top of it."""
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(max_batch_tokens=128, max_num_seqs=8))
    trainer_batch_tokens: int = 2048
    locate: bool = True

    def __post_init__(self) -> None:
        if self.path not in ("strict", "native"):
            raise ValueError(f"--path {self.path!r}; expected strict or native")
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"--rollout {self.rollout!r}; expected one of {', '.join(ROLLOUTS)}")
        if DTYPE_ALIASES.get(self.dtype) not in ("bfloat16", "float32"):
            raise ValueError(f"--dtype {self.dtype!r}; expected bf16 or fp32")
        if self.prompts < 1 or self.max_tokens < 1:
            raise ValueError("--prompts and --max-tokens must be >= 1")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda asked, but torch sees no CUDA device on this machine")
        self.sampling  # validates temperature / top_k / top_p

    @property
    def sampling(self) -> SamplingParams:
        """Every rollout request's sampling (rlkit.types.SamplingParams)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, max_tokens=self.max_tokens,
                              seed=self.seed)

    def build_contract(self) -> NumericsContract:
        base = self.contract or NumericsContract.default()
        base = base.with_every_op(self.path)
        return base.with_ops(**self.ops) if self.ops else base


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
            "path": self.settings.path,
            "ops": self.contract.op_paths(),
            "preset": self.settings.preset, "dtype": DTYPE_ALIASES[self.settings.dtype], "rollout": self.settings.rollout,
            "links": {k: (None if v is None else v.to_dict()) for k, v in self.links.items()},
            "first_divergence": self.first_divergence,
            "notes": self.notes,
        }

    def table(self) -> str:
        lines = [f"contract {self.contract.summary()}",
                 f"preset {self.settings.preset} {DTYPE_ALIASES[self.settings.dtype]} rollout={self.settings.rollout}",
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
        return EmbeddedEngine(model, contract, settings.engine, engine_id="parity-engine")
    try:
        from rlkit.rollout.vllm_engine import build_vllm_engine
    except ImportError as exc:
        raise RuntimeError(f"--rollout vllm needs vLLM (pip install -r requirements-vllm.txt): {exc}") from None
    return build_vllm_engine(model, contract, engine_id="parity-vllm")


def run_parity(settings: ParitySettings, log=None) -> ParityReport:
    log = log or (lambda msg: print(msg, file=sys.stderr))
    contract = settings.build_contract()
    cfg = preset(settings.preset).with_dtype(DTYPE_ALIASES[settings.dtype])
    log(f"building {settings.preset} ({cfg.num_parameters() / 1e6:.1f} M params, {cfg.dtype}) on {settings.device}")
    model = build_model(cfg, seed=settings.seed, device=settings.device)
    engine = build_rollout(settings, model, contract)
    prompts = dapo_prompts(settings.prompts)
    sampling = settings.sampling
    requests = [GenerationRequest(f"{pid}-s{settings.seed}", tuple(ids), sampling) for pid, ids in prompts]
    log(f"rollout: {len(requests)} DAPO-Math-17k prompts, up to {settings.max_tokens} tokens each")
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


def report_json(report: ParityReport) -> str:
    return json.dumps(report.to_json(), indent=2)


def settings_from_args(args) -> ParitySettings:
    contract_ops = NumericsContract.parse_ops(args.ops) if args.ops else {}
    return ParitySettings(preset=args.preset, path=args.path, ops=contract_ops, rollout=args.rollout,
                          prompts=args.prompts, max_tokens=args.max_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed, dtype=args.dtype, device=args.device)


__all__ = ["ParitySettings", "ParityReport", "run_parity", "locate_first_divergence", "report_json",
           "settings_from_args"]
