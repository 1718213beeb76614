"""The compile check: every strict Triton kernel, in every launch plan its plan function can choose,
compiled for MI300X (gfx942) and H200 (sm_90) on a machine with neither, and a static resource report.

Why: the strict kernels are Triton so that they can run where the source system runs (AMD MI300X under
ROCm) as well as on the lent H200; no AMD GPU is reachable here, but Triton's wheel cross-compiles for
both without a GPU (`triton.compile(ASTSource(...), target=GPUTarget("hip", "gfx942", 64))` gives
ttir, ttgir, llir, amdgcn and the hsaco; `GPUTarget("cuda", 90, 32)` gives ptx and, through the bundled
ptxas, the cubin). What is compiled is what the plan functions choose for each target
(rlkit/bench/compile_plans.py); a request fails the check, naming kernel, plan and target, when
- it does not compile, or does not produce the target's binary (an AMDGPU or CUDA ELF);
- a plan function chose it and its shared memory / LDS exceeds what the target lets one program have
  (Triton would refuse to load it there: the 128 x 256 GEMM tile asks 96 KB of MI300X's 64 KB);
- a launchable kernel in kernels/ is compiled by no request, or a plan kind has no compile entry.

Resources come from the compiled artifacts: gfx942 from the amdgcn's kernel metadata (VGPRs, AGPRs,
SGPRs, VGPR/SGPR spill counts, scratch bytes, occupancy) and Triton's LDS request; sm_90 from the
cubin through the bundled `cuobjdump --dump-resource-usage` (registers, stack frame), ptxas's own -v
report of the compile (bytes of spill stores and loads) and Triton's shared memory.
Rows are long-format JSONL (kernel, plan, target, metric, value, triton, commit); the table in
BENCHMARKS.md between the compile-report markers only reads them.

    python -m rlkit.bench.compile_targets [--jobs 2] [--out lab/bench/compile-report.jsonl]
                                          [--markdown BENCHMARKS.md]

Exit status 1 with one line per failure when the check fails, 0 otherwise. The compile cache goes to
a fresh temporary directory unless TRITON_CACHE_DIR is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.bench.compile_plans import KernelCall, UnknownPlan, kernel_calls, uncovered_kernels
from rlkit.kernels._triton import GpuTraits


@dataclass(frozen=True)
class Target:
    name: str
    """"gfx942" / "sm_90"."""
    device: str
    """The GPU it stands for."""
    backend: str
    arch: object
    """GPUTarget's arch: "gfx942" (HIP) or 90 (CUDA)."""
    warp_size: int
    traits: GpuTraits
    """What the plan functions are told (compute units, shared memory a program may have)."""

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


TARGETS = (
    # MI300X: 304 CUs; 64 KB of LDS a workgroup
    Target("gfx942", "MI300X", "hip", "gfx942", 64, GpuTraits("hip", "gfx942", 304, 64 * 1024)),
    # H200: 132 SMs; 227 KB of shared memory a block (the opt-in maximum Triton checks against)
    Target("sm_90", "H200", "cuda", 90, 32, GpuTraits("cuda", "sm_90", 132, 227 * 1024)),
)

ELF_MACHINE = {"hip": 224, "cuda": 190}
"""ELF e_machine of each target's binary: EM_AMDGPU (hsaco), EM_CUDA (cubin)."""
BINARY = {"hip": "hsaco", "cuda": "cubin"}

REPORT = Path("lab/bench/compile-report.jsonl")
MARK_START, MARK_END = "<!-- compile-report:start -->", "<!-- compile-report:end -->"


@dataclass
class Result:
    """One request compiled for one target."""

    call: KernelCall
    target: Target
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def where(self) -> str:
        return f"{self.call.op}.{self.call.kernel} [{self.call.plan}] on {self.target.name} ({self.target.device})"


# -- compiling ----------------------------------------------------------------------------------------
def compile_call(call: KernelCall, target: Target):
    """Compile `call` for `target` as the JIT would compile the launch (the same specialization of its
    arguments, constexprs and options); returns Triton's CompiledKernel. The binder and `_pack_args` are
    the JIT's own (Triton 3.7's, pinned in requirements.txt; an upgrade that changes them fails loudly)."""
    import triton
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = call.fn
    backend = make_backend(target.gpu_target())
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*call.args, **call.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, call.kwargs, bound, specialization, options)
    source = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():  # a Gluon kernel (kernels/gemm_gluon.py) is lowered by Gluon
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(fn, signature, constexprs, attrs), target=target.gpu_target(),
                          options=options.__dict__)


def _elf_machine(binary: bytes) -> int | None:
    if len(binary) < 20 or binary[:4] != b"\x7fELF":
        return None
    return int.from_bytes(binary[18:20], "little")


_AMD_FIELDS = {"vgprs": "vgpr_count", "agprs": "agpr_count", "sgprs": "sgpr_count",
               "vgpr_spills": "vgpr_spill_count", "sgpr_spills": "sgpr_spill_count",
               "scratch_bytes": "private_segment_fixed_size", "static_lds_bytes": "group_segment_fixed_size"}


def amd_resources(compiled) -> dict[str, float]:
    """From the amdgcn's kernel metadata (the `amdhsa.kernels` entry) and Triton's LDS request."""
    text = compiled.asm["amdgcn"]
    out: dict[str, float] = {}
    for metric, key in _AMD_FIELDS.items():
        m = re.search(rf"^\s*-?\s*\.{key}:\s+(\d+)", text, re.M)
        if m is None:
            raise ValueError(f"amdgcn metadata has no .{key}")
        out[metric] = int(m.group(1))
    occ = re.search(r"^; Occupancy: (\d+)", text, re.M)
    if occ:
        out["occupancy_waves"] = int(occ.group(1))
    out["spills"] = out["vgpr_spills"] + out["sgpr_spills"]
    out["lds_bytes"] = compiled.metadata.shared + out["static_lds_bytes"]
    return out


def cuobjdump_path() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def nvidia_resources(compiled, ptxas_log: str = "") -> dict[str, float]:
    """From the cubin (bundled cuobjdump; no driver needed), ptxas's own report of the compile when it
    ran (`ptxas -v`: spill stores and loads), and Triton's shared-memory request."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([str(cuobjdump_path()), "--dump-resource-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if m is None:
        raise ValueError(f"cuobjdump printed no resource usage: {text.strip()[:200]}")
    reg, stack, static_shared, local = map(int, m.groups())
    # the driver reports stack + local as the function's local size, which Triton's loader divides by 4
    # and calls n_spills; ptxas says how much of it is spilled registers
    out = dict(registers=reg, n_spills=(stack + local) // 4, stack_bytes=stack, local_bytes=local,
               shared_bytes=compiled.metadata.shared, static_shared_bytes=static_shared)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas_log)
    if spill:
        out["spill_store_bytes"], out["spill_load_bytes"] = map(int, spill.groups())
    return out


def _compile_with_ptxas_log(call: KernelCall, target: Target):
    """`compile_call`, with ptxas's -v report captured (Triton prints it when asked; none on a cache hit)."""
    import contextlib
    import io

    import triton

    buf = io.StringIO()
    with triton.knobs.nvidia.scope():
        triton.knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(buf):
            compiled = compile_call(call, target)
    return compiled, buf.getvalue()


def _one_line(e: Exception) -> str:
    """The error in one line: Triton's CompilationError says where ("at 3:18:"), then the source, then
    what; ptxas and others say what first."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    what = lines[-1] if lines and re.match(r"at \d+:\d+:", lines[0]) else (lines[0] if lines else "")
    where = f" ({lines[0].rstrip(':')} of the kernel)" if lines and re.match(r"at \d+:\d+:", lines[0]) else ""
    return f"{type(e).__name__}{where}: {what[:300]}"


def check_one(call: KernelCall, target: Target) -> Result:
    """Compile, prove the binary is the target's, read the resources, check the launch limit."""
    res = Result(call, target)
    t0 = time.perf_counter()
    try:
        compiled, log = _compile_with_ptxas_log(call, target) if target.backend == "cuda" else (
            compile_call(call, target), "")
        binary = compiled.asm.get(BINARY[target.backend])
        machine = _elf_machine(binary or b"")
        if machine != ELF_MACHINE[target.backend]:
            raise ValueError(f"no {BINARY[target.backend]} for {target.name} (ELF machine {machine})")
        res.metrics = amd_resources(compiled) if target.backend == "hip" else nvidia_resources(compiled, log)
        res.metrics["binary_bytes"] = len(binary)
        shared = compiled.metadata.shared
        if call.chosen and shared > target.traits.max_shared_bytes:
            res.error = (f"asks {shared} bytes of shared memory/LDS, {target.device} gives a program "
                         f"{target.traits.max_shared_bytes}: Triton would refuse to load it")
    except Exception as e:  # noqa: BLE001 - the check reports every failure, one line each
        res.error = f"does not compile: {_one_line(e)}"
    res.seconds = time.perf_counter() - t0
    return res


_WORK: list[tuple[KernelCall, Target]] = []
"""The requests of the running check, inherited by forked workers (JIT functions do not pickle)."""


def _run_index(i: int) -> tuple[int, dict, str | None, float]:
    r = check_one(*_WORK[i])
    return i, r.metrics, r.error, r.seconds


def requests(targets=TARGETS, presets=None, ops=None) -> tuple[list[tuple[KernelCall, Target]], list[str]]:
    """What to compile for each target (the plan functions' choices), and the failures found before
    compiling: a plan kind with no compile entry, a launchable kernel no request compiles."""
    work: list[tuple[KernelCall, Target]] = []
    failures: list[str] = []
    for target in targets:
        try:
            calls = kernel_calls(target.traits, presets, ops)
        except UnknownPlan as e:
            failures.append(f"{target.name} ({target.device}): {e}")
            continue
        failures += [f"{k}: no plan compiles this launchable kernel for {target.name}; add its launch to "
                     f"rlkit/bench/compile_plans.py" for k in uncovered_kernels(calls, ops)]
        work += [(c, target) for c in calls]
    return work, failures


def compile_all(work: list[tuple[KernelCall, Target]], jobs: int = 1) -> list[Result]:
    """`check_one` for every request; `jobs` > 1 compiles in that many forked processes."""
    global _WORK
    if jobs <= 1 or len(work) <= 1:
        return [check_one(c, t) for c, t in work]
    import multiprocessing

    results = [Result(c, t) for c, t in work]
    _WORK = work
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for i, metrics, error, seconds in pool.map(_run_index, range(len(work))):
                results[i].metrics, results[i].error, results[i].seconds = metrics, error, seconds
    finally:
        _WORK = []
    return results


def run_check(targets=TARGETS, presets=None, ops=None, jobs: int = 1) -> tuple[list[Result], list[str]]:
    """Compile every request for every target; the results and the failures (one line each, naming
    kernel, plan and target)."""
    work, failures = requests(targets, presets, ops)
    results = compile_all(work, jobs)
    return results, failures + [f"{r.where}: {r.error}" for r in results if r.error]


# -- report -------------------------------------------------------------------------------------------
def rows(results: list[Result], commit: str) -> list[dict]:
    """Long-format rows: one per (kernel, plan, target, metric)."""
    import triton

    out = []
    for r in results:
        base = dict(op=r.call.op, kernel=r.call.kernel, plan=r.call.plan, target=r.target.name,
                    device=r.target.device, chosen=r.call.chosen, source=r.call.source,
                    triton=triton.__version__, commit=commit)
        for metric, value in [*r.metrics.items(), ("compile_seconds", round(r.seconds, 2))]:
            out.append(dict(base, metric=metric, value=value))
    return out


def write_rows(report_rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in report_rows))


def _kb(v) -> str:
    return "—" if v is None else f"{v / 1024:.0f}"


def render(report_rows: list[dict]) -> str:
    """The markdown block (markers included) from the rows."""
    if not report_rows:
        return f"{MARK_START}\n{MARK_END}\n"
    cells: dict[tuple, dict] = {}
    order: list[tuple] = []
    for r in report_rows:
        key = (r["op"], r["kernel"], r["plan"], r["chosen"])
        if key not in cells:
            cells[key] = {}
            order.append(key)
        cells[key].setdefault(r["target"], {})[r["metric"]] = r["value"]
        cells[key].setdefault("_source", {}).setdefault(r["target"], r["source"])
    head = report_rows[0]
    n_plans = {t: sum(1 for k in order if t in cells[k]) for t in ("gfx942", "sm_90")}
    lines = [
        MARK_START,
        "## Compiled for MI300X (gfx942) and H200 (sm_90): static resources, no GPU",
        "",
        f"Every strict Triton kernel in every launch plan its plan function chooses for the Qwen3 presets "
        f"(and the benchmark-only GEMM overrides, marked *override*), compiled on the CPU by "
        f"`python -m rlkit.bench.compile_targets` (CI: tests/kernels/test_compile_targets.py). Triton "
        f"{head['triton']}, commit {head['commit']}; {n_plans['gfx942']} plans for gfx942, "
        f"{n_plans['sm_90']} for sm_90. Rows: lab/bench/compile-report.jsonl. MI300X: VGPRs (+AGPRs) / "
        f"SGPRs, spills = VGPR + SGPR spill counts, LDS as Triton requests it. H200: registers, spills = "
        f"bytes of spill stores (ptxas -v), shared memory as Triton requests it. "
        f"\"—\": the target's plan functions do not choose this plan (so the table says which plan each "
        f"target gets). Compiled, never run on MI300X.",
        "",
        "| op | kernel | plan | chosen for (first shape) | MI300X VGPR+AGPR / SGPR | MI300X spills | MI300X LDS KB "
        "| H200 regs | H200 spill stores | H200 smem KB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in order:
        op, kernel, plan, chosen = key
        a, n = cells[key].get("gfx942"), cells[key].get("sm_90")

        def spill(d, k="spills", unit=""):
            if d is None:
                return "—"
            if k not in d:  # a cached compile: ptxas did not run, so it did not report
                return "?"
            return f"**{d[k]}{unit}**" if d[k] else "0"

        amd_regs = "—" if a is None else f"{a['vgprs']}+{a['agprs']} / {a['sgprs']}"
        plan_text = plan + ("" if chosen else " *override*")
        src = cells[key]["_source"]
        first = (next(iter(src.values())) if len(set(src.values())) == 1
                 else "; ".join(f"{t}: {v}" for t, v in src.items()))
        lines.append(f"| {op} | `{kernel}` | {plan_text} | {first} | {amd_regs} | {spill(a)} | "
                     f"{_kb(a and a['lds_bytes'])} | {'—' if n is None else n['registers']} | "
                     f"{spill(n, 'spill_store_bytes', ' B')} | "
                     f"{_kb(n and n['shared_bytes'])} |")
    lines += [MARK_END, ""]
    return "\n".join(lines)


def splice(text: str, block: str) -> str:
    """`text` with the compile-report block replaced by `block` (appended when it has none)."""
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        tail = rest.split(MARK_END, 1)[1].lstrip("\n")
        return head + block + tail
    return text.rstrip("\n") + "\n\n" + block


def keep_compile_report(old_text: str, new_text: str) -> str:
    """A re-rendered BENCHMARKS.md (`rlkit.bench.kernels`) keeps the compile-report block of the old one."""
    if MARK_START in old_text and MARK_END in old_text and MARK_START not in new_text:
        block = MARK_START + old_text.split(MARK_START, 1)[1].split(MARK_END, 1)[0] + MARK_END + "\n"
        return splice(new_text, block)
    return new_text


# -- command line -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlkit.bench.compile_targets", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    ap.add_argument("--out", default=None, help=f"write the report rows (JSONL), e.g. {REPORT}")
    ap.add_argument("--markdown", default=None, help="splice the table into this markdown file (BENCHMARKS.md)")
    ap.add_argument("--preset", action="append", default=None, help="only this Qwen3 preset (repeatable)")
    ap.add_argument("--op", action="append", default=None, help="only this op's kernels (repeatable)")
    ap.add_argument("--from-rows", default=None, help="compile nothing: render --markdown from these rows (JSONL)")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        print("error: --jobs must be at least 1", file=sys.stderr)
        return 2
    from rlkit.bench.provenance import commit

    if a.from_rows:
        report_rows = [json.loads(ln) for ln in Path(a.from_rows).read_text().splitlines() if ln.strip()]
        if a.markdown:
            path = Path(a.markdown)
            path.write_text(splice(path.read_text() if path.exists() else "", render(report_rows)))
        return 0
    own_cache = None
    if not os.environ.get("TRITON_CACHE_DIR"):
        own_cache = tempfile.TemporaryDirectory(prefix="rlkit-compile-")
        os.environ["TRITON_CACHE_DIR"] = own_cache.name
    try:
        t0 = time.perf_counter()
        results, failures = run_check(presets=a.preset, ops=a.op, jobs=a.jobs)
        elapsed = time.perf_counter() - t0
    finally:
        if own_cache is not None:
            os.environ.pop("TRITON_CACHE_DIR", None)
            own_cache.cleanup()
    for t in TARGETS:
        mine = [r for r in results if r.target is t]
        print(f"{t.name} ({t.device}): {len(mine)} plans, {sum(1 for r in mine if r.error)} failed")
    print(f"{len(results)} compiles in {elapsed:.1f} s with {a.jobs} job(s)")
    report_rows = rows([r for r in results if not r.error], commit())
    if a.out:
        write_rows(report_rows, Path(a.out))
    if a.markdown:
        path = Path(a.markdown)
        path.write_text(splice(path.read_text() if path.exists() else "", render(report_rows)))
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
