"""The sampler's noise and choice: the in-place Gumbel buffer has the bits of its definition (each row
-log(-log(rand(vocab))) from the row's own generator), the generators end where the definition leaves
them, and the chosen tokens are argmax(z + noise) as defined, top-k's -inf entries included."""

import torch

from rlkit import ops
from rlkit.rollout.sampling import gumbel_noise, request_generator, sample_tokens
from rlkit.types import SamplingParams

VOCAB = 151_936


def _definition(rows: int, generators) -> torch.Tensor:
    return torch.stack([-torch.log(-torch.log(torch.rand(VOCAB, generator=g, dtype=torch.float64).clamp_min(1e-300)))
                        for g in generators[:rows]])


def _check_equal(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    differ = a != b
    assert torch.equal(a, b), (f"{what}: {int(differ.sum())} of {a.numel()} differ, max |d| "
                               f"{(a - b).abs().max().item():.3g}, first {a[differ][:4].tolist()} vs "
                               f"{b[differ][:4].tolist()}")


def test_the_in_place_noise_is_the_definition_bit_for_bit_and_draws_as_much():
    ids = [f"r{i}" for i in range(5)]
    mine = [request_generator(7, r) for r in ids]
    ref = [request_generator(7, r) for r in ids]
    for draw in range(2):  # the second draw checks that both left the generators at the same state
        _check_equal(gumbel_noise(5, VOCAB, mine, "cpu"), _definition(5, ref), f"draw {draw}")


def test_the_choice_is_the_argmax_of_logits_plus_noise_as_defined():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, VOCAB, generator=gen) * 4
    logits[2, :100] = 40.0  # near-ties among the top entries
    for params in (SamplingParams(max_tokens=4, seed=1), SamplingParams(max_tokens=4, seed=1, top_k=50),
                   SamplingParams(max_tokens=4, seed=1, temperature=0.7, top_p=0.9)):
        mine = [request_generator(1, f"q{i}") for i in range(6)]
        ref = [request_generator(1, f"q{i}") for i in range(6)]
        z = ops.process_logits(logits, params)
        want = torch.argmax(z.double() + _definition(6, ref), dim=-1).tolist()
        assert sample_tokens(logits, params, mine) == want, params
