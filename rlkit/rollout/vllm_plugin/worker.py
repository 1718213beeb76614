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


class RlkitWorkerExtension:
    def _rlkit_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()

    def rlkit_setup(self, contract_json: str, logprobs_mode: str) -> dict:
        """Install the contract and, for rlkit's model, the strict sampler. Returns what runs where."""
        from rlkit.rollout.vllm_plugin.model import RlkitQwen3ForCausalLM
        from rlkit.rollout.vllm_plugin.sampler import RlkitSampler

        model = self._rlkit_model()
        if not isinstance(model, RlkitQwen3ForCausalLM):
            raise TypeError(f"rlkit's worker extension drives RlkitQwen3ForCausalLM, not {type(model).__name__}")
        contract = NumericsContract.from_json(contract_json)
        model.set_contract(contract)
        self.model_runner.sampler = RlkitSampler(self.model_runner, contract, logprobs_mode)
        return {"model": type(model).__name__, "device": str(self.model_runner.device),
                "dtype": str(model.config.dtype),
                "attention_backend": model.model.layers[0].self_attn.attn.attn_backend.get_name(),
                "sampler": "rlkit" if contract.path("logprob") == "strict" else "vllm",
                "checksum": self.rlkit_checksum()}

    def rlkit_set_contract(self, contract_json: str) -> str:
        contract = NumericsContract.from_json(contract_json)
        self._rlkit_model().set_contract(contract)
        self.model_runner.sampler.contract = contract
        return {"fingerprint": contract.fingerprint(),
                "sampler": "rlkit" if contract.path("logprob") == "strict" else "vllm"}

    @torch.no_grad()
    def rlkit_load_tensors(self, state_dict: dict[str, torch.Tensor]) -> str:
        self.model_runner.reload_weights(weights_iterator=iter(list(state_dict.items())))
        # vLLM's weight loaders write through `param.data`, which leaves the parameter's in-place version
        # counter alone; rlkit's strict GEMM keeps fp32 chunk copies of each weight keyed by that counter
        # (kernels/gemm.py), so tell autograd the parameters changed, as an in-place write would have.
        for param in self._rlkit_model().rlkit_state().values():
            torch.autograd.graph.increment_version(param)
        return self.rlkit_checksum()

    def rlkit_load_bytes(self, payload: bytes) -> str:
        from safetensors.torch import load

        return self.rlkit_load_tensors(load(payload))

    def rlkit_checksum(self) -> str:
        return weights_checksum(self._rlkit_model().rlkit_state())

    def rlkit_save(self, folder: str) -> str:
        """Write the current weights (rlkit names) as folder/model.safetensors; returns their checksum."""
        from safetensors.torch import save_file

        weights = self._rlkit_model().rlkit_state()
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
        save_file(tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
        return weights_checksum(weights)
