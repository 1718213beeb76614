"""SharedWeights on the CPU: what can be checked without a GPU (tests/gpu/test_shared_weights_gpu.py
sends weights between two processes on the H200)."""

import pytest
import torch

from rlkit.runners.shared_weights import SharedWeights


def test_cpu_tensors_are_refused_by_name():
    with pytest.raises(ValueError, match=r"CUDA tensors only; \['w'\] are not"):
        SharedWeights({"w": torch.zeros(2)})
