"""The shard plugin (tests/kernels/shard.py) keeps every n-th test and refuses a malformed shard."""

import pytest

from tests.kernels import shard


class _Hook:
    def __init__(self):
        self.deselected = []

    def pytest_deselected(self, items):
        self.deselected += items


class _Config:
    def __init__(self):
        self.hook = _Hook()


@pytest.mark.parametrize("value, kept", [("0/2", [0, 2, 4]), ("1/2", [1, 3]), ("2/3", [2]), ("0/1", [0, 1, 2, 3, 4])])
def test_a_shard_keeps_every_nth_test_and_deselects_the_rest(monkeypatch, value, kept):
    monkeypatch.setenv("RLKIT_TEST_SHARD", value)
    items, config = list(range(5)), _Config()
    shard.pytest_collection_modifyitems(config, items)
    assert items == kept
    assert sorted(items + config.hook.deselected) == list(range(5))


@pytest.mark.parametrize("value", ["2/2", "-1/2", "1", "a/b", "1/0"])
def test_a_malformed_shard_is_refused_by_name(value):
    with pytest.raises(ValueError, match="RLKIT_TEST_SHARD"):
        shard.parse(value)
