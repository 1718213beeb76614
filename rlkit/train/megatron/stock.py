"""Stock Megatron-core (its own local layer spec) as the negative control for the strict trainer.

What: the same Qwen3 weights in Megatron's GPTModel built from `get_gpt_layer_local_spec(qk_layernorm=
True, normalization="RMSNorm")` with Megatron's rotary embedding: torch RMSNorm, F.linear GEMMs in
the model dtype, Megatron's softmax attention with an explicit causal mask, bf16 logits. This is "a
Megatron trainer out of the box"; its logprobs are log_softmax of the upcast logits (what
vocab_parallel_cross_entropy computes). Nothing here follows the numerics contract, so the
mismatch count against the rollout's recorded logprobs is the baseline the strict spec removes.

It runs on the CPU only through the shim (cpu_shim.py): Megatron's rotary embedding asks for
torch.cuda.current_device() and its attention forks the CUDA RNG tracker around dropout. Its default
causal mask is built on "cuda" (transformer/utils.py get_default_causal_mask), so the mask is passed.
TP 1 only (a reference, not a trainer).

Run: `python -m pytest -q -m megatron tests/train/test_megatron.py -k stock`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

from rlkit.model.config import Qwen3Config
import rlkit.train.megatron.convert as convert
from rlkit.train.megatron.cpu_shim import megatron_cpu_shim
from rlkit.train.megatron.spec import transformer_config
from rlkit.train.megatron.trainer import initialize_parallel


@torch.no_grad()
def stock_response_logprobs(cfg: Qwen3Config, hf_state: Mapping[str, torch.Tensor],
                            sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int],
                            device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Response-token logprobs from stock Megatron layers, one sequence per forward (b = 1, sbhd)."""
    initialize_parallel(1, 1)
    config = transformer_config(cfg)
    config.use_te_activation_func = False  # Megatron's own glu(silu) activation path
    with megatron_cpu_shim():
        model = GPTModel(config=config,
                         transformer_layer_spec=get_gpt_layer_local_spec(qk_layernorm=True,
                                                                         normalization="RMSNorm"),
                         vocab_size=cfg.vocab_size, max_sequence_length=cfg.max_position_embeddings,
                         share_embeddings_and_output_weights=cfg.tie_word_embeddings,
                         position_embedding_type="rope", rotary_base=int(cfg.rope_theta)).to(device)
        params = dict(model.named_parameters())
        meg = convert.hf_to_megatron(hf_state, cfg)
        if set(params) != set(meg):
            raise ValueError(f"stock spec parameters differ from the conversion: {set(params) ^ set(meg)}")
        for name, p in params.items():
            p.copy_(meg[name])
        model.eval()
        out = []
        for seq, p in zip(sequences, prompt_lens):
            ids = torch.as_tensor(list(seq), dtype=torch.int64, device=device)
            n = ids.numel()
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), diagonal=1)[None, None]
            logits = model(ids[None], torch.arange(n, device=device)[None], mask)[0]   # [n, V] bf16
            logprobs = torch.log_softmax(logits[p - 1 : n - 1].float(), dim=-1)
            out.append(logprobs.gather(-1, ids[p:, None]).squeeze(-1))
    return out
