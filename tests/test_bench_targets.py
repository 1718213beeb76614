"""The targets table: every target judged over all its cells from long-format rows, missing cells never
read as met, a re-measured cell read at its last row, bad row files refused by name (no traceback)."""

import gzip
import json

import pytest

from rlkit.bench import targets
from rlkit.bench.kernels import main as kernels_main
from rlkit.bench.kernels import render
from rlkit.bench.rows import RowsError, read_rows, single_device


def _row(op, impl, shape, metric, value, commit="c1", device="dev", **extra):
    return dict(op=op, impl=impl, shape=shape, metric=metric, median=value, device=device, commit=commit, **extra)


def _all_met(value=1.2) -> list[dict]:
    """One row for every cell of every target, each inside its bound (the RL step at 1.0)."""
    rows = [_row("gemm", "strict", f"{mo}.{la} M={m} K=64 N=64", metric, value)
            for mo in targets.GEMM_MODELS for la in targets.GEMM_LAYERS for m in targets.GEMM_M
            for metric in ("ratio_vs_native", "ratio_vs_batch_invariant_ops")]
    rows += [_row("attention", "strict", f"prefill S={s} H=32 G=8 D=128", "ratio_vs_native", value)
             for s in targets.PREFILL_S]
    rows += [_row("paged_decode", "strict", f"decode B={b} ctx={c} page=16 mode=split", "ratio_vs_native_paged", value)
             for b in targets.DECODE_BATCHES for c in targets.DECODE_CONTEXTS]
    rows += [_row("logprob", "strict", f"lm_head M={m} K=4096 V=151936", "ratio_vs_native", value)
             for m in targets.LOGPROB_M]
    for mo, c in targets.ENGINE_STEPS:
        for mode in ("eager", "graph"):
            rows += [_row("engine_step", "strict", f"{mo} decode step B=64 ctx={c} {mode}", "fraction_of_hbm_limit", 0.5),
                     _row("engine_step", "native", f"{mo} decode step B=64 ctx={c} {mode}", "fraction_of_hbm_limit", 0.5)]
    rows += [_row("rl_step", "strict/native", s, "step_s", 1.0) for s in targets.RL_SHAPES]
    return rows


def _by_target(rows):
    return {v.target: v for v in targets.judge(rows)}


def test_every_cell_inside_its_bound_is_every_target_met():
    verdicts = targets.judge(_all_met())
    assert [v.status for v in verdicts] == ["met"] * 7, [(v.target, v.status, v.missing) for v in verdicts]
    gemm = verdicts[0]
    assert len(gemm.cells) == len(gemm.expected) == 3 * 5 * 7
    assert "## Targets: 7 of 7 met" in targets.render(verdicts)


def test_a_cell_below_the_bound_misses_the_target_and_is_named():
    rows = _all_met()
    rows.append(_row("gemm", "strict", "qwen3-1.7b.down M=256 K=6144 N=2048", "ratio_vs_native", 0.89, "abc1234"))
    v = _by_target(rows)["GEMM vs cuBLAS"]
    assert v.status == "missed"
    assert [(c.label, c.value) for c in v.outside] == [("qwen3-1.7b.down M=256", 0.89)]
    line = next(x for x in targets.render(targets.judge(rows)) if x.startswith("| GEMM vs cuBLAS"))
    assert "0.890 (qwen3-1.7b.down M=256, abc1234)" in line and "**missed**" in line
    # just under the bound reads as under it (three decimals), the bound itself is inside (>= 0.90)
    rows[-1]["median"] = 0.8996
    assert "| **missed** | qwen3-1.7b.down M=256 0.899 |" in "\n".join(targets.render(targets.judge(rows)))
    assert targets._shown(0.9, True) == "0.900" and targets._shown(1.1004, False) == "1.101"
    rows[-1]["median"] = 0.90
    assert _by_target(rows)["GEMM vs cuBLAS"].status == "met"
    # a size the target does not name (M = 16) is not judged
    rows.append(_row("gemm", "strict", "qwen3-1.7b.down M=16 K=6144 N=2048", "ratio_vs_native", 0.5))
    v = _by_target(rows)["GEMM vs cuBLAS"]
    assert v.status == "met" and len(v.cells) == len(v.expected)


def test_a_cell_measured_again_is_read_at_its_last_row():
    rows = _all_met()
    shape = "prefill S=4096 H=32 G=8 D=128"
    assert _by_target(rows + [_row("attention", "strict", shape, "ratio_vs_native", 0.70)])[
        "attention prefill"].status == "missed"
    later = rows + [_row("attention", "strict", shape, "ratio_vs_native", 0.70, "old"),
                    _row("attention", "strict", shape, "ratio_vs_native", 0.85, "new")]
    v = _by_target(later)["attention prefill"]
    assert v.status == "met" and {c.commit for c in v.cells if c.label == "S=4096"} == {"new"}


def test_missing_cells_never_read_as_met():
    rows = [r for r in _all_met() if not (r["op"] == "paged_decode" and "B=64 ctx=8192" in r["shape"])]
    rows = [r for r in rows if r["op"] != "logprob"]
    v = _by_target(rows)
    assert v["paged decode"].status == "partly measured" and v["paged decode"].missing == ["B=64 ctx=8192"]
    assert v["logprob"].status == "not measured"
    text = "\n".join(targets.render(list(v.values())))
    assert "## Targets: 5 of 7 met" in text
    assert "| 5 of 6 (missing: B=64 ctx=8192) |" in text


def test_rl_step_bound_is_an_upper_one_and_only_the_named_shapes_count():
    rows = _all_met()
    rows.append(_row("rl_step", "strict/native", "validation (repeat)", "step_s", 1.65))
    assert _by_target(rows)["RL step"].status == "met"
    rows.append(_row("rl_step", "strict/native", "source", "step_s", 1.10, "s1"))
    assert _by_target(rows)["RL step"].status == "met"
    rows.append(_row("rl_step", "strict/native", "trainer-heavy", "step_s", 1.11, "t2", design="alternating"))
    v = _by_target(rows)["RL step"]
    assert v.status == "missed" and v.worst.label == "trainer-heavy" and v.worst.note == "alternating"


def test_engine_target_is_strict_over_native_of_the_graphed_step():
    rows = _all_met()
    # an eager step far below does not count (the engine decodes in CUDA graphs) ...
    rows.append(_row("engine_step", "strict", "qwen3-0.6b decode step B=64 ctx=512 eager", "fraction_of_hbm_limit", 0.1))
    assert _by_target(rows)["engine decode step"].status == "met"
    # ... the graphed one at 0.39 / 0.5 = 0.78 of native does
    rows.append(_row("engine_step", "strict", "qwen3-0.6b decode step B=64 ctx=512 graph", "fraction_of_hbm_limit", 0.39))
    v = _by_target(rows)["engine decode step"]
    assert v.status == "missed" and v.worst.label == "qwen3-0.6b ctx=512"
    assert v.worst.value == pytest.approx(0.78)


def test_benchmarks_md_opens_with_the_targets_table_only_where_a_target_has_a_cell():
    text = render(_all_met())
    assert text.index("## Targets: 7 of 7 met") < text.index("## RL step: strict / native")
    assert "## Targets" not in render([_row("swiglu", "strict", "swiglu 8x8", "ratio_vs_native", 0.99)])


def _write(path, rows, gz=False):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_cli_exit_codes_and_gzipped_rows(tmp_path, capsys):
    good = _write(tmp_path / "rows.jsonl.gz", _all_met(), gz=True)
    assert targets.main([str(good)]) == 0
    assert "Device: dev" in capsys.readouterr().out
    low = _write(tmp_path / "low.jsonl", [_row("logprob", "strict", "lm_head M=1 K=4096 V=151936",
                                               "ratio_vs_native", 0.66)])
    assert targets.main([str(good), str(low)]) == 1
    assert "| logprob |" in capsys.readouterr().out


@pytest.mark.parametrize("content, said", [
    (None, "no such file"),
    ('{"op": "gemm"\n', ":1: not a JSON row"),
    (json.dumps({"op": "gemm", "impl": "strict"}) + "\n", ":1: a row without shape, metric, median, device, commit"),
    ("\n\n", "no rows in"),
])
def test_bad_row_files_are_refused_by_name(tmp_path, capsys, content, said):
    f = tmp_path / "rows.jsonl"
    if content is not None:
        f.write_text(content)
    with pytest.raises(RowsError, match=said.replace("(", r"\(")):
        read_rows([f])
    assert targets.main([str(f)]) == 2
    assert kernels_main(["--render", str(f)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_rows_of_two_devices_are_refused_not_mixed(tmp_path, capsys):
    h200 = _write(tmp_path / "a.jsonl", _all_met())
    h100 = _write(tmp_path / "b.jsonl", [_row("swiglu", "strict", "s", "ratio_vs_native", 1.0, device="H100")])
    with pytest.raises(RowsError, match=r"dev \(\d+ rows\); H100 \(1 rows\)"):
        single_device(read_rows([h200, h100]))
    md = tmp_path / "B.md"
    assert kernels_main(["--render", str(h200), str(h100), "--markdown", str(md)]) == 2
    assert not md.exists()
    assert targets.main([str(h200), str(h100)]) == 2
    assert "rows of several devices" in capsys.readouterr().err


def test_rlkit_bench_targets_is_the_same_judge(tmp_path, capsys):
    from rlkit.cli import main as rlkit_main

    good = _write(tmp_path / "rows.jsonl", _all_met())
    assert rlkit_main(["bench", "targets", str(good)]) == 0
    assert "## Targets: 7 of 7 met" in capsys.readouterr().out
    assert rlkit_main(["bench", "targets", str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl: no such file" in capsys.readouterr().err
