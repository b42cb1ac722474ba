#!/usr/bin/env bash
# The compile-time goals (issue 12, docs/compile_time.md) and the GPU-only tests, in one run on
# the GPU machine (the `device` tool), from the repository root, writing to $OUT.
# Carry .whl/ with a numpy 2.4 wheel and, for the side-by-side run, quadrants 1.4.0 and the
# wheels it needs that the image lacks (dill, pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions, cffi, pycparser).
# Usage: bash bench/gpu_goals.sh   (each step bounded by its own timeout; ~7 minutes)
set -uo pipefail
OUT=${OUT:-/tmp/qd_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -c "import sys, numpy, numba, numba_cuda; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__)"; } | tee "$OUT/device.txt"
timeout 170 python3 bench/first_call.py --processes 3 --kernels 8 --warm-processes 10 --out "$OUT/first_call.json" 2>&1 | tee "$OUT/first_call.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 -m cuda tests 2>&1 | tail -15 | tee "$OUT/gpu_marked.txt"
timeout 150 python3 bench/side_by_side.py --arch cuda --impls qd_numba,quadrants --out "$OUT/side_by_side.json" 2>&1 | tail -12 | tee "$OUT/side_by_side.txt"
# compile_time.py (K = 1 ... 128, ~3 minutes) only when asked: COMPILE_TIME_S=300 bash bench/gpu_goals.sh
if [ "${COMPILE_TIME_S:-0}" -gt 0 ]; then
  timeout "$COMPILE_TIME_S" python3 bench/compile_time.py --arch cuda --max-k 128 --out "$OUT" 2>&1 | tail -5
fi
