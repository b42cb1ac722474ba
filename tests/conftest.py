"""Shared fixtures: qd.init once per test module, and a seeded numpy RNG.

``pytest --arch=cuda`` runs the suite on the GPU (``qd.init(arch=qd.cuda)``). On the CPU (the
default) every kernel a test compiles is also compiled for CUDA down to a cubin
(``cuda_compile_check``, no GPU needed) when numba-cuda is installed, so the CUDA code path —
our passes, types and lowering — runs on every commit; numerics come from the CPU run.
The files of ``AMDGPU_COMPILE_CHECK_FILES`` also compile every kernel for AMDGPU (gfx942, no
GPU: docs/amdgpu.md); ``--arch=amdgpu`` runs the suite on an AMD GPU, and tests marked ``amdgpu``
run only there. The full IR verifier runs after every pass (``QD_VERIFY_EACH_PASS=1``). The offline cache is
off (``QD_OFFLINE_CACHE=0``: the suite never writes to the user's cache directory).
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

# through the environment, so that tests calling qd.init(debug=True) etc. keep the CUDA check
if numba_cuda_importable():
    os.environ.setdefault("QD_CUDA_COMPILE_CHECK", "1")


# the AMDGPU compile check (QD_AMDGPU_COMPILE_CHECK) of the whole suite would add minutes (an LLVM
# AMDGPU codegen per task, ~0.4 s per kernel on 2 loaded cores), so it runs on these files only:
# every kind of task (range-for, serial, reduction), loop shapes, atomics, math and debug-mode
# checks (docs/amdgpu.md). QD_AMDGPU_COMPILE_CHECK=1 turns it on for every file, =0 off.
AMDGPU_COMPILE_CHECK_FILES = {"test_loops.py", "test_reductions.py", "test_atomics.py", "test_assert.py",
                              "test_amdgpu_codegen.py"}


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
def _amdgpu_compile_check_subset(request):
    """The AMDGPU compile check on :data:`AMDGPU_COMPILE_CHECK_FILES` (unless QD_AMDGPU_COMPILE_CHECK
    says otherwise), with the CUDA one where that is on (one lowering for both)."""
    from qd_numba import config

    if os.environ.get("QD_AMDGPU_COMPILE_CHECK", "").strip() or request.path.name not in AMDGPU_COMPILE_CHECK_FILES \
            or _arch(request.config) != "cpu" or not numba_cuda_importable():
        yield
        return
    saved = config.current.amdgpu_compile_check
    config.current.amdgpu_compile_check = True
    try:
        yield
    finally:
        config.current.amdgpu_compile_check = saved


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
