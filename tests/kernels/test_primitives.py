"""The math primitives the strict CPU path relies on give the same bits for a value wherever it sits.

Measured facts about this torch build, asserted so a torch upgrade that breaks them fails here first:
exp, log and rsqrt give identical bits for an element whether it is computed alone, in a short slice or
in a long tensor; torch's own sigmoid does not (its vector-loop tail takes another path), which is why
the contract builds sigmoid as 1/(1+exp(-x)).
"""

import pytest
import torch

from rlkit.bitwise import compare

BIG = torch.randn(1 << 16, generator=torch.Generator().manual_seed(1)) * 10


def _position_report(fn):
    whole = fn(BIG)
    bad = 0
    for n in range(1, 70):
        for off in range(0, 50, 7):
            if not torch.equal(fn(BIG[off : off + n].clone()), whole[off : off + n]):
                bad += 1
    singles = torch.cat([fn(BIG[i : i + 1].clone()) for i in range(1000)])
    return bad, compare(singles, whole[:1000], "single elements vs whole")


@pytest.mark.parametrize("name, fn", [
    ("exp", torch.exp),
    ("log", lambda t: torch.log(t.abs() + 1e-3)),
    ("rsqrt", lambda t: torch.rsqrt(t.abs() + 1e-3)),
    ("sigmoid via exp", lambda t: 1.0 / (1.0 + torch.exp(-t))),
])
def test_primitive_is_position_invariant(name, fn):
    bad, report = _position_report(fn)
    assert bad == 0 and report.equal, f"{name}: {bad} slices differ; {report}"


def test_torch_sigmoid_is_not_position_invariant_here():
    bad, report = _position_report(torch.sigmoid)
    print(f"torch.sigmoid: {bad} slices differ; {report}")
    assert bad > 0 or not report.equal
