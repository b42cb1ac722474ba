#!/usr/bin/env bash
# Issue 18 on the GPU machine (the `device` tool), from the repository root: the `cuda` tests of
# device choice and DLPack, the distributed example, and (with 2+ GPUs) bench/multi_gpu.py.
# Carry .whl/ holding a numpy 2.4 wheel, as for bench/gpu_suite.sh.
# Usage: bash bench/gpu_multi.sh        (results in $OUT: logs, multi_gpu.json with 2+ GPUs)
set -uo pipefail
OUT=${OUT:-/tmp/qd_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
N=$(python3 -c "import torch; print(torch.cuda.device_count())")
python3 -c "import torch, numba; print('torch', torch.__version__, 'numba', numba.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "GPUs: $N"
python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_multi_gpu.py tests/test_cuda_runtime.py 2>&1 \
    | tee "$OUT/multi_gpu_cuda_marked.log" | tail -15
python3 -m pytest -q -p no:cacheprovider --arch=cuda -m "not cuda" tests/test_multi_gpu.py tests/test_interop.py \
    tests/test_distributed.py "tests/test_docs.py::test_page_examples_run[docs/multi_gpu.md]" 2>&1 \
    | tee "$OUT/multi_gpu_arch_cuda.log" | tail -15
QD_ARCH=cuda python3 examples/distributed_jacobi.py --f32 2>&1 | tail -3
if [ "$N" -ge 2 ]; then
    QD_ARCH=cuda torchrun --standalone --nproc-per-node "$N" examples/distributed_jacobi.py --ny 1001 --nx 777 \
        --steps 200 2>&1 | tail -3
    python3 bench/multi_gpu.py --gpus "$N" --out "$OUT/multi_gpu.json" 2>&1 | tee "$OUT/multi_gpu_bench.log"
else
    # one GPU: the bench's NCCL path with one rank (no exchange), smaller grid
    python3 bench/multi_gpu.py --gpus 1 --rows 8192 --cols 8192 --steps 20 --repeats 3 2>&1 | tail -5
fi
