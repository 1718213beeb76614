"""Input checks shared by every op: a bad call fails with the op's name and the shapes it expected."""

from __future__ import annotations

import torch


class OpInputError(ValueError):
    """Raised for a shape, dtype or device mismatch; the message names the op and what it expected."""

    def __init__(self, op: str, message: str):
        super().__init__(f"rlkit.ops.{op}: {message}")
        self.op = op


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise OpInputError(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise OpInputError(op, f"{name} has dtype {t.dtype}; expected one of float32, bfloat16, float16")


def check_same(op: str, **tensors: torch.Tensor) -> None:
    """Same dtype and device for every tensor given."""
    names = list(tensors)
    first = tensors[names[0]]
    for name in names[1:]:
        t = tensors[name]
        if t.device != first.device:
            raise OpInputError(op, f"{name} is on {t.device} but {names[0]} is on {first.device}")
        if t.dtype != first.dtype:
            raise OpInputError(op, f"{name} has dtype {t.dtype} but {names[0]} has {first.dtype}")


def check_dims(op: str, name: str, t: torch.Tensor, ndim: int, expected: str) -> None:
    if t.dim() != ndim:
        raise OpInputError(op, f"{name} has shape {tuple(t.shape)}; expected {expected}")
