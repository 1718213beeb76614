"""Weights handed to another process on the same GPU by CUDA IPC, not through Ray's object store.

Why: the RayRunner's weight sync sent the trainer's state dict through the object store: every step the
whole model went GPU -> host -> object store -> host -> GPU (1.2 GB of bf16 for the qwen3-0.6b shape).
When the trainer and an engine share one GPU (issue 17's runs on one H200), the engine can copy the
weights straight from the trainer's memory instead: `SharedWeights` carries one CUDA IPC handle per tensor
(a few KB in all), the engine opens them as tensors aliasing the trainer's memory and copies them into its
own parameters, device to device. No bit changes: the engine's acknowledged checksum is computed from what
it loaded, as on every other path (rlkit.runners.base.sync_event compares it with the trainer's).

The sender keeps the tensors alive while the handles are in use (`SharedWeights` holds them; the trainer
actor keeps the last one it published, so an engine restarted later can load it again). Handles only
mean something to a process that sees the same GPU under the same index: the RayRunner uses them only
when Ray gave the trainer and every engine the same GPU id.
"""

from __future__ import annotations

from typing import Mapping

import torch


class SharedWeights:
    """A state dict of CUDA tensors as IPC handles. Pickles small; `open()` in a process on the same GPU
    gives the same tensors (aliasing the sender's memory, no copy)."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        from torch.multiprocessing.reductions import reduce_tensor

        not_cuda = [k for k, v in state.items() if not v.is_cuda]
        if not_cuda:
            raise ValueError(f"SharedWeights: CUDA tensors only; {not_cuda[:3]} are not")
        self._tensors = {k: v.detach().contiguous() for k, v in state.items()}  # kept alive by the sender
        torch.cuda.synchronize()  # what the receiver reads is written
        self.handles = {k: reduce_tensor(v) for k, v in self._tensors.items()}

    def __getstate__(self):
        return {"handles": self.handles}  # the tensors stay with the sender

    def __setstate__(self, state):
        self.handles, self._tensors = state["handles"], None

    def open(self) -> dict[str, torch.Tensor]:
        """The tensors, rebuilt from their handles: the sender's memory. Copy them, then drop them."""
        return {k: rebuild(*args) for k, (rebuild, args) in self.handles.items()}

    def load_into(self, load) -> object:
        """`load(state_dict)` on the opened tensors (it must copy them), then release them; its result."""
        state = self.open()
        try:
            out = load(state)
            torch.cuda.synchronize()  # the copies are done before the sender may reuse the memory
            return out
        finally:
            state.clear()

    def __len__(self) -> int:
        return len(self.handles)


__all__ = ["SharedWeights"]
