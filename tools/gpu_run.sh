#!/usr/bin/env bash
# The one command a session with a GPU machine runs (docs/engines.md, "The GPU tier"): the
# GPU tier (tests/gpu: FlashInfer's decode and paged prefill kernels on the exported state)
# and bench/gpu.py (export of 1M and 10M tokens against FlashInfer's plan and decode run),
# everything written to $OUT (the device tool's folder; else /tmp/pagedkv-gpu).
#
# The machine reaches no package registry: the wheels travel. Here first:
#     make gpu-wheels            # FlashInfer (slimmed), apache-tvm-ffi, duckdb: .gpu-wheels/
# then, with the device tool: run(command="bash tools/gpu_run.sh", carry=[".gpu-wheels"],
# timeout_s=580). Its image has python3 3.12 with torch (CUDA), numpy, pyarrow and pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/pagedkv-gpu}
mkdir -p "$out"
site=/tmp/pagedkv-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .gpu-wheels/*.whl || { echo "cannot install .gpu-wheels/*.whl" >&2; exit 2; }
export PYTHONPATH="$PWD:$site" PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-16}
# FlashInfer's JIT links -lcuda; the toolkit's stub is enough for modules without driver calls
export LIBRARY_PATH="$CUDA_HOME/lib64/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import sys, torch, flashinfer, duckdb, pyarrow, numpy
print(sys.version.split()[0], "torch", torch.__version__, "flashinfer", flashinfer.__version__,
      "duckdb", duckdb.__version__, "pyarrow", pyarrow.__version__, "numpy", numpy.__version__)' \
    | tee -a "$out/gpu.txt"
rm -f "$out/gpu-figures.jsonl"
# the same command as `make test-gpu GPU_PYTHON=python3`, the tier required (no skipping)
PAGEDKV_GPU_TIER=1 PAGEDKV_GPU_FIGURES="$out/gpu-figures.jsonl" python3 -m pytest \
    -p no:cacheprovider -p no:xdist -p no:randomly --confcutdir=tests/gpu -m gpu tests/gpu \
    -v --durations=5 2>&1 | tee "$out/gpu-tier.log"
tier=${PIPESTATUS[0]}
python3 bench/gpu.py --sizes 1000000,10000000 --json "$out/bench-gpu.json" 2>&1 \
    | tee "$out/bench-gpu.log"
bench=${PIPESTATUS[0]}
echo "GPU tier exit $tier, bench/gpu.py exit $bench" | tee -a "$out/gpu.txt"
exit $((tier > bench ? tier : bench))
