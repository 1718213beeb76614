"""rlkit's Megatron-core trainer: Megatron's GPTModel for Qwen3 with every op routed through rlkit.ops.

- spec.py      the ModuleSpec (strict RMSNorm, column/row-parallel linears, RoPE + attention, SwiGLU,
               embedding lookup, fp32 output layer) and `build_gpt_model`;
- convert.py   rlkit/HF <-> Megatron weight layouts (fused QKV by KV group, fused gate/up), TP shards,
               PP stage slices; bit-exact both ways;
- trainer.py   `MegatronTrainer`: response_logprobs / state_dict_hf / train_step, TP x CP x PP ranks;
- context_parallel.py  the CP split of a pack, the K/V and logprob gathers (Megatron's own CP is
               Transformer Engine's);
- cpu_shim.py  the one scoped place that lets Megatron run without a GPU;
- stock.py     Megatron's own local layer spec on the same weights: the out-of-the-box negative control.

Importing this package imports megatron-core (pinned 0.16.1); nothing is patched at import.
Run: `python -m pytest -q -m megatron tests/train/test_megatron.py`; on a GPU: `python lab/megatron_h200.py`.
"""

import warnings

# megatron-core announces at import that Transformer Engine and Apex are absent; rlkit uses neither
# (every op is rlkit's), so those notices are silenced for this import only.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex).*not installed.*",
                            category=UserWarning)
    from rlkit.train.megatron.convert import hf_to_megatron, megatron_to_hf, shard_tp, unshard_tp
    from rlkit.train.megatron.cpu_shim import megatron_cpu_shim
    from rlkit.train.megatron.spec import build_gpt_model, qwen3_layer_spec, transformer_config
    from rlkit.train.megatron.trainer import MegatronTrainConfig, MegatronTrainer, TrainBatch

__all__ = ["MegatronTrainer", "MegatronTrainConfig", "TrainBatch", "build_gpt_model", "qwen3_layer_spec",
           "transformer_config", "hf_to_megatron", "megatron_to_hf", "shard_tp", "unshard_tp",
           "megatron_cpu_shim"]
