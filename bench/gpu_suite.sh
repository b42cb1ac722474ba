#!/usr/bin/env bash
# The test suite on the GPU machine (the `device` tool), from the repository root.
# Carry .whl/ holding a numpy 2.4 wheel (numba-cuda 0.30.4 fails with the image's numpy 2.5):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .whl "numpy==2.4.*"
# Usage: bash bench/gpu_suite.sh [extra pytest arguments for the --arch=cuda run]
set -uo pipefail
OUT=${OUT:-/tmp/qd_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import sys, numpy, numba, numba.cuda, pytest; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba.cuda.__version__ if hasattr(numba.cuda, '__version__') else '?')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# QD_XDIST=N spreads the runs over N worker processes (pytest-xdist is in the device image)
XDIST=${QD_XDIST:+-n $QD_XDIST}
python3 -m pytest -q -p no:cacheprovider $XDIST -m cuda tests 2>&1 | tee "$OUT/gpu_marked.log" | tail -15
python3 -m pytest -q -p no:cacheprovider $XDIST --arch=cuda -m "not cuda and not slow" tests "$@" 2>&1 | tee "$OUT/gpu_suite.log" | tail -25
