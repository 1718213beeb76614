"""`rlkit`'s argument errors, through the public entry point (`python -m rlkit`): exit code 2, one line on
stderr naming the problem, no traceback, and nothing written where the run would have gone.

(The run- and report-specific errors on existing/missing run folders are in tests/runners/test_loop.py,
the parity ones on sampling, ops and devices in tests/test_parity.py.)"""

import subprocess
import sys

import pytest


def rlkit(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlkit", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.mark.parametrize("args, needle", [
    (["parity", "--preset", "qwen3-70b"], "argument --preset: invalid choice: 'qwen3-70b'"),
    (["run", "--run-dir", "R", "--preset", "tiny_cpu"], "argument --preset: invalid choice: 'tiny_cpu'"),
    (["parity", "--dtype", "fp16"], "argument --dtype: invalid choice: 'fp16'"),
    (["run", "--run-dir", "R", "--dtype", "bfloat16"], "argument --dtype: invalid choice: 'bfloat16'"),
    (["run", "--run-dir", "R", "--task", "mmlu"], "argument --task: invalid choice: 'mmlu'"),
    (["run", "--run-dir", "R", "--temperature", "hot"], "expected a number, got 'hot'"),
    (["run", "--run-dir", "R", "--seed", "-1"], "expected an integer >= 0, got -1"),
    (["parity", "--max-tokens", "many"], "expected an integer, got 'many'"),
    (["train"], "argument command: invalid choice: 'train'"),
    ([], "the following arguments are required: command"),
    (["report"], "the following arguments are required: run_dir"),
    (["bench", "kernels", "--gemm-layers", "o,mlp"], "--gemm-layers: unknown projection(s) mlp"),
    (["bench", "kernels", "--gemm-m", "1,x"], "--gemm-m: expected positive integers"),
])
def test_argument_errors_are_one_line_exit_2(args, needle, tmp_path):
    res = rlkit(*args, cwd=tmp_path)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("rlkit"), res.stderr
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == [], "a refused command left files behind"


def test_a_config_the_run_refuses_is_one_line_and_leaves_no_run_dir(tmp_path):
    """Arguments that parse but make an invalid RunConfig are refused before the run folder exists."""
    res = rlkit("run", "--run-dir", str(tmp_path / "r"), "--temperature", "-1", "--no-progress")
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlkit run: error:") and "temperature" in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "r").exists()


def test_help_still_prints_usage():
    res = rlkit("run", "--help")
    assert res.returncode == 0 and "--preset" in res.stdout and "--run-dir" in res.stdout
