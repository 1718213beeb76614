"""The embedded rollout engine: paged KV cache, continuous batching, chunked prefill, seeded sampling.

It runs rlkit's Qwen3 under its own numerics contract and records, for every generated token, its id
and its logprob (raw and/or processed), with the weight version and the contract fingerprint.

Scheduling, once per `step()`:
1. admit waiting requests (FIFO) while a sequence slot is free and the allocator can reserve pages for
   the request's whole budget (prompt + max_tokens, capped at max_model_len) — so no running request is
   ever preempted; a request that could never fit gets an error result at once and the others go on;
2. build one mixed batch under `max_batch_tokens`: every decoding sequence's pending token first, then
   prefill chunks (a long prompt is split over several steps: chunked prefill);
3. one forward of the mixed batch against the paged cache;
4. every sequence whose known tokens are now all in the cache samples its next token from its last
   row's logits, records logprobs, and finishes on a stop token, max_tokens or max_model_len.
Requests join and leave between steps. Nothing about a request's bits depends on its neighbours: the
strict ops are batch-invariant and sampling noise comes from the request's own generator.

One step ahead (decode from CUDA graphs): a step's tokens and logprobs are sampled and computed on the
device and copied to the host in one transfer. While nothing else changes (no request waiting, every row
still running, none replayed or scored), the engine replays the next decode step (its inputs made on the
device, `DecodeGraphs.advance`) before it reads this step's results, so the host's bookkeeping overlaps
the GPU's next step instead of following it. The step ahead runs every row of the step before; a row that
turns out to have finished then is skipped when that step's results are read (its extra K/V went to its
own pages or, past its budget, to the scratch page). The rows that go on get the tokens and logprobs
they would have got one step at a time: under the strict contract their bits do not depend on the other
rows (tests/rollout/test_decode_graphs.py runs both ways and compares).

`score()` (prefill logprobs of whole sequences) and `replay()` (teacher-forced decode) run the same
machinery; the parity chain compares them with the trainer and with what `generate()` recorded.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch

from rlkit import ops
from rlkit.contract import NumericsContract
from rlkit.model.checkpoint import weights_checksum
from rlkit.model.qwen3 import ForwardBatch, Qwen3ForCausalLM
from rlkit.rollout.decode_graphs import DecodeGraphs
from rlkit.rollout.kv_cache import PagedKVCache, pages_for
from rlkit.rollout.sampling import request_generator, sample_token_ids
from rlkit.rollout.types import GenerationRequest, GenerationResult
from rlkit.types import AttentionLayout


@dataclass(frozen=True)
class EngineConfig:
    page_size: int = 16
    """Positions per KV page."""
    num_pages: int = 512
    max_num_seqs: int = 16
    """Sequences running at once."""
    max_batch_tokens: int = 256
    """Tokens per forward: decodes plus prefill chunks (a longer prompt is prefilled in chunks)."""
    max_model_len: int = 2048
    """Prompt + generated tokens per sequence."""
    cuda_graphs: bool = True
    """On a CUDA device, replay decode steps from CUDA graphs (rlkit/rollout/decode_graphs.py); the
    bits are those of eager decode. Ignored on the CPU and for a tensor-parallel shard (collectives in
    a captured graph are not validated yet)."""
    release_when_idle: bool = False
    """Free the KV cache and the decode graphs each time a `generate`, `score` or `replay` call returns,
    and allocate them again at the next call: a trainer in the same process (or on the same GPU) gets
    that memory while it trains, as with vLLM's sleep mode, which discards its KV cache the same way.
    Nothing is kept between calls (no request outlives one), so no bit moves; the price is a new
    allocation each call and, on CUDA, capturing the decode graphs again."""

    def __post_init__(self) -> None:
        for name in ("page_size", "num_pages", "max_num_seqs", "max_batch_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")
        if self.max_batch_tokens < self.max_num_seqs:
            raise ValueError("max_batch_tokens must be >= max_num_seqs (every decode needs one token)")


@dataclass
class _Sequence:
    request: GenerationRequest
    tokens: list[int]
    prompt_len: int
    budget: int                       # max total length (prompt + generated)
    generator: torch.Generator | None
    pages: list[int] = field(default_factory=list)
    computed: int = 0                 # tokens whose K/V are in the cache
    result: GenerationResult | None = None
    forced: deque | None = None       # replay: tokens to feed instead of sampling
    score_logprobs: list[float] | None = None  # score: logprob of every token after the first

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.computed

    def slot(self, position: int, page_size: int) -> int:
        """The flat KV-cache slot of this sequence's token at `position`."""
        return self.pages[position // page_size] * page_size + position % page_size


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 `values` on `device` without a stream sync: a copy from pageable host memory to a CUDA
    device waits for the stream's work first, which would stall the step launched ahead; from pinned
    memory it is queued like a kernel."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class _StepOutput:
    """One step's sampled rows, on the device: tokens (int64) and, where asked, raw and processed logprobs
    (fp32), their copy to the host started at once (one transfer; on CUDA into pinned memory, without a
    sync) and read by `read()`."""

    def __init__(self, seqs: list[_Sequence], tokens: torch.Tensor, raw: torch.Tensor | None,
                 processed: torch.Tensor | None):
        self.seqs, self.tokens = seqs, tokens
        self._has = (raw is not None, processed is not None)
        parts = [tokens.to(torch.float64)] + [t.to(torch.float64) for t in (raw, processed) if t is not None]
        values = torch.stack(parts)  # float64 holds every token id and every fp32 value exactly
        self._event = None
        if values.is_cuda:
            self._host = torch.empty(values.shape, dtype=torch.float64, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = values

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def read(self) -> tuple[list[int], list[float] | None, list[float] | None]:
        self.wait()
        rows = self._host.tolist()
        tokens = [int(t) for t in rows[0]]
        raw = rows[1] if self._has[0] else None
        processed = rows[1 + self._has[0]] if self._has[1] else None
        return tokens, raw, processed


class EmbeddedEngine:
    def __init__(self, model: Qwen3ForCausalLM, contract: NumericsContract | None = None,
                 config: EngineConfig | None = None, engine_id: str = "engine-0", weight_version: int = 0):
        self.model = model.eval()
        self.contract = contract or NumericsContract.default()
        self.config = config or EngineConfig()
        self.engine_id = engine_id
        self.weight_version = weight_version
        self.cache: PagedKVCache | None = None
        self.graphs: DecodeGraphs | None = None
        if not self.config.release_when_idle:  # else at the first call
            self._allocate()
        self._hookable = list(model.modules())
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._finished: list[_Sequence] = []
        self._ahead: _StepOutput | None = None
        """A decode step launched before the one before it was read (see "one step ahead")."""
        self._groups_of: tuple | None = None
        """(the batch list, its sampling groups, its processed-logprob groups) of the last `_groups`."""
        self._ids = itertools.count()

    # -- memory -----------------------------------------------------------------------------------
    def _allocate(self) -> None:
        """The KV cache and (on CUDA, unsharded) the decode graphs' holder, where they are not allocated."""
        if self.cache is not None:
            return
        cfg, model = self.model.config, self.model
        self.cache = PagedKVCache(cfg.num_hidden_layers, self.config.num_pages, self.config.page_size,
                                  model.kv_heads, cfg.head_dim, cfg.torch_dtype, model.device)
        if self.config.cuda_graphs and model.device.type == "cuda" and model.tp is None:
            self.graphs = DecodeGraphs(model, self.cache, self.config.max_num_seqs, self.config.max_model_len)

    def release(self) -> None:
        """Free the KV cache and the decode graphs (and, on CUDA, hand the freed blocks back to the driver):
        an idle engine then holds only its weights. The next `generate`, `score` or `replay` allocates
        them again. Refused while requests are in flight (their K/V live in the cache)."""
        if self.has_unfinished():
            raise RuntimeError(f"{self.engine_id}: release() with requests in flight; run them to the end first")
        self._drain()
        self.cache, self.graphs, self._groups_of = None, None, None
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def allocated(self) -> bool:
        """Whether the KV cache is allocated (False after `release` until the next call)."""
        return self.cache is not None

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        seq = self._new_sequence(request, list(request.prompt_ids),
                                 min(len(request.prompt_ids) + request.sampling.max_tokens, self.config.max_model_len))
        seq.generator = request_generator(request.sampling.seed, request.request_id, self.model.device)
        self._enqueue(seq)

    def _new_sequence(self, request, tokens, budget) -> _Sequence:
        result = GenerationResult(request.request_id, list(request.prompt_ids),
                                  raw_logprobs=[] if request.logprobs_mode in ("raw", "both") else None,
                                  processed_logprobs=[] if request.logprobs_mode in ("processed", "both") else None,
                                  weight_version=self.weight_version,
                                  contract_fingerprint=self.contract.fingerprint(), engine_id=self.engine_id)
        return _Sequence(request, tokens, len(request.prompt_ids), budget, None, result=result)

    def _enqueue(self, seq: _Sequence) -> None:
        vocab = self.model.config.vocab_size
        generating = seq.forced is None and seq.score_logprobs is None
        problem = None
        if any(not 0 <= t < vocab for t in seq.tokens):
            problem = f"token ids must lie in [0, {vocab})"
        elif generating and seq.prompt_len >= self.config.max_model_len:
            problem = (f"prompt of {seq.prompt_len} tokens leaves no room under max_model_len="
                       f"{self.config.max_model_len}")
        elif seq.budget > self.config.max_model_len:
            problem = f"sequence of {seq.budget} tokens exceeds max_model_len={self.config.max_model_len}"
        elif seq.forced is not None and not seq.forced:
            problem = "replay needs a non-empty response"
        elif (need := pages_for(seq.budget, self.config.page_size)) > self.config.num_pages:
            problem = (f"needs {need} KV pages (prompt {seq.prompt_len} + up to "
                       f"{seq.budget - seq.prompt_len} new tokens at page_size {self.config.page_size}); "
                       f"the cache has {self.config.num_pages}")
        if problem:
            seq.result.finish_reason, seq.result.error = "error", f"request {seq.request.request_id}: {problem}"
            self._finished.append(seq)
        else:
            self._waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def _drain(self) -> None:
        """Read the step launched ahead, if any (before anything that changes what the next step runs:
        the contract, the weights)."""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._apply(ahead)

    # -- the step ---------------------------------------------------------------------------------
    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            seq = self._waiting[0]
            need = self.cache.pages_for(seq.budget)
            if need > self.cache.allocator.free_pages:
                break
            seq.pages = self.cache.allocator.allocate(need)
            self._running.append(self._waiting.popleft())

    def _plan(self) -> list[tuple[_Sequence, int]]:
        budget = self.config.max_batch_tokens
        plan = []
        for seq in sorted(self._running, key=lambda s: s.pending > 1):  # decodes first, then prefills
            take = min(seq.pending, budget)
            if take > 0:
                plan.append((seq, take))
                budget -= take
        return plan

    def _forward(self, plan: list[tuple[_Sequence, int]]) -> torch.Tensor:
        dev, ps = self.model.device, self.config.page_size
        ids, positions, slots = [], [], []
        for seq, take in plan:
            pos = list(range(seq.computed, seq.computed + take))
            ids.extend(seq.tokens[seq.computed : seq.computed + take])
            positions.extend(pos)
            slots.extend(seq.slot(p, ps) for p in pos)
        width = max(len(s.pages) for s, _ in plan)
        table = torch.tensor([s.pages + [0] * (width - len(s.pages)) for s, _ in plan], device=dev)
        context = torch.tensor([s.computed + t for s, t in plan], device=dev)
        if all(take == 1 for _, take in plan):
            layout = AttentionLayout.paged_decode(context, table)
        else:
            layout = AttentionLayout.paged(torch.tensor([t for _, t in plan], device=dev), context, table)
        batch = ForwardBatch(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), layout,
                             self.cache, torch.tensor(slots, device=dev),
                             seq_ids=[s.request.request_id for s, _ in plan])
        return self.model(batch)

    def _graph_ok(self, plan: list[tuple[_Sequence, int]]) -> bool:
        """Whether this step can be replayed from a CUDA graph: graphs exist (CUDA), every row decodes one
        token, none is scored, and the model has no forward hooks (the divergence locator captures
        activations by module)."""
        if self.graphs is None or any(take != 1 or s.pending != 1 or s.score_logprobs is not None
                                      for s, take in plan):
            return False
        return not any(m._forward_hooks for m in self._hookable)

    def _graph_step(self, seqs: list[_Sequence], after: _StepOutput | None = None) -> _StepOutput:
        """Replay a decode step of `seqs` and sample it on the device. Its inputs: filled from the host, or,
        for the step ahead of `after` (the same rows, not yet read), made on the device from after's tokens
        (`DecodeGraphs.advance`)."""
        if after is None:
            ps = self.config.page_size
            positions = [s.computed for s in seqs]
            logits = self.graphs.run(self.contract, [s.tokens[s.computed] for s in seqs], positions,
                                     [s.slot(p, ps) for s, p in zip(seqs, positions)], [p + 1 for p in positions],
                                     [s.pages for s in seqs], [s.budget for s in seqs])
        else:
            self.graphs.advance(after.tokens)
            logits = self.graphs.replay(self.contract, len(seqs))
        for s in seqs:
            s.computed += 1
        return self._sample(seqs, logits)

    def _may_step_ahead(self, seqs: list[_Sequence]) -> bool:
        """The next step would be a decode of exactly `seqs`, sampled: nothing waits to be admitted, every
        one is still running, none is replayed, and nothing hooks the model."""
        return (not self._waiting and len(seqs) == len(self._running)
                and all(not s.result.finish_reason and s.forced is None for s in seqs)
                and not any(m._forward_hooks for m in self._hookable))

    @torch.no_grad()
    def step(self) -> list[GenerationResult]:
        """One scheduler step; returns the results that finished in it."""
        self._allocate()
        with ops.use_contract(self.contract):
            if self._ahead is not None:  # read the step launched ahead (launching the next one first)
                out, self._ahead = self._ahead, None
                if self._may_step_ahead(out.seqs):
                    self._ahead = self._graph_step(out.seqs, after=out)
                self._apply(out)
            else:
                self._admit()
                plan = self._plan()
                if plan and self._graph_ok(plan):
                    seqs = [s for s, _ in plan]
                    out = self._graph_step(seqs)
                    if self._may_step_ahead(seqs):
                        self._ahead = self._graph_step(seqs, after=out)
                    self._apply(out)
                elif plan:
                    self._after_forward(plan, self._forward(plan))
            if self._ahead is not None and all(s.result.finish_reason for s in self._ahead.seqs):
                self._ahead.wait()  # every row of the step ahead finished before it: nothing to read
                self._ahead = None
        done, self._finished = self._finished, []
        return [s.result for s in done]

    def _after_forward(self, plan, hidden: torch.Tensor) -> None:
        """`hidden`: the forward's final hidden states, one row per token of the plan (an eager step)."""
        row, sample_rows, samplers = 0, [], []
        for seq, take in plan:
            if seq.score_logprobs is not None:
                targets = seq.tokens[seq.computed + 1 : seq.computed + take + 1]
                if targets:
                    h = hidden[row : row + len(targets)]
                    t = torch.tensor(targets, device=hidden.device)
                    seq.score_logprobs.extend(self.model.logprobs(h, t).tolist())
            seq.computed += take
            row += take
            if seq.pending == 0:
                if seq.score_logprobs is not None:
                    self._finish(seq, "stop")
                else:
                    sample_rows.append(row - 1)
                    samplers.append(seq)
        if samplers:
            self._apply(self._sample(samplers, self.model.logits(hidden[sample_rows])))

    def _sample(self, seqs: list[_Sequence], logits: torch.Tensor) -> _StepOutput:
        """Tokens (teacher-forced where replaying, else sampled per row from its own generator) and their
        logprobs for `seqs`, row i from logits[i], all on the device; their copy to the host is started."""
        dev, n = logits.device, len(seqs)
        sampled = all(s.forced is None for s in seqs)
        forced = [s.forced.popleft() if s.forced is not None else -1 for s in seqs]
        groups, processed_groups = self._groups(seqs)
        if len(groups) == 1 and len(next(iter(groups.values()))) == n:
            # every row, one distribution: the logits as they are (a gather would copy rows x vocab fp32)
            params = next(iter(groups))
            tok = sample_token_ids(logits, params, [s.generator for s in seqs])
        else:
            tok = _to_device(forced, dev)
            for params, rows in groups.items():
                idx = _to_device(rows, dev)
                tok[idx] = sample_token_ids(logits[idx], params, [seqs[r].generator for r in rows])
        # logprobs of the chosen tokens, for all rows at once (rows are independent under the contract);
        # sampled ids are in range by construction (argmax over the vocabulary), forced ones are checked
        raw = ops.logprob_from_logits(logits, tok, ids_in_range=sampled) if any(
            s.result.raw_logprobs is not None for s in seqs) else None
        processed = None
        for params, rows in processed_groups.items():
            identity = raw is not None and params.is_identity  # processed under the identity are the raw logprobs
            if len(rows) == n:
                processed = raw if identity else ops.logprob_from_logits(logits, tok, params, ids_in_range=sampled)
                break
            if processed is None:
                processed = torch.zeros(n, dtype=torch.float32, device=dev)
            idx = _to_device(rows, dev)
            processed[idx] = raw[idx] if identity else ops.logprob_from_logits(logits[idx], tok[idx], params,
                                                                              ids_in_range=sampled)
        return _StepOutput(seqs, tok, raw, processed)

    def _apply(self, out: _StepOutput) -> None:
        """Read a sampled step to the host and append its tokens and logprobs; a row whose sequence had
        finished before the step (a step launched ahead) is skipped."""
        tokens, raw, processed = out.read()
        for i, seq in enumerate(out.seqs):
            res = seq.result
            if res.finish_reason:
                continue
            if res.raw_logprobs is not None:
                res.raw_logprobs.append(raw[i])
            if res.processed_logprobs is not None:
                res.processed_logprobs.append(processed[i])
            self._append(seq, tokens[i])

    def _groups(self, seqs: list[_Sequence]) -> tuple[dict, dict]:
        """(the rows that sample, the rows that record processed logprobs) of `seqs`, each grouped by
        distribution: fixed for a sequence's life, so a step ahead, whose list is the step before's, reuses
        them (grouping 256 rows twice a step was ~1.4 ms of host time on the CPU)."""
        hit = self._groups_of
        if hit is not None and hit[0] is seqs:
            return hit[1], hit[2]
        sampling = self._by_params(seqs, lambda s: s.forced is None)
        processed = self._by_params(seqs, lambda s: s.result.processed_logprobs is not None)
        self._groups_of = (seqs, sampling, processed)
        return sampling, processed

    @staticmethod
    def _by_params(seqs: list[_Sequence], keep=lambda s: True) -> dict:
        """{SamplingParams: rows} grouping the rows whose processed distribution is the same (the first
        row's params stand for the group; only their distribution fields are read)."""
        groups: dict = {}
        for i, seq in enumerate(seqs):
            if keep(seq):
                groups.setdefault(seq.request.sampling.distribution, (seq.request.sampling, []))[1].append(i)
        return dict(groups.values())

    def _append(self, seq: _Sequence, token: int) -> None:
        s, res = seq.request.sampling, seq.result
        seq.tokens.append(token)
        res.token_ids.append(token)
        if seq.forced is not None:
            if not seq.forced:
                self._finish(seq, "stop")
        elif token in s.stop_token_ids:
            self._finish(seq, "stop")
        elif len(res.token_ids) >= s.max_tokens or len(seq.tokens) >= seq.budget:
            self._finish(seq, "length")

    def _finish(self, seq: _Sequence, reason: str) -> None:
        seq.result.finish_reason = reason
        self._running.remove(seq)
        self.cache.allocator.release(seq.pages)
        seq.pages = []
        self._finished.append(seq)

    # -- conveniences -----------------------------------------------------------------------------
    def run_until_done(self, progress: bool = False, total: int | None = None) -> list[GenerationResult]:
        out: list[GenerationResult] = []
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, desc=f"{self.engine_id} generate", unit="req", leave=False, disable=None)
        while self.has_unfinished() or self._finished:
            finished = self.step()
            out.extend(finished)
            if bar is not None:
                bar.update(len(finished))
        if bar is not None:
            bar.close()
        if self.config.release_when_idle:
            self.release()
        return out

    def generate(self, requests: Iterable[GenerationRequest], progress: bool = False) -> list[GenerationResult]:
        """Run requests to completion; results come back in request order."""
        requests = list(requests)
        for r in requests:
            self.add_request(r)
        by_id = {r.request_id: r for r in self.run_until_done(progress, len(requests))}
        return [by_id[r.request_id] for r in requests]

    def score(self, sequences: list[list[int]], request_ids: list[str] | None = None) -> list[torch.Tensor]:
        """Rollout-side prefill: raw logprob of every token after the first of each sequence, computed
        by (chunked) prefill through the paged cache. Returns fp32 tensors of length len(seq) - 1."""
        seqs = []
        for i, seq_tokens in enumerate(sequences):
            rid = request_ids[i] if request_ids else f"score-{next(self._ids)}"
            req = GenerationRequest(rid, tuple(seq_tokens), logprobs_mode="raw")
            seq = self._new_sequence(req, list(seq_tokens), len(seq_tokens))
            seq.score_logprobs = []
            self._enqueue(seq)
            seqs.append(seq)
        self.run_until_done()
        self._raise_errors(seqs)
        return [torch.tensor(s.score_logprobs, dtype=torch.float32) for s in seqs]

    def replay(self, prompts: list[list[int]], responses: list[list[int]],
               request_ids: list[str] | None = None) -> list[torch.Tensor]:
        """Teacher-forced decode: prefill each prompt, then decode its given response one token per step
        (batched with the others), recording raw logprobs exactly as generation would."""
        seqs = []
        for i, (prompt, response) in enumerate(zip(prompts, responses)):
            rid = request_ids[i] if request_ids else f"replay-{next(self._ids)}"
            req = GenerationRequest(rid, tuple(prompt), logprobs_mode="raw")
            seq = self._new_sequence(req, list(prompt), len(prompt) + len(response))
            seq.forced = deque(response)
            self._enqueue(seq)
            seqs.append(seq)
        self.run_until_done()
        self._raise_errors(seqs)
        return [torch.tensor(s.result.raw_logprobs, dtype=torch.float32) for s in seqs]

    @staticmethod
    def _raise_errors(seqs) -> None:
        errors = [s.result.error for s in seqs if s.result.error]
        if errors:
            raise ValueError("; ".join(errors))

    # -- weights and contract -----------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> str:
        """Copy new weights in place (between steps) and return the checksum of what is now loaded. A
        tensor-parallel engine takes the whole model's state dict, loads its shard and checksums that."""
        self._drain()
        state_dict = self.model.shard(state_dict)
        params = dict(self.model.state_dict())
        unknown = sorted(set(state_dict) - set(params))
        missing = sorted(set(params) - set(state_dict))
        if unknown or missing:
            raise ValueError(f"load_weights: unknown {unknown[:3]}, missing {missing[:3]}")
        for name, tensor in state_dict.items():
            if tensor.shape != params[name].shape:
                raise ValueError(f"load_weights: {name} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(params[name].shape)}")
            params[name].copy_(tensor)
        self.weight_version = version
        return weights_checksum(params)

    def checksum(self) -> str:
        return weights_checksum(self.model.state_dict())

    def set_contract(self, contract: NumericsContract) -> None:
        """Switch kernel paths; takes effect at the next step (the runner calls it at step boundaries)."""
        self._drain()
        self.contract = contract
