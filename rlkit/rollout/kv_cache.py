"""Paged KV cache and its block allocator.

Every layer's keys and values live in [pages, page_size, kv_heads, head_dim] tensors; a sequence owns a
list of pages (its block table) handed out by the allocator. Where a page sits is invisible to the
strict attention (tests/kernels/test_attention.py shuffles pages on purpose).
"""

from __future__ import annotations

import torch


class OutOfPages(RuntimeError):
    pass


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` positions."""
    return -(-tokens // page_size)


class BlockAllocator:
    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise ValueError("the KV cache needs at least one page")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out page 0 first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"{n} pages requested, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


class PagedKVCache:
    """`num_pages` pages for sequences, plus one scratch page (`scratch_page`) the allocator never hands
    out: the padding rows of a CUDA-graph decode batch write and read only there."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_pages + 1, page_size, kv_heads, head_dim)
        self.page_size = page_size
        self.scratch_page = num_pages
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.allocator = BlockAllocator(num_pages)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def write(self, index: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this call's keys/values; slot = page * page_size + offset."""
        self.k[index].view(-1, *k.shape[1:])[slot_mapping] = k
        self.v[index].view(-1, *v.shape[1:])[slot_mapping] = v

    def pages_for(self, tokens: int) -> int:
        return pages_for(tokens, self.page_size)
