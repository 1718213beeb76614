"""lab/cublas_probe_h200.py --dry: the cuBLAS-route probe of issue 16 runs its own code on the CPU before
device time is spent on it. Each setting runs in its own process (as on the GPU, where the workspace
variables must precede CUDA's start); the rows say, for every shape and M, how many elements differ
between a batch and the rows of a larger one, between column shards and the whole, and between cuBLAS and
the strict kernel, and how long each took. Only the rows' presence is asserted: the CPU's own GEMM
invariances differ between the CPUs CI runs on (../shared/ENVIRONMENT.md), and the probe measures."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "lab" / "cublas_probe_h200.py"


def _probe(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--dry", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_the_dry_run_writes_every_check_of_every_shape_and_m_for_each_setting(tmp_path):
    done = _probe(tmp_path, "--settings", "default,no_workspace")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "cublas_probe.jsonl").read_text().splitlines()]
    assert (tmp_path / "cublas_probe.csv").read_text().startswith("op,impl,shape,metric,median,device,commit")
    seen = {(r["impl"], r["shape"].split(" M=")[0], int(r["shape"].split(" M=")[1].split()[0]), r["metric"])
            for r in rows}
    for setting in ("default", "no_workspace"):
        for m in (1, 8, 40, 130):
            for metric in ("rows_differing", "strict_differing", "tp2_differing", "tp4_differing", "ms"):
                assert (f"cublas@{setting}", "tiny.a", m, metric) in seen, (setting, m, metric)
            for metric in ("rows_differing", "strict_differing", "ms"):  # the row-parallel layer's routes
                assert (f"cublas@{setting}", "tiny.o", m, metric) in seen, (setting, m, metric)
                assert (f"chunked@{setting}", "tiny.o", m, metric) in seen, (setting, m, metric)
                assert (f"chained@{setting}", "tiny.o", m, metric) in seen, (setting, m, metric)
            assert (f"strict@{setting}", "tiny.a", m, "ms") in seen
    assert not any(r["metric"].startswith("tp") for r in rows if r["shape"].startswith("tiny.o")), \
        "a row-parallel layer has no column shards"
    assert all(r["median"] >= 0 for r in rows)
    table = done.stdout[done.stdout.index("| setting |"):]
    assert "| default | cublas | " in table and "| no_workspace | chunked | " in table, table


def test_an_unknown_setting_is_one_line_and_status_2(tmp_path):
    done = _probe(tmp_path, "--settings", "default,fast")
    assert done.returncode == 2 and "unknown setting(s) ['fast']" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "cublas_probe.jsonl").exists()
