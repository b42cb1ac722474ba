#!/usr/bin/env bash
# Session 5 on the GPU machine, one call (from the repository root): the test suite, then the
# benchmarks named as arguments. Carry .whl (numpy 2.4) and .whlq (Quadrants 1.4.0 and the
# dependencies the image lacks); .before (the tree at the session's start) for before_after.py.
#   bash bench/gpu_session5.sh [suite] [sbs] [compile] [before_after] [reduce] [cache] [streampar] [graph]
#   QD_TESTS="-m cuda tests/test_x.py" bash bench/gpu_session5.sh tests   (a chosen subset)
set -uo pipefail
OUT=${OUT:-/tmp/qd_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl $(ls .whlq/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import sys, numpy, numba, numba.cuda; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__)"
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    suite)
      python3 -m pytest -q -p no:cacheprovider -n 8 -m cuda tests > "$OUT/gpu_marked.log" 2>&1; tail -6 "$OUT/gpu_marked.log"
      python3 -m pytest -q -p no:cacheprovider -n 8 --arch=cuda -m "not cuda and not slow" tests > "$OUT/gpu_suite.log" 2>&1
      grep -E "^(FAILED|ERROR)" "$OUT/gpu_suite.log" | head -30; tail -2 "$OUT/gpu_suite.log" ;;
    sbs) timeout 300 python3 bench/side_by_side.py --arch cuda --impls ${QD_IMPLS:-qd_numba,quadrants} --out "$OUT/side_by_side_cuda.json" 2>&1 | tail -3 ;;
    compile) timeout 240 python3 bench/compile_time.py --arch cuda --max-k 64 --out "$OUT" 2>&1 | tail -12 ;;
    before_after) timeout 300 python3 bench/before_after.py ${QD_BEFORE:-.before} . --arch cuda --rounds 2 2>&1 | tail -14 ;;
    cpu_before_after) timeout 400 python3 bench/before_after.py ${QD_BEFORE:-.before} . --arch cpu --rounds 3 2>&1 | tail -14 ;;
    reduce) timeout 120 python3 bench/reduce.py --arch cuda 2>&1 | tail -12 ;;
    debug) python3 .devscratch/plans_debug.py 2>&1 | tail -8 ;;
    profile) bash .devscratch/warm_profile.sh 2>&1 | tail -70 ;;
    marked) python3 -m pytest -q -p no:cacheprovider -n 8 -m cuda tests 2>&1 | tail -8 ;;
    stages) bash .devscratch/stages.sh 2>&1 | tail -20 ;;
    probe) bash .devscratch/launch_probe.sh 2>&1 | tail -60 ;;
    warmcompile) bash .devscratch/warm_compile.sh 2>&1 | tail -20 ;;
    adbench) timeout 200 python3 bench/ad_bench.py --arch cuda --json "$OUT/ad_bench_cuda.json" 2>&1 | tail -20 ;;
    streampar) timeout 240 python3 bench/stream_parallel_bench.py --out "$OUT/stream_parallel_cuda.json" 2>&1 | tail -16 ;;
    graph) timeout 240 python3 bench/graph_bench.py --out "$OUT/graph_cuda.json" 2>&1 | tail -16 ;;
    programs) timeout 90 python3 bench/sparse_bench.py --arch cuda --out "$OUT/sparse_cuda.json" 2>&1 | tail -12
              timeout 120 python3 bench/mpm88_bench.py --arch cuda --out "$OUT/mpm88_cuda.json" 2>&1 | tail -8
              timeout 60 python3 bench/sparse_memory.py --arch cuda --out "$OUT/sparse_memory_cuda.json" 2>&1 | tail -8 ;;
    tests) python3 -m pytest -q -p no:cacheprovider -n 8 ${QD_TESTS:-} 2>&1 | tail -12 ;;
    cache) timeout 200 python3 bench/offline_cache_bench.py cuda 2>&1 | tail -12; cp bench/results/offline_cache_cuda.md "$OUT/" ;;
  esac
done
