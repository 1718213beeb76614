"""The worker extension VllmEngine installs in every vLLM worker (`worker_extension_cls`).

vLLM mixes this class into its worker class, so its methods run beside the model, in the engine process
in in-process mode (VLLM_ENABLE_V1_MULTIPROCESSING=0) and in the worker process in multiprocess mode; the
driver reaches them with `llm.collective_rpc("rlkit_...")`. The engine calls:
- `rlkit_setup(contract_json, logprobs_mode)` once after start: the contract, the strict sampler;
- `rlkit_set_contract(contract_json)` at a step boundary (same attention path only);
- `rlkit_load_tensors(state_dict)` (in-process: the tensors themselves) or `rlkit_load_bytes(payload)`
  (multiprocess: one safetensors blob, so no pickled tensors cross the process boundary); both go through
  vLLM's in-place `reload_weights` (each parameter's weight_loader) and return the checksum of what the
  worker now holds, computed here, beside the weights (`rlkit.model.checkpoint.weights_checksum`);
- `rlkit_checksum()`, `rlkit_save(folder)` (the engine rebuilds from it when the attention path changes).

Importing this module registers rlkit's model and attention backend (`register()`): vLLM imports the
worker extension in each worker before it builds the model, which is what makes the out-of-tree model
load in a spawned worker process without an entry point.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlkit.contract import NumericsContract
from rlkit.model.checkpoint import weights_checksum
from rlkit.rollout.vllm_plugin import register

register()


def rlkit_named_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under rlkit's (= Hugging Face's) names. rlkit's model holds them as is; vLLM's
    own Qwen3 (the all-native path) stacks q/k/v and gate/up, which are split back here (views)."""
    from rlkit.rollout.vllm_plugin.model import RlkitQwen3ForCausalLM

    if isinstance(model, RlkitQwen3ForCausalLM):
        return model.rlkit_state()
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if ".qkv_proj." in name:
            for part, t in zip(("q_proj", "k_proj", "v_proj"), p.split([q, kv, kv], 0)):
                out[name.replace("qkv_proj", part)] = t
        elif ".gate_up_proj." in name:
            for part, t in zip(("gate_proj", "up_proj"), p.chunk(2, 0)):
                out[name.replace("gate_up_proj", part)] = t
        else:
            out[name] = p
    return out


class RlkitWorkerExtension:
    def _rlkit_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()

    def rlkit_setup(self, contract_json: str, logprobs_mode: str) -> dict:
        """Install the contract and, for rlkit's model, the strict sampler. Returns what runs where."""
        from rlkit.rollout.vllm_plugin.model import RlkitQwen3ForCausalLM
        from rlkit.rollout.vllm_plugin.sampler import RlkitSampler

        model = self._rlkit_model()
        contract = NumericsContract.from_json(contract_json)
        info = {"model": type(model).__name__, "device": str(self.model_runner.device), "sampler": "vllm"}
        if isinstance(model, RlkitQwen3ForCausalLM):
            model.set_contract(contract)
            self.model_runner.sampler = RlkitSampler(self.model_runner, contract, logprobs_mode)
            info["sampler"] = "rlkit" if contract.path("logprob") == "strict" else "vllm"
            layer = model.model.layers[0].self_attn.attn
            info["attention_backend"] = layer.attn_backend.get_name()
        else:
            info["attention_backend"] = "vllm-model"
        info["checksum"] = self.rlkit_checksum()
        return info

    def rlkit_set_contract(self, contract_json: str) -> str:
        contract = NumericsContract.from_json(contract_json)
        self._rlkit_model().set_contract(contract)
        self.model_runner.sampler.contract = contract
        return contract.fingerprint()

    @torch.no_grad()
    def rlkit_load_tensors(self, state_dict: dict[str, torch.Tensor]) -> str:
        self.model_runner.reload_weights(weights_iterator=iter(list(state_dict.items())))
        return self.rlkit_checksum()

    def rlkit_load_bytes(self, payload: bytes) -> str:
        from safetensors.torch import load

        return self.rlkit_load_tensors(load(payload))

    def rlkit_checksum(self) -> str:
        return weights_checksum(rlkit_named_weights(self._rlkit_model()))

    def rlkit_save(self, folder: str) -> str:
        """Write the current weights (rlkit names) as folder/model.safetensors; returns their checksum."""
        from safetensors.torch import save_file

        weights = rlkit_named_weights(self._rlkit_model())
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
        save_file(tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
        return weights_checksum(weights)
