"""On the H200: the compile check's static resource numbers against what the driver reports when it loads
the same binary, and the real device's traits against the ones the check assumes for sm_90.

The compile check (rlkit/bench/compile_targets.py) reads registers and spills from the cubin (cuobjdump,
ptxas -v) on a machine without a GPU; Triton's `n_regs` / `n_spills` come from the driver at load time.
Here both are read for every plan the qwen3-8b shapes get on the real device: equal numbers show the
static report says what a launch would see.

    python3 -m pip install -q --no-deps --no-build-isolation -e .   # once per fresh machine, offline
    python3 lab/compile_crosscheck_h200.py                         # $OUT/crosscheck.jsonl, a table
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import triton


def main() -> int:
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="rlkit-crosscheck-"))
    from rlkit.bench.compile_plans import kernel_calls
    from rlkit.bench.compile_targets import TARGETS, check_one, compile_call
    from rlkit.kernels import _triton as _tr

    out = Path(os.environ.get("OUT", "crosscheck-out"))
    out.mkdir(parents=True, exist_ok=True)
    sm90 = TARGETS[1]
    real = _tr.gpu_traits(torch.device("cuda", 0))
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    print(f"device traits {real}\nassumed       {sm90.traits}")
    rows, mismatches = [], 0
    for call in kernel_calls(real, presets=["qwen3-8b"]):
        res = check_one(call, sm90)
        if res.error:
            print(f"FAIL {res.where}: {res.error}")
            mismatches += 1
            continue
        loaded = compile_call(call, sm90)  # the same binary, from the cache
        loaded._init_handles()  # the driver loads it and reports registers and local size / 4
        row = dict(op=call.op, kernel=call.kernel, plan=call.plan, static_registers=res.metrics["registers"],
                   driver_registers=loaded.n_regs, static_n_spills=res.metrics["n_spills"],
                   driver_n_spills=loaded.n_spills, spill_store_bytes=res.metrics.get("spill_store_bytes"),
                   shared_bytes=res.metrics["shared_bytes"], triton=triton.__version__)
        same = (row["static_registers"], row["static_n_spills"]) == (row["driver_registers"], row["driver_n_spills"])
        mismatches += not same
        rows.append(row)
        print(f"{'ok ' if same else 'DIFF'} {call.op:9s} {call.plan[:70]:70s} regs {row['static_registers']}/"
              f"{row['driver_registers']} n_spills {row['static_n_spills']}/{row['driver_n_spills']} "
              f"spill stores {row['spill_store_bytes']} B")
    (out / "crosscheck.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} plans loaded, {mismatches} differ or failed")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
