"""Shared fixtures: qd.init once per test module, and a seeded numpy RNG.

``pytest --arch=cuda`` runs the suite on the GPU (``qd.init(arch=qd.cuda)``). On the CPU (the
default) every kernel a test compiles is also compiled for CUDA down to a cubin
(``cuda_compile_check``, no GPU needed) when numba-cuda is installed, so the CUDA code path —
our passes, types and lowering — runs on every commit; numerics come from the CPU run.
Every kernel is also compiled for AMDGPU (gfx942, down to a code object; no GPU:
docs/amdgpu.md) from the same lowering; ``--arch=amdgpu`` runs the suite on an AMD GPU, and tests
marked ``amdgpu`` run only there. The full IR verifier runs after every pass
(``QD_VERIFY_EACH_PASS=1``). The offline cache is off (``QD_OFFLINE_CACHE=0``: the suite never
writes to the user's cache directory).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("QD_VERIFY_EACH_PASS", "1")  # before qd_numba reads the environment
# no offline cache in the suite (tests count compiles, and the CUDA compile check runs at a
# compile); tests/test_offline_cache.py turns it on with a temporary directory
os.environ.setdefault("QD_OFFLINE_CACHE", "0")

import qd_numba as qd  # noqa: E402
from qd_numba.targets.cuda.compile import numba_cuda_importable  # noqa: E402

# through the environment, so that tests calling qd.init(debug=True) etc. keep the checks: the
# CUDA one, and the AMDGPU one (gfx942, down to a code object) from the same lowering
# (docs/amdgpu.md); QD_AMDGPU_COMPILE_CHECK=0 turns the second off
if numba_cuda_importable():
    os.environ.setdefault("QD_CUDA_COMPILE_CHECK", "1")
    os.environ.setdefault("QD_AMDGPU_COMPILE_CHECK", "1")


def pytest_addoption(parser):
    parser.addoption("--arch", default="cpu", choices=("cpu", "cuda", "amdgpu"),
                     help="qd_numba arch to run kernels on")


def _arch(config):
    return config.getoption("--arch")


def pytest_configure(config):
    if _arch(config) in ("cuda", "amdgpu"):  # tests that call qd.init(...) without an arch stay on the GPU
        os.environ["QD_ARCH"] = _arch(config)


def pytest_collection_modifyitems(config, items):
    if _arch(config) == "amdgpu":
        return
    skip = pytest.mark.skip(reason="needs an AMD GPU with ROCm and hip-python (run with --arch=amdgpu there)")
    for item in items:
        if item.get_closest_marker("amdgpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def qd_init(request):
    arch = _arch(request.config)
    qd.init(arch=qd.cuda if arch == "cuda" else qd.amdgpu if arch == "amdgpu" else qd.cpu)
    yield


@pytest.fixture
def arch(request):
    return _arch(request.config)


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _cuda_compile_check_opt_out(request):
    """``@pytest.mark.no_cuda_compile_check``: skip the CUDA compile of this test's kernels
    (fuzzers compiling hundreds of kernels; their CUDA path is covered by the other tests)."""
    if request.node.get_closest_marker("no_cuda_compile_check") is None:
        yield
        return
    from qd_numba import config

    saved = config.current.cuda_compile_check, config.current.amdgpu_compile_check
    # the AMDGPU check lowers through numba-cuda too: what CUDA cannot compile, it cannot either
    config.current.cuda_compile_check = config.current.amdgpu_compile_check = False
    try:
        yield
    finally:
        config.current.cuda_compile_check, config.current.amdgpu_compile_check = saved
