"""The supervised warm start: a start on a synthetic task with a checked answer (rlkit.data.tasks: "arith"
by default, "add9c" for the learning runs; "add2"/"add3"/"add8w" too), so the policy's reward begins above zero and
RL has something to improve.

Each step trains on a seeded batch of the task's training split (chat prompt -> "demonstration<|im_end|>":
the Problem's demonstration is the bare answer for arith / add2 / add3 and the whole column-by-column working
for add8w and add9c; only those target tokens are trained, the prompt's are not). No comparison is at stake here --
the warm start ends before weight version 0, whose checksum the timeline records -- so it uses the native
ops and computes in fp32 whatever the model's dtype (CPUs without AMX or AVX-512 BF16 run torch's bf16
GEMMs on a slow fallback; measured on an AVX2-only EPYC: ~15 s a step in bf16), then rounds the weights
back to the model's dtype once.

It stops between two steps when `stop` is set (SIGTERM, Ctrl-C) by raising `WarmStartStopped`, and reports
each step to `on_step` (the run writes it to its store, where the dashboard shows it). `until` ends it early
without an error: called after each step (weights still in fp32; an evaluator copies them into an engine of
the model's dtype), a true result ends the warm start there (rlkit/warmstart.py stops on a held-out reward
band this way). On a GPU, `tf32` lets the fp32 GEMMs of the forward and backward use TF32 tensor cores
(torch.set_float32_matmul_precision("high"), set around each step's compute and restored after it, so
nothing else in the process, the evaluator included, runs under it); bf16 autocast is no option here, as
rlkit's ops refuse operands of mixed dtypes. `repeatable` runs each step (forward, backward, optimizer)
under torch's deterministic algorithms (rlkit.ops.repeatable_backward; on CUDA it sets CUBLAS_WORKSPACE_CONFIG
when unset, which torch's check reads at every cuBLAS call; importing rlkit.kernels has usually set it to
:0:0 already, no workspace, which torch 2.11 accepts there: measured on the H200, 2026-12-03 — the
warm start's GEMMs then run without split-K, so its bits are those of that setting; the committed
learning runs' warm start was built before, at torch's defaults, RLKIT_GEMM_CUBLAS=0): SDPA's memory-efficient backward then sums
its key splits in one program and the embedding's and the gather's gradients add in a fixed order, so the
same seed and steps give the same weights bit for bit.

    from rlkit.train.warm_start import warm_start
    losses = warm_start(model, steps=100, seed=0)
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from rlkit import NumericsContract, ops
from rlkit.data.tasks import TASKS, task as get_task
from rlkit.model.qwen3 import ForwardBatch
from rlkit.model.tokenizer import EOS_ID, PAD_ID, chat_prompt_ids, load_tokenizer


class WarmStartStopped(Exception):
    """A stop request arrived during the warm start (the run writes no step; resuming starts it again)."""


@dataclass(frozen=True)
class WarmStartProgress:
    step: int
    """Steps done so far (1 after the first)."""
    total: int
    loss: float
    elapsed_s: float

    @property
    def eta_s(self) -> float:
        return self.elapsed_s / self.step * (self.total - self.step) if self.step else float("nan")

    def to_dict(self) -> dict:
        return {"phase": "warm start", "step": self.step, "total": self.total, "loss": self.loss,
                "elapsed_s": self.elapsed_s, "eta_s": self.eta_s}


@contextlib.contextmanager
def _tf32(on: bool):
    """fp32 matmuls may use TF32 inside (when `on`); the previous precision is restored on exit."""
    if not on:
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _examples(problems, tok) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) of each problem: the chat prompt, and the demonstration + <|im_end|>. The
    one definition of what the warm start trains on, for both layouts below."""
    return [(chat_prompt_ids(p.user_message(), tok),
             tok(p.demonstration, add_special_tokens=False)["input_ids"] + [EOS_ID]) for p in problems]


def _batch(problems, tok) -> tuple[list[torch.Tensor], list[int], list[int]]:
    """Packed sequences, the rows whose next token is a target token, and those target tokens."""
    seqs, rows, labels, off = [], [], [], 0
    for prompt, target in _examples(problems, tok):
        seqs.append(torch.tensor(prompt + target))
        rows.extend(range(off + len(prompt) - 1, off + len(prompt) - 1 + len(target)))
        labels.extend(target)
        off += len(prompt) + len(target)
    return seqs, rows, labels


BACKENDS = ("rlkit", "transformers")


def _transformers_twin(model):
    """transformers' Qwen3ForCausalLM whose parameters are `model`'s own tensors (the same objects, so
    its updates are the model's: no copy either way). Parameter names are the same (rlkit's are Hugging
    Face's); its own init, made first, is dropped."""
    from transformers import Qwen3Config as HFQwen3Config
    from transformers import Qwen3ForCausalLM as HFQwen3

    with torch.device(next(model.parameters()).device):
        twin = HFQwen3(HFQwen3Config(**model.config.to_hf()))
    for name, param in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        setattr(twin.get_submodule(owner), leaf, param)
    if model.config.tie_word_embeddings:
        twin.lm_head.weight = twin.model.embed_tokens.weight
    return twin


def _padded(problems, tok, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L], attention mask, and the (row, position) of every target token's
    predecessor with that target token: the same pairs as `_batch`, laid out for a padded batch."""
    seqs, where, labels = [], [], []
    for i, (prompt, target) in enumerate(_examples(problems, tok)):
        seqs.append(prompt + target)
        where.extend((i, len(prompt) - 1 + j) for j in range(len(target)))
        labels.extend(target)
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.int64)
    mask = torch.zeros((len(seqs), width), dtype=torch.int64)
    for i, q in enumerate(seqs):
        ids[i, :len(q)] = torch.tensor(q)
        mask[i, :len(q)] = 1
    return ids.to(device), mask.to(device), torch.tensor(where, device=device), torch.tensor(labels, device=device)


def warm_start(model, steps: int, seed: int, *, task: str = "arith", batch_size: int = 64, lr: float = 3e-3,
               warmup_steps: int = 0, tf32: bool = False, backend: str = "rlkit", repeatable: bool = False,
               progress: bool = False,
               stop: threading.Event | None = None,
               on_step: Callable[[WarmStartProgress], None] | None = None,
               until: Callable[[WarmStartProgress], bool] | None = None) -> list[float]:
    """Train `model` in place for at most `steps` supervised steps on `task`'s training split (the learning
    rate rising linearly over the first `warmup_steps`); returns the loss per step. `backend` "rlkit" runs
    the model's own forward (packed sequences, native ops); "transformers" runs transformers' Qwen3 on the
    same parameters over a right-padded batch (one SDPA call a layer instead of one a sequence, and bf16
    autocast on CUDA), then the same target-token loss through rlkit's logprob op. The loss is the mean
    over the batch's target tokens (each a row of rlkit's logprob op)."""
    generate = get_task(task).generate
    if generate is None:
        raise ValueError(f"task {task!r} is not a synthetic task; the warm start trains on "
                         f"{', '.join(k for k, t in TASKS.items() if t.generate)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    tok = load_tokenizer()
    dtype = next(model.parameters()).dtype
    model.float()
    # fused: one pass over each parameter per step (4x faster than the per-op AdamW on the 19.4 M-entry tied
    # embedding of the tiny model, measured on the CPU); the warm start's bits are no comparison's concern
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=True)
    losses: list[float] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc="warm start", unit="step", leave=False)
    t0 = time.monotonic()
    device = next(model.parameters()).device
    twin = _transformers_twin(model).train() if backend == "transformers" else None
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if twin is not None and device.type == "cuda"
           else contextlib.nullcontext())
    if repeatable and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    in_order = ops.repeatable_backward if repeatable else contextlib.nullcontext
    model.train()
    try:
        with ops.use_contract(NumericsContract.native()):
            for step in range(steps):
                if stop is not None and stop.is_set():
                    raise WarmStartStopped(f"stopped during the warm start after {step} of {steps} steps")
                if warmup_steps:
                    for group in opt.param_groups:
                        group["lr"] = lr * min(1.0, (step + 1) / warmup_steps)
                problems = generate(batch_size, seed * 100_003 + step, "train")
                with _tf32(tf32), in_order():
                    if twin is None:
                        seqs, rows, labels = _batch(problems, tok)
                        hidden = model(ForwardBatch.packed([s.to(device) for s in seqs]))
                        target_rows = hidden[torch.tensor(rows, device=device)]
                        targets = torch.tensor(labels, device=device)
                    else:
                        ids, mask, where, targets = _padded(problems, tok, device)
                        with amp:
                            hidden = twin.model(input_ids=ids, attention_mask=mask).last_hidden_state
                        target_rows = hidden[where[:, 0], where[:, 1]].float()
                    loss = -model.logprobs(target_rows, targets).float().mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                losses.append(float(loss.detach()))
                done = WarmStartProgress(step + 1, steps, losses[-1], time.monotonic() - t0)
                if on_step is not None:
                    on_step(done)
                if bar is not None:
                    bar.set_postfix(loss=f"{losses[-1]:.3f}")
                    bar.update(1)
                if until is not None and until(done):
                    break
    finally:
        if bar is not None:
            bar.close()
        model.eval()
        model.to(dtype)
    return losses
