"""BENCHMARKS.md is drawn from long-format rows only: the RL-step table and the commits line read them."""

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
    assert "| validation | strict | 3.000 | 2.000 | 0.900 | 0.100 | 0 / 100 | abc1234 |" in text
    assert "| validation | native | 2.500 | 1.700 | 0.700 | 0.100 | 97 / 100 | abc1234 |" in text
    assert "| validation | **strict/native** | 1.20 | - | - | - |" in text
    assert "RL step" not in render([_row("swiglu", "strict", "swiglu 8x8", "ratio_vs_native", 0.99)])
