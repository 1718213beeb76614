"""The measured GEMM launch tables (kernels/gemm_tuned.py), the builder that writes them from the chained
probe's rows (rlkit/bench/gemm_tables.py) and the compile check's requests for their launches. The
launcher's use of an entry (its first-use comparison with the plan) runs under the Triton interpreter:
tests/kernels/triton_interpret_cases.py::test_gemm_measured_launch_is_checked_then_taken; its GPU bits:
tests/gpu/test_kernels_gpu.py::test_every_measured_launch_gives_the_plans_bits."""

import json
import re

import pytest
import torch

from rlkit.bench import compile_plans, gemm_tables
from rlkit.bench.compile_targets import TARGETS, check_one
from rlkit.kernels import gemm_tuned

NARROW = {"kind": "swapped", "BN": 16, "BT": 16, "BK": 256, "num_warps": 4, "num_stages": 5}


def _table(tmp_path, entries, device="Test GPU 80GB", arch="sm_90"):
    path = tmp_path / gemm_tuned.file_name(device)
    path.write_text(json.dumps({"device": device, "arch": arch, "measured": "abc1234", "entries": entries}))
    return path


def _entry(**over):
    e = {"k": 6144, "n": 2048, "rows": [1, 4], "dtype": "bfloat16", "launch": dict(NARROW), "us": 7.9, "route_us": 10.8}
    e.update(over)
    return e


def test_file_names_follow_the_device_name():
    assert gemm_tuned.file_name("NVIDIA H200") == "NVIDIA_H200.json"
    assert gemm_tuned.file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3.json"


def test_an_entry_covers_its_shape_dtype_and_row_range_only(tmp_path):
    _table(tmp_path, [_entry(), _entry(rows=[17, 64], launch=dict(NARROW, BN=32, BT=64, BK=128))])
    find = lambda m, k=6144, n=2048, dtype=torch.bfloat16: gemm_tuned.entry("Test GPU 80GB", m, k, n, dtype, tmp_path)  # noqa: E731
    assert find(1).config() == NARROW and find(4).config() == NARROW
    assert find(5) is None and find(16) is None  # no entry for 5-16
    assert find(17).config()["BN"] == 32 and find(64).config()["BT"] == 64
    assert find(65) is None and find(1, k=3072) is None and find(1, n=1024) is None
    assert find(1, dtype=torch.float16) is None
    assert gemm_tuned.entry("Another GPU", 1, 6144, 2048, torch.bfloat16, tmp_path) is None
    assert gemm_tuned.row_range(1) == (1, 4) and gemm_tuned.row_range(16) == (5, 16)
    assert gemm_tuned.row_range(64) == (17, 64) and gemm_tuned.row_range(65) is None


@pytest.mark.parametrize("bad, message", [
    ({"rows": [1, 8]}, "rows [1, 8] is not one of"),
    ({"launch": {"kind": "tma", "BM": 128, "BN": 128}}, "must be a swapped or an unsplit tiles launch"),
    ({"launch": dict(NARROW, split=True)}, "must be a swapped or an unsplit tiles launch"),
    ({"launch": {"kind": "tiles", "BM": 64, "BN": 16, "GROUP_M": 8, "split": True, "num_warps": 4,
                 "num_stages": 3}}, "must be a swapped or an unsplit tiles launch"),
    ({"launch": ["swapped"]}, "must be a swapped or an unsplit tiles launch"),
    ({"dtype": "float32"}, "dtype 'float32'"),
    ({"k": -1}, "k and n must be positive integers"),
    ({"n": None}, "k and n must be positive integers"),
])
def test_a_malformed_entry_is_refused_naming_the_file(tmp_path, bad, message):
    path = _table(tmp_path, [_entry(**bad)])
    with pytest.raises(gemm_tuned.TableError, match=re.escape(message)) as err:
        gemm_tuned.load(path)
    assert str(path) in str(err.value)


def test_a_malformed_file_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(gemm_tuned.TableError, match="not a readable JSON table"):
        gemm_tuned.load(path)
    path.write_text(json.dumps({"device": "X", "arch": "sm_90"}))
    with pytest.raises(gemm_tuned.TableError, match="\"entries\" list"):
        gemm_tuned.load(path)
    path = _table(tmp_path, [_entry(), _entry(launch=dict(NARROW, num_stages=3))])
    with pytest.raises(gemm_tuned.TableError, match="two entries for k=6144 n=2048 rows=\\[1, 4\\]"):
        gemm_tuned.load(path)


def _probe_rows(shape, on_cublas, times, same=None, device="Test GPU 80GB"):
    """What lab/chained_gemm_h200.py writes for one cell: the route's verdict, each variant's launch,
    bits and time, the baselines' times."""
    rows = [dict(op="gemm_chained", impl="v6 strict", shape=shape, metric="on_cublas", median=float(on_cublas),
                 device=device, commit="abc1234")]
    for impl, us in times.items():
        if impl.startswith("nw"):
            bn = int(impl[2:4])
            rows.append(dict(op="gemm_chained", impl=impl, shape=shape, metric="launch:" + json.dumps(dict(NARROW, BN=bn)),
                             median=1.0, device=device, commit="abc1234"))
            rows.append(dict(op="gemm_chained", impl=impl, shape=shape, metric="same_bits",
                             median=float((same or {}).get(impl, True)), device=device, commit="abc1234"))
        rows.append(dict(op="gemm_chained", impl=impl, shape=shape, metric="us", median=us, device=device,
                         commit="abc1234"))
    return rows


def test_the_builder_keeps_launches_clearly_faster_than_the_strict_call_with_the_same_bits():
    rows = (
        # cuBLAS route took the shape: 10.8 us; the narrow launch 7.9 us -> entry for M 1-4
        _probe_rows("qwen3-1.7b.down M=1 K=6144 N=2048", True,
                    {"cublas in-process": 10.8, "triton plan": 20.0, "nw16": 7.9, "nw32": 8.5})
        # a faster launch with other bits is never taken; the one with the same bits is not 5 % faster
        + _probe_rows("qwen3-1.7b.down M=8 K=6144 N=2048", True,
                      {"cublas in-process": 9.0, "triton plan": 12.0, "nw16": 5.0, "nw32": 8.7}, same={"nw16": False})
        # no route: the plan's Triton launch is the baseline
        + _probe_rows("qwen3-0.6b.down M=64 K=3072 N=1024", False,
                      {"cublas in-process": 5.0, "triton plan": 9.0, "nw16": 6.0})
        # M >= 65: no range, no entry
        + _probe_rows("qwen3-0.6b.down M=256 K=3072 N=1024", True, {"cublas in-process": 9.0, "nw16": 1.0}))
    table = gemm_tables.build(rows, "sm_90")
    assert table["device"] == "Test GPU 80GB" and table["arch"] == "sm_90" and table["measured"] == "abc1234"
    got = {(e["k"], e["n"], tuple(e["rows"])): e for e in table["entries"]}
    assert set(got) == {(6144, 2048, (1, 4)), (3072, 1024, (17, 64))}, got
    assert got[(6144, 2048, (1, 4))]["launch"]["BN"] == 16 and got[(6144, 2048, (1, 4))]["route_us"] == 10.8
    assert got[(3072, 1024, (17, 64))]["route_us"] == 9.0 and got[(3072, 1024, (17, 64))]["us"] == 6.0


def test_a_range_timed_at_several_m_takes_a_launch_only_if_it_gains_at_each():
    fast_at_1 = _probe_rows("qwen3-1.7b.down M=1 K=6144 N=2048", True, {"cublas in-process": 10.0, "nw16": 7.0})
    slow_at_4 = _probe_rows("qwen3-1.7b.down M=4 K=6144 N=2048", True, {"cublas in-process": 10.0, "nw16": 9.9})
    fast_at_4 = _probe_rows("qwen3-1.7b.down M=4 K=6144 N=2048", True,
                            {"cublas in-process": 10.0, "nw16": 7.5, "nw32": 7.0})
    assert gemm_tables.build(fast_at_1 + slow_at_4, "sm_90")["entries"] == []
    assert gemm_tables.build(slow_at_4 + fast_at_1, "sm_90")["entries"] == []
    assert len(gemm_tables.build(fast_at_1, "sm_90")["entries"]) == 1
    # fastest at M = 4 is nw32, which M = 1 did not time: not taken on M = 4's word alone
    assert gemm_tables.build(fast_at_1 + fast_at_4, "sm_90")["entries"] == []
    both = fast_at_1 + _probe_rows("qwen3-1.7b.down M=4 K=6144 N=2048", True, {"cublas in-process": 10.0, "nw16": 7.5})
    (entry,) = gemm_tables.build(both, "sm_90")["entries"]
    assert entry["rows"] == [1, 4] and entry["us"] == 7.5 and entry["route_us"] == 10.0


def test_the_builder_refuses_rows_of_two_gpus_or_without_a_baseline():
    a = _probe_rows("qwen3-1.7b.down M=1 K=6144 N=2048", True, {"cublas in-process": 10.0, "nw16": 7.0})
    b = _probe_rows("qwen3-1.7b.down M=8 K=6144 N=2048", True, {"cublas in-process": 10.0, "nw16": 7.0},
                    device="Other GPU")
    with pytest.raises(ValueError, match="one GPU model"):
        gemm_tables.build(a + b, "sm_90")
    with pytest.raises(ValueError, match="one GPU model"):
        gemm_tables.build([], "sm_90")
    no_base = _probe_rows("qwen3-1.7b.down M=1 K=6144 N=2048", True, {"nw16": 7.0})
    with pytest.raises(ValueError, match="no 'cublas in-process' time"):
        gemm_tables.build(no_base, "sm_90")


def test_the_cli_writes_a_table_the_launcher_loads(tmp_path, capsys):
    rows = _probe_rows("qwen3-1.7b.down M=1 K=6144 N=2048", True, {"cublas in-process": 10.8, "nw16": 7.9})
    src = tmp_path / "chained_gemm.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gemm_tables.main(["--rows", str(src), "--out", str(tmp_path / "tuned")]) == 0
    table = gemm_tuned.load(tmp_path / "tuned" / "Test_GPU_80GB.json")
    assert [e.rows for e in table.entries] == [(1, 4)] and table.entries[0].config() == NARROW
    assert "1 entries" in capsys.readouterr().out
    missing = tmp_path / "absent.jsonl"
    assert gemm_tables.main(["--rows", str(missing), "--out", str(tmp_path)]) == 2
    assert "absent.jsonl: no such file" in capsys.readouterr().err


TOKEN_PADDED = {"kind": "tiles", "BM": 64, "BN": 16, "BK": 256, "GROUP_M": 8, "split": False, "num_warps": 4,
                "num_stages": 3}


def test_the_compile_check_compiles_each_table_launch_for_its_arch(tmp_path, monkeypatch):
    _table(tmp_path, [_entry(), _entry(rows=[5, 16], launch=dict(TOKEN_PADDED))], arch="sm_90")
    _table(tmp_path, [_entry(k=3072, n=1024)], device="Other GPU", arch="gfx942")
    monkeypatch.setattr(gemm_tuned, "TABLE_DIR", tmp_path)
    sm90 = next(t for t in TARGETS if t.arch == 90)
    calls = compile_plans.kernel_calls(sm90.traits, presets=["tiny"], ops=["gemm"],
                                       contracts=("qwen3-dense-strict-v6",))
    measured = {c.kernel: c for c in calls if "gemm_tuned" in c.source}
    assert sorted(measured) == ["_gemm_swapped_kernel", "_gemm_tiles_kernel"], [c.source for c in calls]
    call = measured["_gemm_swapped_kernel"]
    assert call.kwargs["BN"] == 16 and call.kwargs["BK"] == 256 and call.kwargs["C"] == 1 and call.chosen
    assert "Test GPU 80GB K=6144 N=2048 M=1-4" in call.source
    tiles = measured["_gemm_tiles_kernel"]
    assert tiles.kwargs["BM"] == 64 and tiles.kwargs["BK"] == 256 and not tiles.kwargs["SPLIT"]
    assert "Test GPU 80GB K=6144 N=2048 M=5-16" in tiles.source
    for c in (call, tiles):
        result = check_one(c, sm90)
        assert result.error is None and result.metrics["registers"] > 0, result.error


def test_every_committed_table_loads_and_its_launches_compile_for_its_arch():
    """kernels/tuned/*.json as shipped: each loads (gemm_tuned.load validates it), is named after its device,
    and every launch compiles for its arch without spills (the compile check's own requests)."""
    committed = gemm_tuned.tables()
    assert committed, f"no committed table under {gemm_tuned.TABLE_DIR}"
    for table in committed:
        assert table.entries, table.device
        target = next(t for t in TARGETS if t.traits.arch == table.arch)
        calls = [c for c in compile_plans.kernel_calls(target.traits, presets=["tiny"], ops=["gemm"],
                                                       contracts=("qwen3-dense-strict-v6",))
                 if "gemm_tuned" in c.source and table.device in c.source]
        # entries whose launches compile to the same binary are one request (the collector keeps the first)
        assert calls and len(calls) <= len(table.entries), (table.device, [c.source for c in calls])
        assert {c.kwargs["BN"] for c in calls} == {e.config()["BN"] for e in table.entries}
        for call in calls:
            result = check_one(call, target)
            assert result.error is None, (call.source, result.error)
            assert result.metrics.get("spills", 0) == 0, (call.source, result.metrics)
