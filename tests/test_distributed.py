"""examples/distributed_jacobi.py under torchrun: 2 ranks on the gloo backend (CPU), halos
exchanged through DLPack views of qd.ndarrays; rank 0 checks the gathered grid against the
single-process run, bit for bit (the example exits non-zero otherwise). The NCCL run needs two
GPUs (docs/multi_gpu.md gives the command)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "distributed_jacobi.py")


@pytest.fixture
def torchrun():
    pytest.importorskip("torch")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def test_two_gloo_ranks_equal_the_single_process_run(torchrun):
    env = dict(os.environ, QD_ARCH="cpu", OMP_NUM_THREADS="1")
    # 97 rows: slabs of 49 and 48 rows
    cmd = torchrun + ["--nproc-per-node", "2", EXAMPLE, "--ny", "97", "--nx", "53", "--steps", "40"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=480, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "2 ranks (gloo), 97x53, 40 steps: equal to the single-process run: True" in out.stdout, out.stdout[-2000:]
    assert "OK" in out.stdout
