"""Run a function on N gloo ranks in fresh processes and collect what each rank returns.

Each rank gets (rank, world, *args); its return value (tensors allowed) is saved to a temp file and
handed back to the test in rank order. Rank failures re-raise in the test with the rank's traceback.
"""

from __future__ import annotations

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


def run_ranks(world: int, fn, *args):
    """fn must be a module-level function (it is pickled into spawned processes)."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_entry, args=(world, free_port(), fn, args, out_dir), nprocs=world,
                           join=True, start_method="spawn")
        results = []
        for rank in range(world):
            got = torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False)
            if "error" in got:
                raise AssertionError(f"rank {rank} of {world} failed:\n{got['error']}")
            results.append(got["ok"])
        return results
