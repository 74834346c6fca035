"""Fetch the wheels tools/gpu_run.sh installs on a GPU machine that reaches no package
registry (`make gpu-wheels`): flashinfer-python (slimmed by tools/slim_wheel.py: the whole
wheel is over the 64 MiB a run carries), its apache-tvm-ffi, and duckdb, as cp312 manylinux
x86-64 wheels, one version of each, into DIR (an ignored folder: .gpu-wheels). The rest
the GPU tier needs (torch, numpy, pyarrow, pytest) is in the machine's image
(/work/.library/device/KINDS.md's list: pyarrow's wheel alone, 52 MiB, would not fit).

Usage: python tools/gpu_wheels.py DIR
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from slim_wheel import slim

FLASHINFER = "flashinfer-python==0.7.2.post1"
WHEELS = ("apache-tvm-ffi==0.1.15.post2", "duckdb==2.0.1")  # FlashInfer's and ours
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
for _tag in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_24", "manylinux_2_17"):
    PLATFORM += ["--platform", f"{_tag}_x86_64"]
CARRY_LIMIT = 64 << 20  # what one run carries: the working tree and these wheels together


def download(what: list[str], into: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into)]
    subprocess.run([*command, *PLATFORM, *what], check=True)


def tree_bytes(root: Path) -> int:
    """The bytes of the files git tracks: the working tree that travels with the wheels."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True
    ).stdout.split(b"\0")
    return sum(
        (root / n.decode()).stat().st_size for n in listed if n and (root / n.decode()).is_file()
    )


def main(target: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fetched = Path(tmp)
        download([FLASHINFER, *WHEELS], fetched)
        if target.exists():
            shutil.rmtree(target)  # one version of each: two would stop the install
        target.mkdir(parents=True)
        for wheel in sorted(fetched.glob("*.whl")):
            if wheel.name.startswith("flashinfer_python-"):
                slim(wheel, target)
            else:
                shutil.copy2(wheel, target / wheel.name)
    wheels = sum(p.stat().st_size for p in target.glob("*.whl"))
    tree = tree_bytes(Path(__file__).resolve().parent.parent)
    print(f"{target}: {wheels / 2**20:.1f} MiB of wheels + {tree / 2**20:.1f} MiB of tree")
    if wheels + tree > CARRY_LIMIT:
        sys.exit(f"over the {CARRY_LIMIT >> 20} MiB a run carries: slim more")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/gpu_wheels.py DIR")
    main(Path(sys.argv[1]))
