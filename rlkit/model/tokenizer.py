"""The real Qwen3 tokenizer and chat template, loaded offline from the data folder."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from rlkit.model.config import data_dir
from rlkit.types import QWEN3_STOP_IDS as STOP_IDS

EOS_ID = 151645   # <|im_end|>
PAD_ID = 151643   # <|endoftext|>


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    folder = Path(path) if path else data_dir() / "qwen3-tokenizer"
    if not (folder / "vocab.json").is_file():
        raise FileNotFoundError(f"no Qwen3 tokenizer at {folder}; set RLKIT_DATA to the data folder")
    return AutoTokenizer.from_pretrained(str(folder))


def chat_prompt_ids(text: str, tokenizer=None) -> list[int]:
    """Token ids of a single-turn chat prompt (Qwen3 template, thinking disabled), ready for generation."""
    tok = tokenizer or load_tokenizer()
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
    return tok(rendered, add_special_tokens=False)["input_ids"]


def decode(ids, tokenizer=None) -> str:
    return (tokenizer or load_tokenizer()).decode(list(ids), skip_special_tokens=True)
