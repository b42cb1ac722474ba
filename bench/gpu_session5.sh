#!/usr/bin/env bash
# Session 5 benchmarks on the GPU machine, one call (from the repository root; carry .whl and .whlq
# (Quadrants 1.4.0 and its missing dependencies) and .before (the tree at the session's start)).
set -uo pipefail
OUT=${OUT:-/tmp/qd_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlq/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 bench/side_by_side.py --arch cuda --out "$OUT/side_by_side_cuda.json" 2>&1 | tail -3
for b in "$@"; do echo "== $b"; timeout 300 python3 $b 2>&1 | tail -25; done
