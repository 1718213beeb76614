"""BENCHMARKS.md is drawn from long-format rows only: the RL-step table and the commits line read them."""

import pytest

from rlkit.bench.kernels import render


def _row(op, impl, shape, metric, value, commit="c1"):
    return dict(op=op, impl=impl, shape=shape, metric=metric, median=value, device="dev", commit=commit)


def test_rl_step_table_and_commits_come_from_the_rows():
    rows = [_row("rl_step", path, "validation", m, v, "abc1234")
            for path, vals in (("strict", (3.0, 2.0, 0.9, 0.1, 0, 100)), ("native", (2.5, 1.7, 0.7, 0.1, 97, 100)))
            for m, v in zip(("step_s", "rollout_s", "train_s", "sync_s", "mismatch_count", "compared_tokens"), vals)]
    rows += [_row("rl_step", "strict/native", "validation", "step_s", 1.2, "abc1234")]
    rows += [_row("swiglu", "strict", "swiglu 8x8", "ratio_vs_native", 0.99, "def5678")]
    text = render(rows)
    assert "Commits: abc1234 (rl_step); def5678 (swiglu)" in text
    assert "| validation | two runs | strict | 3.000 | 2.000 | 0.900 | 0.100 |  | 0 / 100 | abc1234 |" in text
    assert "| validation | two runs | native | 2.500 | 1.700 | 0.700 | 0.100 |  | 97 / 100 | abc1234 |" in text
    assert "| validation | two runs | **strict/native** | 1.20 | - | - | - |  |  | abc1234 |" in text
    assert "RL step" not in render([_row("swiglu", "strict", "swiglu 8x8", "ratio_vs_native", 0.99)])


def test_alternating_rows_get_their_own_lines_with_the_pairs_range():
    """Rows of lab/rl_step_ratio_h200.py --interleave (design "alternating") sit beside the two-run rows of
    the same shape, never merged with them; the ratio line says how many pairs and their range."""
    two = [_row("rl_step", "strict/native", "validation", "step_s", 1.10, "abc1234")]
    alt = [dict(_row("rl_step", path, "validation", m, v, "def5678"), design="alternating")
           for path, vals in (("strict", (2.6, 3)), ("native", (2.5, 3)))
           for m, v in zip(("step_s", "steps_timed"), vals)]
    alt.append(dict(_row("rl_step", "strict/native", "validation", "step_s", 1.04, "def5678"), design="alternating",
                    values=[1.01, 1.04, 1.09]))
    text = render(two + alt)
    assert "| validation | two runs | **strict/native** | 1.10 |" in text
    assert "| validation | alternating | strict | 2.600 | - | - | - | 3 |" in text
    assert "| validation | alternating | **strict/native** | 1.04 | - | - | - | 3 pairs, 1.01-1.09 |  | def5678 |" in text


def test_render_from_committed_row_files_keeps_the_compile_report(tmp_path):
    """`python -m rlkit.bench.kernels --render FILES --markdown MD` (no GPU): the tables come from the row
    files, the compile-report block already in MD stays, the attention masking candidate gets its table."""
    import json

    from rlkit.bench.kernels import main

    rows = [_row("swiglu", "strict", "swiglu 8x8", "ratio_vs_native", 0.99, "abc1234"),
            _row("attention_tune", "unmasked", "prefill S=1024", "ratio_vs_native", 0.83, "abc1234"),
            _row("attention_tune", "unmasked", "prefill S=1024", "same_bits", 1.0, "abc1234")]
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = tmp_path / "B.md"
    md.write_text("old\n<!-- compile-report:start -->\nKEEP ME\n<!-- compile-report:end -->\n")
    assert main(["--render", str(f), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "| swiglu 8x8 | strict | ratio_vs_native | 0.990 |" in text and "old" not in text
    assert "KEEP ME" in text
    assert "| prefill S=1024 | unmasked | same_bits | 1.000 |" in text
    # the same rows kept gzipped (lab/bench keeps large runs so) render the same tables
    import gzip

    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(f.read_bytes()))
    md2 = tmp_path / "C.md"
    assert main(["--render", str(packed), "--markdown", str(md2)]) == 0
    unpacked = md2.read_text()
    assert "| swiglu 8x8 | strict | ratio_vs_native | 0.990 |" in unpacked
    assert "| prefill S=1024 | unmasked | same_bits | 1.000 |" in unpacked


def test_rl_step_rows_of_two_calls_combine_into_the_ratio(tmp_path):
    """lab/rl_step_ratio_h200.py --combine: a strict and a native run measured in separate device calls
    give the strict/native rows; a shape with one path only is refused with one line."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "lab" / "rl_step_ratio_h200.py"
    parts = ("step_s", "rollout_s", "train_s", "sync_s")
    for path, base in (("strict", 2.0), ("native", 1.6)):
        (tmp_path / f"{path}.jsonl").write_text("".join(
            json.dumps(_row("rl_step", path, "source", m, base * (i + 1), "c" + path)) + "\n"
            for i, m in enumerate(parts)))
    res = subprocess.run([sys.executable, str(script), "--combine", str(tmp_path / "strict.jsonl"),
                          str(tmp_path / "native.jsonl"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in (tmp_path / "out" / "rl_step_ratio.jsonl").read_text().splitlines()]
    ratio = {r["metric"]: r["median"] for r in rows if r["impl"] == "strict/native"}
    assert ratio == pytest.approx({m: 1.25 for m in parts}, rel=1e-12)
    assert {r["commit"] for r in rows if r["impl"] == "strict/native"} == {"cstrict"}
    res = subprocess.run([sys.executable, str(script), "--combine", str(tmp_path / "strict.jsonl"),
                          "--out", str(tmp_path / "out2")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "needs both a strict and a native run" in res.stderr


def test_attention_backward_table_reads_each_impl_of_a_shape():
    rows = [_row("attention_backward", impl, "0.6b 16 x 655", "ms", ms)
            for impl, ms in (("torch_atomic", 1.0), ("native", 1.25), ("strict", 2.0))]
    rows += [_row("attention_backward", impl, "0.6b 16 x 655", "ratio_vs_torch_atomic", r)
             for impl, r in (("native", 0.8), ("strict", 0.5))]
    text = render(rows)
    assert "| 0.6b 16 x 655 | 1.000 | 1.250 | 2.000 | 0.800 | 0.500 |" in text
    assert "forward + backward" not in render([_row("swiglu", "strict", "s", "ratio_vs_native", 1.0)])


def test_a_shape_measured_at_two_commits_keeps_both_measurements():
    rows = [dict(_row("rl_step", "strict/native", "validation", "step_s", v, sha), design="alternating",
                 values=[v]) for v, sha in ((1.02, "aaa1111"), (1.00, "bbb2222"))]
    text = render(rows)
    assert "| validation | alternating | **strict/native** | 1.02 | - | - | - | 1 pairs, 1.02-1.02 |  | aaa1111 |" in text
    assert "| validation | alternating | **strict/native** | 1.00 | - | - | - | 1 pairs, 1.00-1.00 |  | bbb2222 |" in text


def test_the_native_peer_is_only_started_where_the_route_changed_torchs_defaults(monkeypatch, tmp_path):
    """rlkit.bench.kernels.start_native_peer: with RLKIT_GEMM_CUBLAS=0 (this process keeps torch's cuBLAS
    defaults) or no GEMM/logprob part, no peer starts and the in-process native is the baseline; the table
    says which cuBLAS the ratios are against."""
    from rlkit.bench.kernels import start_native_peer

    monkeypatch.setenv("RLKIT_GEMM_CUBLAS", "0")
    assert start_native_peer(tmp_path, parts=("gemm", "logprob")) is None
    monkeypatch.setenv("RLKIT_GEMM_CUBLAS", "1")
    assert start_native_peer(tmp_path, parts=("attention", "rowwise")) is None
    assert not (tmp_path / "native_peer.log").exists()
    gemm = [_row("gemm", "strict", "qwen3-8b.qkv M=1 K=4096 N=6144", "ratio_vs_native", 0.98)]
    assert "cuBLAS is timed at torch's defaults" in render(gemm)


def test_a_peer_that_cannot_start_leaves_the_benchmark_on_this_process_native(monkeypatch, tmp_path, capsys):
    """A peer whose process fails before its ready line (here: it sees no CUDA device, on any machine) is
    reported, not raised: the benchmark goes on with this process's cuBLAS as the native."""
    from rlkit.bench import kernels

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the peer inherits it
    monkeypatch.setenv("RLKIT_GEMM_CUBLAS", "1")
    for name, value in (("CUBLAS_WORKSPACE_CONFIG", ":0:0"), ("CUBLASLT_WORKSPACE_SIZE", "0")):
        monkeypatch.setenv(name, value)
    assert kernels.start_native_peer(tmp_path, parts=("gemm",)) is None
    said = capsys.readouterr().out
    assert "no native peer at torch's defaults" in said and "needs a CUDA device" in said, said


def test_full_shas_render_as_short_ones_and_rows_of_one_commit_stay_together():
    full = "d48f567d90aa2144665d7d7878fdc86a1d92a8f5"
    rows = [_row("rl_step", "strict/native", "source", "step_s", 0.94, full),
            _row("rl_step", "strict/native", "source", "rollout_s", 0.92, "d48f567"),
            _row("gemm", "strict", "m1", "ratio_vs_native", 1.0, full + "+table")]
    text = render(rows)
    assert full[:8] not in text, text
    assert "| source | two runs | **strict/native** | 0.94 | 0.92 | - | - |  |  | d48f567 |" in text, text
    assert "Commits: d48f567 (rl_step); d48f567+table (gemm)." in text, text


def test_rms_norm_rows_render_under_their_kernel_whatever_their_file_called_the_op():
    """bench_rowwise names a row's op after the kernel (rms_norm); files written up to 92b9c6a
    named it after the shape ("rms_norm+residual"), and their RMSNorm table was never drawn."""
    for op in ("rms_norm", "rms_norm+residual"):
        rows = [_row(op, "native", "rms_norm+residual 8x8", "ms", 0.5),
                _row(op, "strict", "rms_norm+residual 8x8", "ms", 0.4),
                _row(op, "strict", "rms_norm+residual 8x8", "ratio_vs_native", 1.25)]
        text = render(rows)
        assert "## RMSNorm" in text, op
        assert "| rms_norm+residual 8x8 | strict | ratio_vs_native | 1.250 | 0.400 | 0.500 |" in text, op


def test_launch_bound_calls_are_timed_in_turn_and_compared_round_by_round(monkeypatch):
    """`_bench_interleaved`: a b a b ..., so each round's ratio compares one host state; a host whose launch
    latency doubles between rounds leaves the round ratios alone (the medians of the times move)."""
    from rlkit.bench import kernels

    calls, slow = [], iter([1, 2, 2])  # the host's state: round 0 fast, rounds 1-2 slow
    base = {"strict": 40.0, "paged": 50.0}
    state = {}

    def fake_bench(fn, rep=100):
        name = fn()
        if name == "strict":
            state["k"] = next(slow)
        calls.append(name)
        return base[name] * state["k"]

    monkeypatch.setattr(kernels, "_bench", fake_bench)
    times, rounds = kernels._bench_interleaved({"strict": lambda: "strict", "paged": lambda: "paged"}, rounds=3)
    assert calls == ["strict", "paged"] * 3
    assert times == {"strict": 80.0, "paged": 100.0}
    assert kernels._round_ratio(rounds, "paged", "strict") == 1.25


def test_gemm_cells_show_the_other_contract_where_its_rows_exist():
    """The benchmark times v5 or v6, whichever is not the default, beside the default: its ratio joins the
    cell and the table names both contracts; a file without such rows renders as before (rows from before
    the contract row was written ran under v5)."""
    shape = "qwen3-0.6b.o M=256 K=2048 N=1024"
    now = [_row("gemm", "strict", "contract", "name:qwen3-dense-strict-v6", 1.0),
           _row("gemm", "strict", shape, "ratio_vs_native", 0.97), _row("gemm", "strict_v5", shape, "ratio_vs_native", 0.62)]
    text = render(now)
    assert "| 256 | 0.97 · v5 0.62 |" in text
    assert "Contract qwen3-dense-strict-v6. o and down are row-parallel: under v6" in text
    assert "qwen3-dense-strict-v5, timed beside" in text
    before = [_row("gemm", "strict", shape, "ratio_vs_native", 0.62), _row("gemm", "strict_v6", shape, "ratio_vs_native", 0.97)]
    text = render(before)
    assert "| 256 | 0.62 · v6 0.97 |" in text and "Contract qwen3-dense-strict-v5. o and down are row-parallel: under v5" in text
    plain = render(before[:1])
    assert "| 256 | 0.62 |" in plain and "timed beside" not in plain


def test_gemm_cells_show_the_narrow_launch_where_it_was_timed():
    """The narrow-tile launch (strict_narrow, timed at M <= 64 where its bits equal the plan's) joins its
    cells with its own note; a cell where it was not timed keeps its plain ratio."""
    small, large = "qwen3-1.7b.down M=1 K=6144 N=2048", "qwen3-1.7b.down M=256 K=6144 N=2048"
    rows = [_row("gemm", "strict", "contract", "name:qwen3-dense-strict-v6", 1.0),
            _row("gemm", "strict", small, "ratio_vs_native", 0.86), _row("gemm", "strict_narrow", small, "ratio_vs_native", 1.04),
            _row("gemm", "strict_narrow", small, "same_bits_as_triton", 1.0),
            _row("gemm", "strict", large, "ratio_vs_native", 1.03)]
    text = render(rows)
    assert "| 1 | 0.86 · narrow 1.04 |" in text and "| 256 | 1.03 |" in text
    assert "on narrow weight tiles (rlkit.bench.gemm_candidates.NARROW_ONE_CHAIN" in text
    assert "qwen3-dense-strict-narrow" not in text


def test_narrow_launches_cover_the_few_row_products_only():
    """M <= 16 takes 16-row weight tiles over 16 tokens, 16 < M <= 64 32-row tiles over 64, larger M none;
    each K step a whole number of k16 MMAs dividing or multiple of the contract's (gemm._k_step accepts it)."""
    from rlkit import NumericsContract
    from rlkit.bench.kernels import narrow_launch
    from rlkit.kernels import gemm

    assert narrow_launch(1)["BN"] == narrow_launch(16)["BN"] == 16 and narrow_launch(16)["BT"] == 16
    assert narrow_launch(17)["BN"] == narrow_launch(64)["BN"] == 32 and narrow_launch(64)["BT"] == 64
    assert narrow_launch(65) is None and narrow_launch(4096) is None
    k_tile = NumericsContract.default().gemm.k_tile
    for m in (1, 64):
        assert gemm._k_step(narrow_launch(m), k_tile) == narrow_launch(m)["BK"]


def test_an_interleaved_logprob_ratio_shows_the_times_of_its_own_rounds():
    """The logprob's launch-bound cells get a second ratio, strict and torch timed in turn in one process:
    its line shows those two times, not the child process's native time the plain ratio used."""
    shape = "lm_head M=1 K=4096 V=151936"
    rows = [_row("logprob", "native_mm_log_softmax", shape, "ms", 0.339), _row("logprob", "strict", shape, "ms", 0.513),
            _row("logprob", "strict", shape, "ratio_vs_native", 0.66),
            _row("logprob", "strict_interleaved", shape, "ms", 0.31), _row("logprob", "native_interleaved", shape, "ms", 0.34),
            _row("logprob", "strict", shape, "ratio_vs_native_interleaved", 1.09)]
    text = render(rows)
    assert f"| {shape} | strict | ratio_vs_native | 0.660 | 0.513 | 0.339 |" in text
    assert f"| {shape} | strict | ratio_vs_native_interleaved | 1.090 | 0.310 | 0.340 |" in text


def test_gemm_tables_say_when_their_cells_were_timed_in_turn():
    """Rows of a run that timed strict and native in rounds (rounds_in_turn) say so in their table's note;
    rows from before say nothing of rounds."""
    shape = "qwen3-0.6b.o M=1 K=2048 N=1024"
    before = [_row("gemm", "strict", shape, "ratio_vs_native", 0.97)]
    assert "rounds a cell" not in render(before)
    now = before + [_row("gemm", "strict", shape, "rounds_in_turn", 3.0)]
    assert "cuBLAS is timed at torch's defaults, in turn with strict and batch_invariant_ops (3 rounds a cell" in render(now)


def test_cold_weights_rotation_spans_three_l2s_of_distinct_equal_copies(monkeypatch):
    """The GEMM cells are timed on rotating weight copies (kernels.cold_weights) so that no call finds its
    weights in the L2: together at least L2_ROTATION L2s, each an equal copy in its own storage."""
    import types

    import torch

    from rlkit.bench import kernels

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: types.SimpleNamespace(L2_cache_size=1000))
    w = torch.randn(10, 5, dtype=torch.bfloat16)  # 100 bytes
    copies = kernels.cold_weights(w)
    assert len(copies) == 30 and copies[0] is w
    assert all(torch.equal(c, w) for c in copies)
    assert len({c.data_ptr() for c in copies}) == 30
    big = torch.zeros(4000, dtype=torch.bfloat16)  # 8000 bytes: more than three L2s alone
    assert len(kernels.cold_weights(big)) == 1


@pytest.mark.parametrize("args, message", [
    (["--gemm-layers", "o,mlp"], "unknown projection(s) mlp"),
    (["--gemm-m", "1,x"], "expected positive integers"),
    (["--gemm-m", "0"], "expected positive integers"),
])
def test_bad_gemm_selections_are_refused_before_any_gpu_work(args, message, capsys):
    from rlkit.bench import kernels

    with pytest.raises(SystemExit) as exit_:
        kernels.main(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
