"""Dumps in other frameworks' layouts, written by the tests from the layouts docs/IMPORT.md describes (no
real dumps exist here), with values chosen so that the expected numbers are known exactly.

Logprobs are short binary fractions (exact in fp32), and the trainer differs from the rollout by exactly
2**-10 at chosen tokens, so every diff is exact and rlkit's divergence metrics are known in closed form.

- `write_slime(dir)`: slime's --dump-details folder: rollout_data/<rollout_id>.pt (Sample.to_dict() of
  every sample) and train_data/<rollout_id>.pt (format 2: per-sample train fields with the trainer's
  log_probs), two rollouts of two prompts x two samples.
- `write_verl(dir)`: verl's trainer.rollout_data_dir folder: <global_step>.jsonl for steps 1 and 2, one
  line per sample with verl's fields (input, output, gts, score, step, request_id) and the per-token fields
  under verl's batch key names, padded to one length with a response_mask.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

LOGPROBS = (-0.5, -1.25, -2.0, -0.125, -3.5, -0.0625, -0.75)
"""Rollout logprobs are drawn from these (exact fp32 values)."""
DELTA = 2.0 ** -10
"""The trainer's logprob is the rollout's minus DELTA at the flipped tokens (exact in fp32 here)."""
PROMPT = [151644, 872, 198]


@dataclass
class Known:
    """One sample as the fixture wrote it: what the import must give back."""

    step: int
    sample_id: str
    prompt_ids: list[int]
    tokens: list[int]
    rollout: list[float]
    trainer: list[float] | None
    reward: float
    loss_mask: list[int]


def _sample_values(step: int, k: int, n: int) -> tuple[list[int], list[float], list[float], list[int]]:
    tokens = [1000 + 17 * step + 5 * k + j for j in range(n)]
    rollout = [LOGPROBS[(step + 2 * k + j) % len(LOGPROBS)] for j in range(n)]
    flips = {j for j in range(n) if (j + k) % 3 == 0}  # a third of the tokens differ
    trainer = [v - DELTA if j in flips else v for j, v in enumerate(rollout)]
    mask = [0 if (k == 1 and j == 0) else 1 for j in range(n)]  # one masked token (a tool token, say)
    return tokens, rollout, trainer, mask


def write_slime(root: Path, rollouts=(0, 1), with_train: bool = True) -> list[Known]:
    """slime's --dump-details layout (THUDM/slime 624b824a): see the module docstring."""
    (root / "rollout_data").mkdir(parents=True, exist_ok=True)
    if with_train:
        (root / "train_data").mkdir(parents=True, exist_ok=True)
    known = []
    for rid in rollouts:
        samples, train = [], []
        for k in range(4):  # two prompts (group_index 0, 1) x two samples
            n = 3 + k
            tokens, rollout, trainer, mask = _sample_values(rid, k, n)
            index = rid * 4 + k
            samples.append({
                "group_index": k // 2, "index": index, "rollout_id": None, "prompt": f"what is {k // 2} + 1?",
                "tokens": PROMPT + tokens, "multimodal_inputs": None, "multimodal_train_inputs": None,
                "multimodal_train_input_id": None, "apply_chat_template_kwargs": {}, "response": "<text>",
                "response_length": n, "label": "1", "reward": float(k % 2), "loss_mask": mask,
                "weight_versions": [str(rid)], "rollout_log_probs": rollout, "rollout_top_p_token_ids": None,
                "rollout_top_p_token_offsets": None, "rollout_routed_experts": None, "remove_sample": False,
                "teacher_log_probs": None, "status": "truncated" if k == 3 else "completed", "metadata": {},
                "generate_function_path": None, "custom_rm_path": None, "train_metadata": None,
                "session_id": None, "non_generation_time": 0.0,
                "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                              "completion_token_num": 0},
                "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0}})
            train.append({"data_parallel_rank": 0, "rollout_position": k, "sample_index": index,
                          "tokens": torch.tensor(PROMPT + tokens), "response_lengths": n,
                          "total_lengths": len(PROMPT) + n, "loss_masks": torch.tensor(mask),
                          "log_probs": torch.tensor(trainer, dtype=torch.float32),
                          "rollout_log_probs": torch.tensor(rollout, dtype=torch.float32)})
            known.append(Known(rid, f"slime/{rid}/{index}", PROMPT, tokens, rollout,
                               trainer if with_train else None, float(k % 2), mask))
        torch.save({"rollout_id": rid, "samples": samples}, root / "rollout_data" / f"{rid}.pt")
        if with_train:
            torch.save({"format_version": 2, "rollout_id": rid, "rank": 0, "samples": train,
                        "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "sample_indices": None,
                                       "partition": None, "micro_batch_indices": [[0, 1, 2, 3]]}]},
                       root / "train_data" / f"{rid}.pt")
    return known


def write_verl(root: Path, steps=(1, 2), pad_to: int = 8) -> list[Known]:
    """verl's trainer.rollout_data_dir layout (verl-project/verl 1dda039b) plus the per-token fields."""
    root.mkdir(parents=True, exist_ok=True)
    known = []
    for step in steps:
        lines = []
        for k in range(4):
            n = 2 + k
            tokens, rollout, trainer, _ = _sample_values(step, k, n)
            pad = pad_to - n
            rid = f"req-{step}-{k}"
            lines.append({"input": f"question {k // 2}", "output": "<text>", "gts": "1", "score": float(k % 2),
                          "step": step, "request_id": rid, "prompts": PROMPT,
                          "responses": tokens + [0] * pad, "response_mask": [1] * n + [0] * pad,
                          "rollout_log_probs": rollout + [0.0] * pad, "old_log_probs": trainer + [0.0] * pad})
            known.append(Known(step, rid, PROMPT, tokens, rollout, trainer, float(k % 2), [1] * n))
        (root / f"{step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return known


def write_verl_stock(root: Path) -> None:
    """What verl writes without the per-token fields: text and score only."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "1.jsonl").write_text(json.dumps({"input": "q", "output": "a", "gts": "1", "score": 1.0, "step": 1})
                                  + "\n")
