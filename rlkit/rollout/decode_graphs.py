"""Decode steps replayed from CUDA graphs.

A decode step (every sequence in the batch feeds one token) launches the same few hundred kernels for a
given batch size; on a small model the host, not the GPU, sets its pace. `DecodeGraphs` captures the
step once per (batch bucket, contract) and replays it: the forward of the whole model and the fp32
logits of every row, written into a tensor the graph owns.

Why capture changes no bit: the graph runs the very kernels an eager step runs, on the same inputs. The
batch is padded to its bucket (1, 2, 4, ... up to max_num_seqs); a padding row is token 0 at position 0,
whose K/V go to the cache's scratch page and whose attention reads only that page, so it touches no
real sequence's cache. Under the strict contract every op is batch-invariant, so a real row's result
cannot depend on the padding either (tests/gpu/test_decode_graphs.py compares tokens and logprobs of
graph and eager decode with torch.equal). Under the native contract the padding changes the GEMM's row
count, which may change bits, as any batch change does on that path.

What makes the step capturable: the batch's metadata lives in static device buffers the host fills
before each replay; the layout is `AttentionLayout.paged_decode` (launch sized by the block table's
width, which is the pages of max_model_len), RoPE gets `max_position`, and no op reads a device value
on the host.

The next step's inputs can also be made on the device (`advance`): the tokens just sampled, every
position one further, the slot looked up in the same block table. The engine then replays the next step
before it has read this one's tokens (rlkit/rollout/engine.py, "one step ahead"): the host's bookkeeping
of a step runs while the GPU computes the next. A row whose next position reaches its sequence's budget
becomes a padding row (token 0, position 0, the scratch page), so the step ahead never writes past the
pages a sequence reserved.
"""

from __future__ import annotations

import torch

from rlkit import ops
from rlkit.contract import NumericsContract
from rlkit.model.qwen3 import ForwardBatch, Qwen3ForCausalLM
from rlkit.rollout.kv_cache import PagedKVCache
from rlkit.types import AttentionLayout


def buckets_up_to(max_rows: int) -> list[int]:
    """Powers of two below max_rows, and max_rows itself."""
    out, b = [], 1
    while b < max_rows:
        out.append(b)
        b *= 2
    return out + [max_rows]


class DecodeGraphs:
    def __init__(self, model: Qwen3ForCausalLM, cache: PagedKVCache, max_num_seqs: int, max_model_len: int,
                 capture: bool = True):
        """capture=False runs the same padded static-buffer step eagerly (any device): the CPU tests
        check padding and buffers with it; only the capture itself needs CUDA."""
        if capture and model.device.type != "cuda":
            raise ValueError("DecodeGraphs needs a model on a CUDA device (or capture=False)")
        self.model, self.cache, self.capture = model, cache, capture
        self.max_model_len = max_model_len
        self.buckets = buckets_up_to(max_num_seqs)
        self.width = cache.pages_for(max_model_len)
        dev, n = model.device, max_num_seqs
        self.ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slots = torch.zeros(n, dtype=torch.int64, device=dev)
        self.context_lens = torch.ones(n, dtype=torch.int64, device=dev)
        self.table = torch.zeros(n, self.width, dtype=torch.int32, device=dev)
        self.limits = torch.ones(n, dtype=torch.int64, device=dev)
        """Each row's budget: `advance` turns a row whose position reaches it into padding."""
        self._graphs: dict[tuple[int, str], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self.captures = 0
        self.steps = 0
        """Decode steps run through this object (replays, where capturing)."""

    def bucket(self, rows: int) -> int:
        for b in self.buckets:
            if b >= rows:
                return b
        raise ValueError(f"{rows} decode rows exceed max_num_seqs={self.buckets[-1]}")

    def _fill(self, rows: int, ids, positions, slots, context_lens, tables, limits) -> None:
        """Host values of the real rows and of the padding rows after them: one host-to-device copy."""
        b = self.bucket(rows)
        scratch, width = self.cache.scratch_page, self.width
        host = [[ids[i], positions[i], slots[i], context_lens[i], limits[i], *tables[i],
                 *[scratch] * (width - len(tables[i]))] for i in range(rows)]
        host += [[0, 0, scratch * self.cache.page_size, 1, 1, *[scratch] * width]] * (b - rows)
        dev = torch.tensor(host, dtype=torch.int64).to(self.ids.device)
        self.ids[:b].copy_(dev[:, 0])
        self.positions[:b].copy_(dev[:, 1])
        self.slots[:b].copy_(dev[:, 2])
        self.context_lens[:b].copy_(dev[:, 3])
        self.limits[:b].copy_(dev[:, 4])
        self.table[:b].copy_(dev[:, 5:])

    @torch.no_grad()
    def advance(self, tokens: torch.Tensor) -> None:
        """The next decode step's inputs from this step's, on the device (no host sync): row i feeds
        tokens[i] at its position + 1, its slot from its own block-table row. A row whose new position
        reaches its limit becomes padding. Rows past len(tokens) (the bucket's padding) stay as they are."""
        n, page = tokens.shape[0], self.cache.page_size
        pos = self.positions[:n] + 1
        live = pos < self.limits[:n]
        col = (pos // page).clamp_max(self.width - 1)
        slot = self.table[:n].gather(1, col[:, None])[:, 0].to(torch.int64) * page + pos % page
        self.ids[:n].copy_(torch.where(live, tokens, 0))
        self.slots[:n].copy_(torch.where(live, slot, self.cache.scratch_page * page))
        self.context_lens[:n].copy_(torch.where(live, pos + 1, 1))
        self.positions[:n].copy_(torch.where(live, pos, 0))

    def _forward(self, b: int) -> torch.Tensor:
        """The captured work: built from the static buffers, inside the capture, so every derived
        tensor (the layout's query starts, the attention plan) is recomputed by each replay."""
        layout = AttentionLayout.paged_decode(self.context_lens[:b], self.table[:b])
        batch = ForwardBatch(self.ids[:b], self.positions[:b], layout, self.cache, self.slots[:b],
                             max_position=self.max_model_len)
        return self.model.logits(self.model(batch))

    def _capture(self, b: int, contract: NumericsContract) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        with ops.use_contract(contract):
            # eager runs first (on a side stream, as torch.cuda.graphs asks): Triton compiles, lazily
            # built tables and buffers exist before capture. They write the same K/V the replay writes.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(b)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self._forward(b)
        self._pool = graph.pool()
        self.captures += 1
        return graph, logits

    @torch.no_grad()
    def run(self, contract: NumericsContract, ids, positions, slots, context_lens, tables, limits) -> torch.Tensor:
        """fp32 logits [rows, vocab] of one decode step (a view into the graph's output: valid until the
        next call). `tables`: each row's pages (at most max_model_len's worth); `limits`: each row's
        budget (positions it may reach)."""
        self._fill(len(ids), ids, positions, slots, context_lens, tables, limits)
        return self.replay(contract, len(ids))

    @torch.no_grad()
    def replay(self, contract: NumericsContract, rows: int) -> torch.Tensor:
        """`run` on the inputs the buffers hold (the last fill, or `advance` since)."""
        b = self.bucket(rows)
        self.steps += 1
        if not self.capture:
            with ops.use_contract(contract):
                return self._forward(b)[:rows]
        key = (b, contract.fingerprint())
        if key not in self._graphs:
            self._graphs[key] = self._capture(b, contract)
        graph, logits = self._graphs[key]
        graph.replay()
        return logits[:rows]
