"""The embedded trainer: strict logprob recompute over packed sequences, the GRPO/DAPO loss and update."""

from rlkit.train.recompute import pack_order, response_logprobs

__all__ = ["response_logprobs", "pack_order"]
