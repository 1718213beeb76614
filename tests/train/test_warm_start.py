"""The warm start: computes in fp32 whatever the model's dtype, reports each step, stops between steps."""

import copy
import threading

import pytest
import torch

from rlkit.model import build_model, preset
from rlkit.train.warm_start import WarmStartStopped, warm_start


def test_a_bf16_model_is_trained_in_fp32_and_rounded_once():
    bf16 = build_model(preset("tiny"), seed=3)
    fp32 = copy.deepcopy(bf16).float()
    seen = []
    losses = warm_start(bf16, 2, seed=1, batch_size=8, on_step=seen.append)
    assert losses == warm_start(fp32, 2, seed=1, batch_size=8)
    for (name, a), b in zip(bf16.state_dict().items(), fp32.state_dict().values()):
        assert a.dtype == torch.bfloat16, name
        assert torch.equal(a, b.to(torch.bfloat16)), f"{name}: not the fp32 warm start rounded once"
    assert [(p.step, p.total) for p in seen] == [(1, 2), (2, 2)]
    assert seen[-1].loss == losses[-1] and seen[-1].eta_s == 0.0 and seen[0].elapsed_s > 0


def test_a_stop_request_ends_it_between_steps():
    model = build_model(preset("tiny"), seed=3)
    stop = threading.Event()

    def after_first(progress):
        stop.set()

    with pytest.raises(WarmStartStopped, match="after 1 of 1000 steps"):
        warm_start(model, 1000, seed=1, batch_size=8, stop=stop, on_step=after_first)
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training


def test_the_targets_are_the_whole_working_in_both_layouts():
    """add8w trains on every token of the working + <|im_end|>, not the answer alone; the packed (rlkit)
    and padded (transformers) batches pick the same (sequence, position) pairs and the same targets."""
    from rlkit.data.arith import worked_addition_problems
    from rlkit.model.tokenizer import EOS_ID, chat_prompt_ids, load_tokenizer
    from rlkit.train.warm_start import _batch, _padded

    tok = load_tokenizer()
    problems = worked_addition_problems(5, seed=11, digits=8)
    seqs, rows, labels = _batch(problems, tok)
    ids, mask, where, targets = _padded(problems, tok, "cpu")
    assert torch.equal(targets, torch.tensor(labels)), "the two layouts train on different targets"
    starts = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)[:-1]
    packed_pairs = [(int(torch.searchsorted(starts, r, right=True)) - 1, r) for r in rows]
    assert [(i, int(starts[i]) + p) for i, p in where.tolist()] == [(i, r) for i, r in packed_pairs]
    flat = torch.cat(seqs)
    assert torch.equal(flat[torch.tensor(rows) + 1], torch.tensor(labels))  # each row predicts its target
    assert torch.equal(ids[where[:, 0], where[:, 1] + 1], targets)
    for i, p in enumerate(problems):
        mine = targets[where[:, 0] == i].tolist()
        prompt = chat_prompt_ids(p.user_message(), tok)
        assert mine[-1] == EOS_ID and tok.decode(mine[:-1]) == p.demonstration  # the whole working
        assert p.demonstration.count("\n") == 8 and p.demonstration.endswith(f"Answer: {p.answer}")
        assert 141 <= len(mine) <= 157 and len(seqs[i]) == len(prompt) + len(mine)  # all of the response
        assert int(mask[i].sum()) == len(seqs[i]) and ids[i, :len(prompt)].tolist() == prompt


def test_a_repeatable_warm_start_trains_under_deterministic_algorithms_and_repeats():
    """`repeatable` runs each step under torch's deterministic algorithms (seen from inside the forward)
    and restores the caller's setting after; two runs from the same seed give the same weights bit for
    bit. (The CPU repeats either way; on the H200 SDPA's backward needs the setting, tests/gpu.)"""
    seen = []
    runs = []
    for _ in range(2):
        model = build_model(preset("tiny"), seed=3)
        hook = model.register_forward_pre_hook(lambda m, a: seen.append(torch.are_deterministic_algorithms_enabled()))
        warm_start(model, 2, seed=1, batch_size=4, task="add9c", repeatable=True)
        hook.remove()
        runs.append(model.state_dict())
    assert seen == [True] * 4 and not torch.are_deterministic_algorithms_enabled()
    for name, a in runs[0].items():
        b = runs[1][name]
        diff = (a.float() - b.float()).abs()
        assert torch.equal(a, b), (f"{name}: {int((a != b).sum())} of {a.numel()} differ, max |d| "
                                   f"{diff.max().item():.3g}, first {a.flatten()[(a != b).flatten()][:4].tolist()}")
    warm_start(build_model(preset("tiny"), seed=3), 1, seed=1, batch_size=4, on_step=lambda p: seen.append(
        torch.are_deterministic_algorithms_enabled()))
    assert seen[-1] is False  # not repeatable: the caller's setting (off) throughout
