"""Weights handed to another process on the same GPU by CUDA IPC (rlkit/runners/shared_weights.py): what
the receiver loads is the sender's tensors bit for bit, the handles pickle small, and the receiver's copy
outlives the handles. The RayRunner takes this path when its trainer and engines share a GPU."""

import io
import pickle

import pytest
import torch
import torch.multiprocessing as mp

from rlkit.runners.shared_weights import SharedWeights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")


def _receiver(payload: bytes, out):
    shared = pickle.loads(payload)
    mine = {}

    def load(state):
        for k, v in state.items():
            mine[k] = torch.empty_like(v).copy_(v)  # the engine copies into its own parameters
        return len(state)

    n = shared.load_into(load)
    buf = io.BytesIO()  # plain bytes: a queued tensor would travel by a file descriptor of this process
    torch.save({k: v.cpu() for k, v in mine.items()}, buf)
    out.put((n, buf.getvalue()))


def test_a_process_on_the_same_gpu_loads_the_senders_bits():
    gen = torch.Generator(device="cuda").manual_seed(0)
    state = {"embed.weight": torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, generator=gen),
             "norm.weight": torch.randn(1024, device="cuda", dtype=torch.bfloat16, generator=gen),
             "strided": torch.randn(64, 32, device="cuda", generator=gen).t()}  # not contiguous: sent contiguous
    shared = SharedWeights(state)
    payload = pickle.dumps(shared)
    assert len(payload) < 4096 and len(shared) == 3, len(payload)  # handles, not 8 MiB of weights
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_receiver, args=(payload, out))
    p.start()
    n, raw = out.get(timeout=120)
    p.join(timeout=60)
    got = torch.load(io.BytesIO(raw))
    assert p.exitcode == 0 and n == 3
    for k, v in state.items():
        a, b = v.cpu(), got[k]
        diff = (a.float() - b.float()).abs()
        assert torch.equal(a, b), (f"{k}: {int((a != b).sum())} of {a.numel()} differ, max |d| {diff.max():.3g}, "
                                   f"first {a[a != b][:4].tolist()} vs {b[a != b][:4].tolist()}")

