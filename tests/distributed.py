"""Run a function on N gloo ranks in fresh processes and collect what each rank returns.

Each rank gets (rank, world, *args); its return value (tensors allowed) is saved to a temp file and
handed back to the test in rank order. Rank failures re-raise in the test with the rank's traceback.
With `preload`, the ranks are forked from a fork server that imported those modules once (Megatron's
import alone is ~6 s of CPU a process: a test that starts many ranks on 2 cores pays it once).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlkit.distributed import free_port


def _entry(rank, world, port, fn, args, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        torch.save({"ok": result}, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:  # noqa: BLE001 - reported to the parent test
        torch.save({"error": traceback.format_exc()}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, *args, preload: tuple[str, ...] = ()):
    """fn must be a module-level function (it is pickled into spawned processes). `preload`: modules the
    fork server imports before forking the ranks (the server is the process's one, started by the first
    caller; its preload list is what that first caller named)."""
    method = "spawn"
    if preload:
        multiprocessing.set_forkserver_preload(list(preload))
        method = "forkserver"
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_entry, args=(world, free_port(), fn, args, out_dir), nprocs=world,
                           join=True, start_method=method)
        results = []
        for rank in range(world):
            got = torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False)
            if "error" in got:
                raise AssertionError(f"rank {rank} of {world} failed:\n{got['error']}")
            results.append(got["ok"])
        return results
