"""The one place where Megatron-core is made to run on a machine without a GPU, scoped and reversible.

Why: megatron-core 0.16.1 assumes CUDA in a few spots that rlkit's CPU runs (developers, CI with gloo)
reach. Measured on the project's CPU machines (and pinned by tests/train/test_megatron.py):
1. `torch.cuda.current_device()` used as a device argument (rotary embeddings, attention utilities,
   parameter allocation without use_cpu_initialization);
2. `Tensor.cuda()` when a pipeline-parallel model ties its embedding to the output layer
   (LanguageModule.setup_embeddings_and_output_layer moves the last stage's copy to the GPU before
   the all-reduce that initializes it);
3. the CUDA RNG tracker (`tensor_parallel.random`), which Megatron forks around every dropout, even at
   p = 0, and which reads and writes CUDA generator states.

How: `megatron_cpu_shim()` is a context manager. Inside it, and only when no CUDA device exists,
(1) `torch.cuda.current_device` returns the string "cpu", (2) `Tensor.cuda()` without arguments returns
the tensor itself, (3) Megatron's RNG tracker is a `CpuRNGStatesTracker` that forks the CPU generator.
On exit every patched attribute is put back exactly as it was (also on error), so code outside the
block, and the same code on a GPU machine, sees unmodified torch and Megatron. Nothing is patched at
import time. The patches are process-wide while the block runs (other threads see them too), which is
why rlkit enters the block only around what needs it: building a Megatron model (MegatronTrainer) and
running Megatron's stock layers (stock.py); the strict trainer's forward and backward run outside it. rlkit's strict modules (spec.py) never call any of these; the shim is needed for Megatron's
own code paths (pipeline-parallel tied embeddings, Megatron's stock layers used as the native control).

    from rlkit.train.megatron.cpu_shim import megatron_cpu_shim
    with megatron_cpu_shim():
        model = build_gpt_model(cfg)        # and forward/backward

Run the checks: `python -m pytest -q -m megatron tests/train/test_megatron.py -k shim`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class CpuRNGStatesTracker:
    """Megatron's RNG-tracker interface (add / fork / get_states / set_states / reset) over CPU
    generator states: `fork(name)` swaps the named state into torch's CPU generator for the block."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._is_initialized = False

    def is_initialized(self) -> bool:
        return self._is_initialized

    def reset(self) -> None:
        self.states_, self.seeds_, self._is_initialized = {}, set(), False

    def get_states(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = {k: v.clone() for k, v in states.items()}

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_ or name in self.states_:
            raise ValueError(f"RNG state {name!r} (seed {seed}) already exists")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            # Megatron seeds this state in model_parallel_cuda_manual_seed; a CPU run that never
            # called it (nothing here draws random numbers under the tracker: dropout is 0) gets a
            # fixed seed so the fork is still well defined.
            self.add(name, 2718 + len(self.seeds_))
        outside = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outside)


# One tracker for the process, so named states advance across shim blocks as they would on a GPU.
_CPU_TRACKER = CpuRNGStatesTracker()


def _tensor_cuda_on_cpu(original):
    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        if device is None:
            return self  # no GPU: "move to the current device" is the CPU
        return original(self, device, non_blocking, memory_format=memory_format)

    return cuda


@contextlib.contextmanager
def megatron_cpu_shim(enabled: bool | None = None) -> Iterator[bool]:
    """Patch the three CUDA assumptions for the block (see the module docstring); yields whether the
    shim is active. `enabled=None` means: active exactly when `torch.cuda.is_available()` is False."""
    if enabled is None:
        enabled = not torch.cuda.is_available()
    if not enabled:
        yield False
        return
    from megatron.core.tensor_parallel import random as mrandom

    saved = (torch.cuda.current_device, torch.Tensor.cuda, mrandom._CUDA_RNG_STATE_TRACKER,
             mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED)
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = _tensor_cuda_on_cpu(saved[1])
    mrandom._CUDA_RNG_STATE_TRACKER = _CPU_TRACKER
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    try:
        yield True
    finally:
        (torch.cuda.current_device, torch.Tensor.cuda, mrandom._CUDA_RNG_STATE_TRACKER,
         mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED) = saved
