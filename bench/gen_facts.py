"""The benchmarks' workload: `pagedkv-sql synth` with the benchmarks' settings (20% forks,
5% swapped and 1% missing blocks, seed 1), sized by sequences and mean length.

    python bench/gen_facts.py --seqs 20000 --len 512 [--out DIR]

--seqs 20000 --len 512 is the 10.2M-token workload of docs/benchmarks.md's round-three
table (bench/floor.py makes it itself when given the same two numbers).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def generate(out: Path, seqs: int, length: int) -> None:
    """Write the four .facts files into ``out`` (a new directory)."""
    subprocess.run(
        [sys.executable, "-m", "pagedkv_sql", "synth", str(out), "-s", str(seqs),
         "--mean-length", str(length), "--missing-fraction", "0.01", "--seed", "1"],
        check=True, capture_output=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", type=int, default=20_000)
    parser.add_argument("--len", type=int, default=512)
    parser.add_argument("--out", type=Path, default=Path("bench-facts"))
    args = parser.parse_args()
    generate(args.out, args.seqs, args.len)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
