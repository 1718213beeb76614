"""What a device call carries for the multi-GPU lab scripts: Ray (slimmed), its missing dependencies,
megatron-core, and the data the presets and the tokenizer read. Built here, installed there.

Why: the H200 image (Python 3.12, torch 2.11) has no Ray, no megatron-core and no registry, and a call
carries at most 64 MiB with the working tree. Ray 2.60.0's cp312 wheel is 75.6 MiB; without what rlkit's
RayRunner never imports (ray/jars: Java workers; ray/rllib, data, serve, train, tune, llm: libraries on
top of Ray core) its files are 147 MiB, about 24 MiB as an xz tar (lab/LOG.md, 2026-12-01 session 3).
Ray's own needs the image lacks are jsonschema and what it pulls (jsonschema-specifications,
referencing, rpds-py); the rest (click, filelock, msgpack, packaging, protobuf, pyyaml, requests,
attrs) is in the image, and `install` prints their versions.

`--with dashboard` adds what `rlkit dashboard` needs there (Panel, Bokeh, Plotly, tornado and their
needs the image lacks; lab/live_dashboard_h200.py), as a second xz tar without what a server answering
the HTTP API never sends: Panel's bundled JS libraries (26 MB of its 30 MB wheel), Plotly's JupyterLab
extension and sample data. A browser pointed at that server gets no page; the API works.

Here (repository root; a few minutes of one core, xz dominates; everything lands in the git-ignored
.thirdparty/):
    .venv/bin/python lab/device_carry.py build [--with dashboard]   # -> .thirdparty/device/ (carry it)
There (the first thing of the device command; stdlib and pip only):
    python3 lab/device_carry.py install /tmp/site && export PYTHONPATH=/tmp/site RLKIT_DATA=.thirdparty/device/data

`build` downloads the pinned wheels into .thirdparty/cache/ (kept, not carried), writes
.thirdparty/device/{ray-2.60.0-slim.tar.xz, wheels/, data/} and prints the size of what one call would
send: the tracked files plus that folder (untracked files of the checkout travel too: keep them few).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

RAY = "ray==2.60.0"
WHEELS = ("jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0",
          "rpds-py==2026.9.1", "megatron-core==0.16.1")
"""Carried as wheels (pip installs them there): Ray's missing needs and megatron-core."""
DROPPED = ("ray/jars/", "ray/rllib/", "ray/data/", "ray/serve/", "ray/train/", "ray/tune/", "ray/llm/")
"""Never imported by ray.init, actors, placement groups or rlkit's RayRunner (lab/LOG.md)."""
DASHBOARD = {  # wheel -> what is dropped from it (the pins are constraints.txt's)
    "panel==1.9.4": ("panel/dist/bundled/", "panel/tests/"),
    "panel-material-ui==0.16.6": (),
    "nh3==0.3.8": (),
    "bokeh==3.9.2": ("bokeh/sampledata/",),
    "param==2.4.2": (),
    "pyviz-comms==3.0.6": (),
    "xyzservices==2026.9.1": (),
    "linkify-it-py==2.2.0": (),
    "mdit-py-plugins==0.7.0": (),
    "plotly==7.1.0": ("plotly/labextension/", "plotly/package_data/datasets/"),
    "tornado==6.6.1": (),
}
"""`--with dashboard`: the packages `rlkit dashboard` imports that the image lacks (its list: README's
KINDS.md; it has jinja2, pandas, numpy, pillow, contourpy, pyyaml, markdown, markdown-it-py, narwhals,
requests, tqdm, typing-extensions)."""
DATA = ("qwen3-configs", "qwen3-tokenizer")
"""What the model presets and the tokenizer read from RLKIT_DATA."""
IMAGE_NEEDS = {"click": None, "filelock": None, "msgpack": "1", "packaging": "24.2", "protobuf": "3.20.3",
               "pyyaml": None, "requests": None, "attrs": "22.2"}
"""Ray's other needs, expected in the device image: name -> lowest version (None: any)."""
LIMIT = 64 * 2**20
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64")


def _download(spec: str, cache: Path) -> Path:
    name = spec.split("==")[0].replace("-", "_").lower()
    version = spec.split("==")[1]
    have = [p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}-")]
    if not have:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", str(cache), spec]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        subprocess.run(cmd, check=True)
        have = [p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}-")]
    if len(have) != 1:
        raise SystemExit(f"expected one wheel for {spec} in {cache}, found {[p.name for p in have]}")
    return have[0]


def _slim(wheels: dict[Path, tuple[str, ...]], out: Path, preset: int) -> tuple[int, int]:
    """Each wheel's files minus its dropped prefixes (and its .data/ scripts), as one xz tar of
    site-packages content with the wheels' file modes (raylet, gcs_server are executables). Returns
    (files, unpacked bytes)."""
    files = size = 0
    with tarfile.open(out, "w:xz", preset=preset) as tar:
        for wheel, dropped in wheels.items():
            with zipfile.ZipFile(wheel) as z:
                for info in z.infolist():
                    if info.is_dir() or info.filename.startswith(dropped) or ".data/" in info.filename:
                        continue
                    ti = tarfile.TarInfo(info.filename)
                    ti.size = info.file_size
                    ti.mode = (info.external_attr >> 16) & 0o777 or 0o644
                    with z.open(info) as f:
                        tar.addfile(ti, f)
                    files, size = files + 1, size + info.file_size
    return files, size


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def build(args) -> int:
    out, cache = Path(args.out), Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    for spec in WHEELS:
        shutil.copy2(_download(spec, cache), out / "wheels")
    ray_wheel = _download(RAY, cache)
    tar = out / f"{RAY.replace('==', '-')}-slim.tar.xz"
    files, size = _slim({ray_wheel: DROPPED}, tar, args.xz_preset)
    print(f"{tar}: {files} files, {size / 2**20:.1f} MiB unpacked, {tar.stat().st_size / 2**20:.1f} MiB "
          f"(wheel {ray_wheel.stat().st_size / 2**20:.1f} MiB)")
    if "dashboard" in args.with_:
        tar = out / "dashboard-slim.tar.xz"
        files, size = _slim({_download(spec, cache): dropped for spec, dropped in DASHBOARD.items()}, tar,
                            args.xz_preset)
        print(f"{tar}: {files} files, {size / 2**20:.1f} MiB unpacked, {tar.stat().st_size / 2**20:.1f} MiB")
    for name in DATA:
        shutil.copytree(Path(args.data) / name, out / "data" / name)
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
    tree = sum(Path(p.decode()).stat().st_size for p in tracked if p and Path(p.decode()).is_file())
    carried = _tree_bytes(out)
    total = tree + carried
    print(f"one call sends: tracked files {tree / 2**20:.1f} MiB + {out} {carried / 2**20:.1f} MiB = "
          f"{total / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB" + ("" if total <= LIMIT else "  TOO LARGE"))
    return 0 if total <= LIMIT else 1


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("."):
        digits = "".join(c for c in p if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def install(args) -> int:
    src, target = Path(args.carry), Path(args.target)
    target.mkdir(parents=True, exist_ok=True)
    wheels = sorted(str(p) for p in (src / "wheels").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(target), *wheels], check=True)
    tars = sorted(src.glob("*-slim.tar.xz"))
    for tar_path in tars:
        with tarfile.open(tar_path) as tar:
            if hasattr(tarfile, "tar_filter"):
                tar.extractall(target, filter="tar")  # keeps the executables' x bits
            else:
                tar.extractall(target)
    problems = []
    for name, lowest in IMAGE_NEEDS.items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name} missing")
            continue
        if lowest and _version_tuple(have) < _version_tuple(lowest):
            problems.append(f"{name} {have} < {lowest}")
        print(f"image: {name} {have}")
    print(f"installed into {target}: {len(wheels)} wheels and {', '.join(t.name for t in tars)}" +
          (f"; PROBLEMS: {'; '.join(problems)}" if problems else ""))
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="here: download, slim and pack into --out")
    b.add_argument("--out", default=".thirdparty/device")
    b.add_argument("--cache", default=".thirdparty/cache", help="downloaded wheels (kept, not carried)")
    b.add_argument("--data", default="../shared/data", help="the data folder (RLKIT_DATA) to copy from")
    b.add_argument("--xz-preset", type=int, default=9, choices=range(10))
    b.add_argument("--with", dest="with_", action="append", default=[], choices=["dashboard"],
                   help="also pack what `rlkit dashboard` needs there (lab/live_dashboard_h200.py)")
    i = sub.add_parser("install", help="there: pip-install the wheels and unpack Ray into TARGET")
    i.add_argument("target")
    i.add_argument("--carry", default=".thirdparty/device")
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else install(args)


if __name__ == "__main__":
    sys.exit(main())
