"""The strict sampler: vLLM's sampling step with rlkit's logprob and sampling semantics.

Why replace vLLM's sampler on the strict path: vLLM records `logits.log_softmax(-1)` (raw_logprobs) or the
log-softmax of its own temperature / top-k / top-p processing (processed_logprobs). Both reduce over the
vocabulary in an order of the backend's choosing, and vLLM's top-p keeps a different boundary token than
rlkit's, so even on bit-equal logits the recorded logprob differs from the trainer's. Logits processors
only rewrite logits and never see the sampled token; the model only sees it one step later (and never the
last one). The sampler is the one place that holds both the logits and the chosen token, so rlkit swaps
it, per engine, for this subclass (the worker extension sets `model_runner.sampler`; no vLLM global is
touched). With the contract's logprob path native, it defers to vLLM's own `Sampler.forward` unchanged.

What the strict path does per request row (exactly what rlkit's EmbeddedEngine does):
- logits are the model's strict fp32 logits (RlkitQwen3ForCausalLM.compute_logits);
- vLLM's own logits processors that rlkit does not model (penalties, bad words, logit bias, min tokens)
  are applied as vLLM would; rlkit's requests never enable them;
- the token is drawn by `rlkit.rollout.sampling.sample_token` from a per-request generator seeded from
  (seed, request id) by `request_generator`, so a VllmEngine and an EmbeddedEngine sample the same
  tokens for the same requests (vLLM's own per-request generators are not used: the seed travels in
  `SamplingParams.extra_args`, and vLLM's generator rewind for chunked prefill, which CPU generators do
  not support, never runs);
- a replay request (VllmEngine.replay) carries its tokens in extra_args and emits them instead of
  sampling: teacher-forced decode through vLLM's own scheduling and paged cache;
- rows of a partial (chunked) prefill are not sampled at all (vLLM discards their token), so they draw
  no noise;
- logprobs come from `rlkit.ops.logprob_from_logits` under the contract: raw (the model's distribution)
  and processed (temperature, top-k, top-p as rlkit defines them).

What comes back through vLLM (LogprobsTensors): column 0 is the sampled token's logprob in the engine's
`logprobs_mode` (raw_logprobs -> raw, processed_logprobs -> processed), as vLLM defines that column;
when a request asks for `logprobs >= 1`, column 1 carries the *same* token's logprob in the other
semantics (not a top-1 alternative: the strict sampler records no alternatives). VllmEngine reads both
columns through `flat_logprobs=True`, which keeps the duplicate token id.

`compute_logprobs` (used by vLLM for prompt logprobs) is `rlkit.ops.log_softmax`: on the strict path
z - lse(z) elementwise, the same expression `logprob_from_logits` evaluates for one token.
"""

from __future__ import annotations

import torch
from vllm.v1.outputs import LogprobsTensors, SamplerOutput
from vllm.v1.sample.sampler import Sampler

from rlkit import ops
from rlkit.contract import NumericsContract
from rlkit.rollout.sampling import request_generator, sample_token
from rlkit.types import SamplingParams

SEED_KEY = "rlkit_seed"
REQUEST_ID_KEY = "rlkit_request_id"
FORCED_KEY = "rlkit_forced_tokens"
"""Teacher forcing (VllmEngine.replay): the tokens to emit, one per step, instead of sampling."""
_SAMPLING_EPS = 1e-5  # vLLM's threshold below which a temperature means greedy


class _RequestState:
    """One request's sampling state: its generator, and the forced tokens of a replay."""

    def __init__(self, generator: torch.Generator, forced: list[int] | None):
        self.generator, self.forced, self.step = generator, forced, 0

    def next_token(self, logits_row: torch.Tensor, params: SamplingParams) -> int:
        if self.forced is not None:
            token = int(self.forced[self.step])
        else:
            token = sample_token(logits_row, params, self.generator)
        self.step += 1
        return token


class RlkitSampler(Sampler):
    def __init__(self, runner, contract: NumericsContract, logprobs_mode: str = "raw_logprobs"):
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"rlkit's sampler records raw_logprobs or processed_logprobs, not {logprobs_mode}")
        super().__init__(logprobs_mode=logprobs_mode)
        self.runner = runner
        self.contract = contract
        self._state: dict[str, _RequestState] = {}

    # -- rlkit semantics of one row ---------------------------------------------------------------
    def _params(self, md, i: int, vocab: int) -> SamplingParams:
        temperature = float(md.temperature[i]) if md.temperature is not None else 0.0
        if temperature < _SAMPLING_EPS:  # vLLM greedy == rlkit's top_k=1 at temperature 1
            return SamplingParams(temperature=1.0, top_k=1)
        top_k = int(md.top_k[i]) if md.top_k is not None else 0
        top_p = float(md.top_p[i]) if md.top_p is not None else 1.0
        return SamplingParams(temperature=temperature, top_k=0 if top_k >= vocab else max(top_k, 0),
                              top_p=top_p)

    def _request(self, req_id: str) -> "_RequestState":
        state = self._state.get(req_id)
        if state is None:
            extra = self.runner.requests[req_id].sampling_params.extra_args or {}
            gen = request_generator(int(extra.get(SEED_KEY, 0)), str(extra.get(REQUEST_ID_KEY, req_id)))
            state = self._state[req_id] = _RequestState(gen, extra.get(FORCED_KEY))
        return state

    def _prune(self) -> None:
        live = self.runner.requests
        for req_id in [r for r in self._state if r not in live]:
            del self._state[req_id]

    # -- vLLM's sampler interface -----------------------------------------------------------------
    def compute_logprobs(self, logits: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Prompt logprobs: `ops.log_softmax` under the engine's contract (native: torch.log_softmax in
        fp32, what vLLM's own sampler computes)."""
        with ops.use_contract(self.contract):
            return ops.log_softmax(logits.to(torch.float32))

    def forward(self, logits: torch.Tensor, sampling_metadata, predict_bonus_token: bool = False,
                logprobs_mode_override=None) -> SamplerOutput:
        if self.contract.path("logprob") != "strict":
            return super().forward(logits, sampling_metadata, predict_bonus_token, logprobs_mode_override)
        md = sampling_metadata
        if predict_bonus_token or any(md.spec_token_ids or ()):
            raise NotImplementedError("rlkit's strict sampler does not do speculative decoding")
        raw = logits.to(torch.float32)
        extra = self.apply_logits_processors(raw.clone(), md, predict_bonus_token)
        n, vocab = raw.shape
        batch = self.runner.input_batch
        req_ids = batch.req_ids[:n]
        discard = self.runner.discard_request_mask.np[:n]
        primary_raw = (logprobs_mode_override or self.logprobs_mode) == "raw_logprobs"
        want_logprobs = md.max_num_logprobs is not None
        two_columns = want_logprobs and md.max_num_logprobs >= 1
        tokens = torch.zeros(n, dtype=torch.int64, device=raw.device)
        cols = torch.zeros(n, 2 if two_columns else 1, dtype=torch.float32, device=raw.device)
        ranks = torch.ones(n, dtype=torch.int64, device=raw.device)
        with ops.use_contract(self.contract):
            for i, req_id in enumerate(req_ids):
                if discard[i]:
                    continue  # a partial prefill: vLLM drops this row's token, so draw nothing
                params = self._params(md, i, vocab)
                row = extra[i : i + 1]
                token = self._request(req_id).next_token(row[0], params)
                tokens[i] = token
                if not want_logprobs:
                    continue
                tok = tokens[i : i + 1]
                raw_lp = ops.logprob_from_logits(raw[i : i + 1], tok)
                proc_lp = ops.logprob_from_logits(row, tok, params)
                first, second = (raw_lp, proc_lp) if primary_raw else (proc_lp, raw_lp)
                cols[i, 0] = first[0]
                if two_columns:
                    cols[i, 1] = second[0]
                # rank in the primary distribution (log-softmax is monotonic in the logits)
                z = raw[i] if primary_raw else ops.process_logits(row, params)[0]
                ranks[i] = (z > z[token]).sum() + 1
        self._prune()
        logprobs_tensors = None
        if want_logprobs:
            ids = tokens.unsqueeze(-1).expand(n, cols.shape[1]).to(torch.int32).contiguous()
            logprobs_tensors = LogprobsTensors(ids, cols, ranks)
        return SamplerOutput(sampled_token_ids=tokens.to(torch.int32).unsqueeze(-1),
                             logprobs_tensors=logprobs_tensors)
