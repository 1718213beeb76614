"""Bitwise comparison that explains itself: how many elements differ, by how much, and where first.

`bitwise_equal` is `torch.equal` plus equal sign bits (so -0.0 and +0.0 count as different, as bits do).
`assert_bitwise_equal` raises an AssertionError whose message is the report; tests and the parity CLI
both use it, so a failure always says count / max delta / the first differing values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class BitwiseReport:
    label: str
    total: int
    differing: int
    max_abs_diff: float
    first: list[tuple[tuple[int, ...], float, float]] = field(default_factory=list)
    shape_mismatch: str | None = None

    @property
    def equal(self) -> bool:
        return self.shape_mismatch is None and self.differing == 0

    def __str__(self) -> str:
        if self.shape_mismatch:
            return f"{self.label}: {self.shape_mismatch}"
        if self.equal:
            return f"{self.label}: bitwise equal ({self.total} elements)"
        firsts = ", ".join(f"{list(i)}: {a!r} vs {b!r}" for i, a, b in self.first)
        return (f"{self.label}: {self.differing} of {self.total} elements differ, "
                f"max |delta| = {self.max_abs_diff:.6g}; first: {firsts}")


def differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: True where the bits differ (sign of zero included; NaN equals NaN)."""
    if a.is_floating_point():
        same = (a == b) & (torch.signbit(a) == torch.signbit(b))
        same |= torch.isnan(a) & torch.isnan(b)
        return ~same
    return a != b


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a, b) and not differs(a, b).any())


def compare(actual: torch.Tensor, expected: torch.Tensor, label: str = "tensors",
            first_n: int = 5) -> BitwiseReport:
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return BitwiseReport(label, actual.numel(), actual.numel(), float("inf"),
                             shape_mismatch=f"shape/dtype {tuple(actual.shape)} {actual.dtype} vs "
                                            f"{tuple(expected.shape)} {expected.dtype}")
    a, b = actual.detach().cpu(), expected.detach().cpu()
    diff_mask = differs(a, b)
    count = int(diff_mask.sum())
    if count == 0:
        return BitwiseReport(label, a.numel(), 0, 0.0)
    if a.is_floating_point():
        delta = (a.double() - b.double()).abs()
        finite = torch.isfinite(delta)
        max_delta = float(delta[finite & diff_mask].max()) if bool((finite & diff_mask).any()) else float("inf")
    else:
        max_delta = float((a.long() - b.long()).abs().max())
    idx = diff_mask.nonzero()[:first_n]
    first = [(tuple(int(j) for j in i), a[tuple(i)].item(), b[tuple(i)].item()) for i in idx]
    return BitwiseReport(label, a.numel(), count, max_delta, first)


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, label: str = "tensors") -> None:
    report = compare(actual, expected, label)
    if not report.equal:
        raise AssertionError(str(report))
