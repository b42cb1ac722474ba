"""Parallel CUDA device code generation (targets/cuda/compile.py, ``DeviceCodegen``): NVVM and
nvJitLink of each task on a thread pool give the cubins of the serial path, byte for byte; errors
come in program order; ``compile_threads`` / ``QD_COMPILE_THREADS`` select the pool. No GPU needed.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba import config, profiler
from qd_numba.targets.cuda.compile import numba_cuda_importable

pytestmark = pytest.mark.skipif(not numba_cuda_importable(), reason="needs numba-cuda")

N = 257
src = qd.field(qd.f32, shape=(N,))
dst = qd.field(qd.f32, shape=(N,))
acc = qd.field(qd.f32, shape=())


@qd.kernel
def several_tasks(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32) -> qd.f32:
    for i in range(N):                   # range-for
        dst[i] = src[i] * s + 1.0
    m = dst[3] * 2.0                     # serial code between loops (a temporary crosses tasks)
    for i in a:                          # struct-for over an ndarray argument
        a[i] = a[i] * m
    acc[None] = 0.0
    for i, j in qd.ndrange(N, 2):        # two dimensions, an atomic accumulation
        acc[None] += dst[i] * (j + 1)
    return acc[None] + m


def _compile(threads):
    from qd_numba.targets.cuda.plan import compile_check

    qd.init(arch=qd.cpu, compile_threads=threads)
    try:
        return compile_check(several_tasks, {"a": types.float32[::1], "s": types.float32}, {})
    finally:
        qd.init(arch=qd.cpu)


def test_parallel_codegen_gives_the_serial_cubins():
    serial = _compile(1)
    parallel = _compile(3)
    assert len(serial) == len(parallel) >= 4
    for (unit_s, _, s), (unit_p, _, p) in zip(serial, parallel):
        assert unit_s.task.name == unit_p.task.name
        assert s.entry_name == p.entry_name
        assert s.ptx == p.ptx
        assert s.cubin == p.cubin
        assert s.param_layout == p.param_layout
        assert s.nregs == p.nregs and s.kparams == p.kparams


def test_parallel_codegen_records_its_stages():
    profiler.clear_compile_info()
    _compile(2)
    (record,) = profiler.query_compile_info(several_tasks.qualname, "cuda (compile check)").records
    # the compiling thread's waits, split by what the pool spent in each library
    assert record.stages["NVVM"] > 0 and record.stages["nvJitLink"] > 0
    assert record.threads["NVVM"] > 0 and record.threads["nvJitLink"] > 0
    assert sum(record.stages.values()) == pytest.approx(record.seconds, rel=0.01, abs=0.002)


def test_kernel_compiled_with_a_pool_runs(rng):
    qd.init(arch=qd.cpu, compile_threads=2)   # the suite's CUDA compile check runs on the pool
    try:
        x = rng.uniform(-1, 1, N).astype(np.float32)
        a = rng.uniform(-1, 1, 33).astype(np.float32)
        src.from_numpy(x)
        a_ref = a.copy()
        got = several_tasks(a, 1.5)
        d = x * np.float32(1.5) + np.float32(1.0)
        m = np.float32(d[3] * 2.0)
        np.testing.assert_allclose(dst.to_numpy(), d, rtol=1e-6)
        np.testing.assert_allclose(a, a_ref * m, rtol=1e-6)
        assert got == pytest.approx(float(d.astype(np.float64).sum() * 3 + m), rel=1e-4)
    finally:
        qd.init(arch=qd.cpu)


class _Task:
    """Stands in for a LoweredTask whose NVVM/nvJitLink step fails (or not)."""

    def __init__(self, error=None):
        self.error, self.seconds = error, {"NVVM": 0.001, "nvJitLink": 0.001}

    def finish(self):
        if self.error is not None:
            raise self.error
        return "cubin"


@pytest.mark.parametrize("threads", [1, 2])
def test_an_earlier_tasks_codegen_error_comes_first(threads):
    from qd_numba.targets.cuda.compile import DeviceCodegen

    # 1 thread raises at submit, before the next task lowers; a pool when the later one fails
    first = RuntimeError("NVVM rejected task 1")
    with pytest.raises(RuntimeError, match="task 1"), DeviceCodegen(threads) as codegen:
        codegen.submit(_Task())
        codegen.submit(_Task(first))
        raise ValueError("lowering task 2 failed")
    with DeviceCodegen(threads) as codegen:
        for _ in range(5):
            codegen.submit(_Task())
        assert codegen.results() == ["cubin"] * 5


def test_compile_threads_knob(monkeypatch):
    monkeypatch.setenv("QD_COMPILE_THREADS", "3")
    assert config.config_from_env().compile_threads == 3
    assert config.config_from_env(compile_threads=1).compile_threads == 1
    monkeypatch.delenv("QD_COMPILE_THREADS")
    assert config.config_from_env().compile_threads == 0
    with pytest.raises(ValueError, match="compile_threads"):
        config.config_from_env(compile_threads=-1)
    monkeypatch.setenv("QD_COMPILE_THREADS", "many")
    with pytest.raises(ValueError, match="QD_COMPILE_THREADS"):
        config.config_from_env()
