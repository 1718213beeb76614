"""Run a function on N gloo ranks in fresh processes and collect what each rank returns.

Each rank gets (rank, world, *args); its return value (tensors allowed) is saved to a temp file and
handed back to the test in rank order. Rank failures re-raise in the test with the rank's traceback.
The ranks are forked from one fork server per test session that imported torch, rlkit's model and engine,
and Megatron once (SERVER_PRELOAD): a spawned rank paid ~3 s of CPU for torch and ~6 s more for Megatron,
and the suite starts over 40 ranks on 2 cores. Each rank is still its own process with its own gloo group;
only the imports are shared. The server keeps the environment it started with: a rank gets what it needs
through its arguments.
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


SERVER_PRELOAD = ("torch", "torch.distributed", "rlkit.ops", "rlkit.model", "rlkit.rollout.engine",
                  "rlkit.train.megatron")
"""What the fork server imports before it forks any rank: what every caller's ranks import anyway."""


def run_ranks(world: int, fn, *args, preload: tuple[str, ...] = ()):
    """fn must be a module-level function (it is pickled into the forked processes). `preload`: modules the
    fork server imports besides SERVER_PRELOAD (the server is the process's one, started by the first
    caller; its preload list is what that first caller named)."""
    multiprocessing.set_forkserver_preload(list(dict.fromkeys(SERVER_PRELOAD + tuple(preload))))
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_entry, args=(world, free_port(), fn, args, out_dir), nprocs=world,
                           join=True, start_method="forkserver")
        results = []
        for rank in range(world):
            got = torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False)
            if "error" in got:
                raise AssertionError(f"rank {rank} of {world} failed:\n{got['error']}")
            results.append(got["ok"])
        return results
