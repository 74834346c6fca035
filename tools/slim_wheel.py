"""Repack the flashinfer-python wheel without the kernel sources that the paged decode and
prefill JIT builds never read, so that it travels to a GPU machine under the 64 MiB a run
carries (tools/gpu_wheels.py; the recipe of the project's first FlashInfer run on an H200,
with the prefill sources added).

Kept: the whole Python package (every module; `import flashinfer` imports ~330 of them),
dist-info (RECORD rewritten), and of flashinfer/data/ only
  - include/**                        (FlashInfer's headers; the attention kernels live here)
  - csrc/batch_decode*, csrc/single_decode*, csrc/batch_prefill*, csrc/*.h, csrc/*.cuh
                                      (the decode and prefill JIT sources and templates, the
                                      glue headers)
  - cccl/{cub/cub,libcudacxx/include,thrust/thrust}/**
                                      (vendored CCCL, put before the toolkit's with -I)
  - spdlog/include/**                 (small; an -isystem directory of every JIT build)
  - build_backend.py, build_utils.py
Dropped: the other csrc files (GEMM, MoE, MLA, comm... kernels), cutlass/ (only
CUTLASS-based kernels include it; the decode and FA2 prefill sources do not), cccl's tests,
docs, python and benchmarks. flashinfer-python 0.7.2.post1: 62 MB -> 21.6 MiB.

Usage: python tools/slim_wheel.py ORIGINAL.whl OUTDIR
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import sys
import zipfile
from pathlib import Path

DATA = "flashinfer/data/"
KEEP_DATA = (
    "flashinfer/data/include/*",
    "flashinfer/data/csrc/batch_decode*",
    "flashinfer/data/csrc/single_decode*",
    "flashinfer/data/csrc/batch_prefill*",
    "flashinfer/data/csrc/*.h",
    "flashinfer/data/csrc/*.cuh",
    "flashinfer/data/cccl/cub/cub/*",
    "flashinfer/data/cccl/libcudacxx/include/*",
    "flashinfer/data/cccl/thrust/thrust/*",
    "flashinfer/data/spdlog/include/*",
    "flashinfer/data/build_backend.py",
    "flashinfer/data/build_utils.py",
)


def keep(name: str) -> bool:
    if not name.startswith(DATA):
        return True
    if name.startswith("flashinfer/data/csrc/") and name.count("/") > 3:
        return False  # csrc's subfolders hold other kernels
    return any(fnmatch.fnmatch(name, pattern) for pattern in KEEP_DATA)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(src: Path, outdir: Path) -> Path:
    """The slimmed wheel, under its own name in ``outdir``."""
    out = outdir / src.name
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = dropped = 0
    with zipfile.ZipFile(src) as zin:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in zin.infolist():
                if info.is_dir() or info.filename == record:
                    continue
                if not keep(info.filename):
                    dropped += 1
                    continue
                data = zin.read(info)
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                lines.append(record_line(info.filename, data))
                kept += 1
            lines.append(f"{record},,")
            zout.writestr(record, "\n".join(lines) + "\n")
    print(f"{out}: kept {kept} files, dropped {dropped}; {out.stat().st_size / 2**20:.1f} MiB")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tools/slim_wheel.py ORIGINAL.whl OUTDIR")
    slim(Path(sys.argv[1]), Path(sys.argv[2]))
