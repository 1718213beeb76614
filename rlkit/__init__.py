"""rlkit: a lab for bitwise train-rollout consistency in RL post-training of language models.

The two roles are importable objects:
- the numerics contract (`NumericsContract`, `rlkit.ops`): what the trainer and the rollout engine both
  execute, op by op, strict or native;
- the timeline (`rlkit.timeline`): which weight version produced which rollout record and which records
  entered which update.
"""

from rlkit.contract import OPS, PATHS, ContractError, NumericsContract

__version__ = "0.1.0"
__all__ = ["NumericsContract", "ContractError", "OPS", "PATHS", "__version__"]
