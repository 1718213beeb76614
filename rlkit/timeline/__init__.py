"""The timeline: the orchestration role's memory of a run.

Which weight version generated each rollout record, which records entered which update, when new weights
reached which engine (with what checksum), which ops ran strict or native at each step. Typed records
(`records.py`), a crash-safe store that another process can follow while the run appends (`store.py`), and
a pandas view for notebooks (`timeline.py`).

    from rlkit.timeline import RunStore, StoreFollower, Timeline
    store = RunStore.create("runs/a", {"model": "tiny", "seed": 0})
    ...  # store.commit_step(summary, records, recomputes, versions, syncs, toggles)
    Timeline("runs/a").steps()

`Timeline` imports pandas on first use, so the run itself (writer) and a follower never pay for it.
"""

from rlkit.timeline.records import (CheckpointRef, Recompute, RecordError, RolloutRecord, StepSummary,
                                    SyncEvent, ToggleEvent, ToggleRequest, WeightVersion)
from rlkit.timeline.store import SCHEMA_VERSION, RunStore, StoreError, StoreFollower

__all__ = ["WeightVersion", "SyncEvent", "RolloutRecord", "Recompute", "StepSummary", "ToggleEvent",
           "ToggleRequest", "CheckpointRef", "RecordError", "RunStore", "StoreFollower", "StoreError",
           "SCHEMA_VERSION", "Timeline"]


def __getattr__(name: str):
    if name == "Timeline":
        from rlkit.timeline.timeline import Timeline

        return Timeline
    raise AttributeError(f"module 'rlkit.timeline' has no attribute {name!r}")
