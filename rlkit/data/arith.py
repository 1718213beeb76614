"""A small synthetic arithmetic task that the tiny model can learn on the CPU in minutes.

Problems are "a+b" with operands 0..4 by default (sums 0..8, one answer token), drawn from a seeded
generator; the user message is
"What is a+b? Reply with the number only." and the reward is 1 when the response's first number is the
sum. `warm_start` gives the model a brief supervised start on the same distribution (only the answer
tokens are trained, so a step costs a few lm_head rows) so its reward begins above zero and RL has
something to improve.
"""

from __future__ import annotations

import random

import torch

from rlkit.data.datasets import Problem


def arith_problems(n: int, seed: int, max_operand: int = 4) -> list[Problem]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append(Problem(f"arith-{seed}-{i}", f"What is {a}+{b}? Reply with the number only.", str(a + b),
                           "arith"))
    return out


def warm_start(model, steps: int, seed: int, batch_size: int = 64, lr: float = 3e-3,
               progress: bool = False) -> list[float]:
    """Supervised steps on arithmetic answers (prompt -> "sum<|im_end|>"), native ops (speed; this is
    not a parity measurement). Returns the loss per step."""
    from rlkit import NumericsContract, ops
    from rlkit.model.qwen3 import ForwardBatch
    from rlkit.model.tokenizer import EOS_ID, chat_prompt_ids, load_tokenizer

    tok = load_tokenizer()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    iterator = range(steps)
    if progress:
        from tqdm.auto import tqdm
        iterator = tqdm(iterator, desc="warm start", unit="step", leave=False)
    model.train()
    with ops.use_contract(NumericsContract.native()):
        for step in iterator:
            probs = arith_problems(batch_size, seed=seed * 100_003 + step)
            seqs, targets = [], []
            for p in probs:
                prompt = chat_prompt_ids(p.user_message(), tok)
                answer = tok(p.answer, add_special_tokens=False)["input_ids"] + [EOS_ID]
                seqs.append(torch.tensor(prompt + answer))
                targets.append((len(prompt), answer))
            hidden = model(ForwardBatch.packed(seqs))
            rows, labels, off = [], [], 0
            for s, (plen, ans) in zip(seqs, targets):
                rows.extend(range(off + plen - 1, off + plen - 1 + len(ans)))
                labels.extend(ans)
                off += len(s)
            lp = model.logprobs(hidden[torch.tensor(rows)], torch.tensor(labels))
            loss = -lp.float().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    model.eval()
    return losses
