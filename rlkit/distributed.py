"""Process groups on one host: a free TCP port to meet on, and joining a group (gloo on the CPU, NCCL
on GPUs). Used by the RayRunner's multi-rank actors, the Megatron trainer, the lab scripts and the tests."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_group(device: str, rank: int, world: int, port: int) -> None:
    """Make this process rank `rank` of a `world`-rank default group meeting at 127.0.0.1:`port`: NCCL
    when `device` is CUDA, gloo otherwise."""
    import torch.distributed as dist

    dist.init_process_group("nccl" if str(device).startswith("cuda") else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
