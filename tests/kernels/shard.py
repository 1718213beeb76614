"""A pytest plugin that keeps one shard of the collected tests: `-p tests.kernels.shard` with
RLKIT_TEST_SHARD="i/n" keeps every n-th test from the i-th on (0-based), in collection order. Used to run
one slow file in n processes at once (tests/kernels/test_triton_interpret.py)."""

from __future__ import annotations

import os


def parse(value: str) -> tuple[int, int]:
    """ "i/n" -> (i, n), refusing anything but 0 <= i < n."""
    try:
        i, n = (int(part) for part in value.split("/"))
    except ValueError:
        raise ValueError(f"RLKIT_TEST_SHARD={value!r}: expected i/n, e.g. 0/2") from None
    if not 0 <= i < n:
        raise ValueError(f"RLKIT_TEST_SHARD={value!r}: expected 0 <= i < n")
    return i, n


def pytest_collection_modifyitems(config, items):
    value = os.environ.get("RLKIT_TEST_SHARD")
    if not value:
        return
    i, n = parse(value)
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i])
    items[:] = items[i::n]
