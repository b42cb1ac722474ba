"""Task kernels lowered in forked worker processes (targets/cuda/fork_lowering.py): the same device
code, parameter layouts and task types as lowering every task in the compiling process; tasks a
worker does not deliver (an error, a crash) lower in the compiling process, which raises the error
the serial path raises; the choice of processes and how tasks are shared out."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys

import numba
import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba import config
from qd_numba.targets.cuda import compile as cuda_compile
from qd_numba.targets.cuda import fork_lowering
from qd_numba.targets.cuda.compile import numba_cuda_importable

pytestmark = pytest.mark.skipif(not numba_cuda_importable() or sys.platform != "linux",
                                reason="needs numba-cuda (the CUDA compile check) and fork (Linux)")

N = 40


@numba.njit
def njit_callee(v):
    return v * v - 1.0


@qd.func
def smooth(v):
    return qd.sqrt(v * v + 1.0)


def _programs():
    """Kernels with several independent range-for tasks (worker material) and tasks that load a
    value a serial task stored (lowered in the compiling process after the workers' tasks)."""
    f = qd.field(qd.f32, shape=N)
    g = qd.Vector.field(3, qd.f32, shape=N)
    h = qd.field(qd.i32, shape=N)
    p = qd.field(qd.f32, shape=N)

    @qd.kernel
    def many(k: qd.f32, a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
        for i in f:
            f[i] = njit_callee(f[i]) * k + smooth(f[i])
        for i in g:
            v = qd.Vector([f[i], qd.sin(f[i]), 3.0])
            g[i] = v / (v.norm() + 1.0)
        for i in range(N):
            h[i] = i * 3 % 7
        for i in range(N):
            acc = 0.0
            for j in range(N):
                if j > i:
                    break
                if j % 3 == 1:
                    continue
                acc += a[j]
            p[i] = acc
        total = 0.0
        for i in f:
            total += f[i] * g[i][1]
        return total

    @qd.kernel
    def staged(k: qd.f32) -> qd.f32:
        m = f[0] * k + qd.cos(k)       # serial: stored for the loops below, which load it
        for i in f:
            f[i] = f[i] * m
        for i in g:
            g[i] = g[i] * m + 1.0
        for i in h:
            h[i] = h[i] + 1
        s = 0.0
        for i in f:
            s += f[i]
        return s + m

    return (f, g, h, p), [(many, {"k": types.float32, "a": types.Array(types.float32, 1, "C")}),
                       (staged, {"k": types.float32})]


def _normal_ptx(ptx: str) -> str:
    """PTX with entry names replaced and module-level declarations sorted: numba-cuda emits its
    environment globals in set order, which differs between any two compiles."""
    ptx = re.sub(r"\b_Z\w+", "ENTRY", ptx)
    lines = ptx.splitlines()
    decls = sorted(line for line in lines if line.startswith(".common .global"))
    rest = [line for line in lines if not line.startswith(".common .global")]
    return "\n".join(decls + rest)


def _compile(processes: int):
    """Per kernel: [(normalised PTX, entry name, parameter layout, task params, unit types)]."""
    from qd_numba.targets.cuda.plan import compile_check

    with _processes(processes):
        _fields, programs = _programs()
        return [[(_normal_ptx(c.ptx), c.entry_name, c.param_layout, tuple(tk.params), dict(unit.types))
                 for unit, tk, c in compile_check(kernel, params, {})] for kernel, params in programs]


@contextlib.contextmanager
def _processes(processes: int):
    saved = config.current.compile_processes
    config.current.compile_processes = processes
    try:
        yield
    finally:
        config.current.compile_processes = saved


def _errors_with_and_without_workers(kernel) -> list:
    """(exception type, message) of compiling ``kernel`` in one process, then with workers."""
    from qd_numba.targets.cuda.plan import compile_check

    messages = []
    for processes in (1, 3):
        with _processes(processes), pytest.raises(Exception) as info:
            compile_check(kernel, {}, {})
        messages.append((type(info.value), str(info.value)))
    return messages


class Forks(list):
    """The worker processes forked while a test runs; ``undelivered``: per call of
    ``lower_in_processes``, the jobs no process delivered; ``shares``: the workers' jobs."""

    undelivered: list
    shares: list


@pytest.fixture
def forks(monkeypatch):
    counted = Forks()
    counted.undelivered, counted.shares = [], []
    real_fork, real_lower = fork_lowering._fork_workers, fork_lowering.lower_in_processes

    def counting(jobs, shares, lower, ship):
        workers, unforked = real_fork(jobs, shares, lower, ship)
        counted.extend(workers)
        counted.shares.append(shares)
        return workers, unforked

    def lowering(*args, **kw):
        missing = real_lower(*args, **kw)
        counted.undelivered.append(missing)
        return missing

    monkeypatch.setattr(fork_lowering, "_fork_workers", counting)
    monkeypatch.setattr(fork_lowering, "lower_in_processes", lowering)
    return counted


def test_workers_emit_what_the_serial_path_emits(forks):
    serial = _compile(1)
    assert not forks
    forked = _compile(3)
    assert len(forks) >= len(serial)         # workers beside the compiling process, for each kernel
    assert forks.undelivered == [set()] * len(serial)      # every task came back from its process
    # the first task lowers before the fork (Numba's one-time set-up happens once, inherited)
    assert all(0 not in share for shares in forks.shares for share in shares)
    assert [len(k) for k in forked] == [len(k) for k in serial] and len(serial[0]) >= 5
    for got, want in zip(forked, serial):
        for (ptx, name, layout, params, tys), (ptx0, name0, layout0, params0, tys0) in zip(got, want):
            assert name == name0 and layout == layout0 and params == params0
            assert ptx == ptx0
            assert tys == tys0 and tys      # every variable typed as the serial path types it


def _lower_task_failing_in_workers(monkeypatch, action):
    parent = os.getpid()
    real = cuda_compile.lower_task
    failed_in = set()       # a worker's copy: the worker fails its first task

    def lower_task(*args, **kw):
        if os.getpid() != parent and os.getpid() not in failed_in:
            failed_in.add(os.getpid())
            action()
        return real(*args, **kw)

    monkeypatch.setattr(cuda_compile, "lower_task", lower_task)


@pytest.mark.parametrize("failure", ["raises", "exits"])
def test_tasks_a_worker_does_not_deliver_lower_here(monkeypatch, forks, failure):
    serial = _compile(1)

    def act():
        if failure == "raises":
            raise RuntimeError("injected")
        os._exit(3)

    _lower_task_failing_in_workers(monkeypatch, act)
    forked = _compile(3)
    assert forks and all(forks.undelivered)     # a task of each kernel lowered again here
    assert forked == serial


def test_a_refused_fork_lowers_the_tasks_here(monkeypatch, forks):
    serial = _compile(1)
    real_fork, calls = os.fork, []

    def fork():
        calls.append(1)
        if len(calls) > 1:          # the first worker starts; the system refuses the others
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    assert _compile(3) == serial
    assert len(forks) == 1 and forks.undelivered[0] == set()


def test_a_task_error_is_the_serial_paths_error(forks):
    f = qd.field(qd.f32, shape=N)

    @qd.kernel
    def broken():
        for i in f:
            f[i] = f[i] + 1.0
        for i in f:
            f[i] = f[i] * 2.0
        for i in f:
            f[i] = njit_callee(f[i], 2.0)      # too many arguments: a typing error in this task
        for i in f:
            f[i] = f[i] - 1.0

    messages = _errors_with_and_without_workers(broken)
    assert forks
    assert messages[0] == messages[1]
    assert "njit_callee" in messages[0][1]


def test_processes_for_follows_the_options(monkeypatch):
    cfg = config.current
    monkeypatch.setattr(cfg, "compile_processes", 1)
    assert fork_lowering.processes_for(32) == 1
    monkeypatch.setattr(cfg, "compile_processes", 5)
    assert fork_lowering.processes_for(32) == 5
    assert fork_lowering.processes_for(3) == 3       # never more than the tasks
    assert fork_lowering.processes_for(1) == 1
    monkeypatch.setattr(cfg, "debug", True)          # exception tables stay where a task lowered
    assert fork_lowering.processes_for(32) == 1
    monkeypatch.setattr(cfg, "debug", False)
    monkeypatch.setattr(cfg, "compile_processes", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert fork_lowering.processes_for(32) == 16     # one per core
    assert fork_lowering.processes_for(64) == 16
    assert fork_lowering.processes_for(6) == 3       # two tasks per process at least
    assert fork_lowering.processes_for(5) == 1       # too few to be worth a fork
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert fork_lowering.processes_for(32) == 1      # workers would contend with NVVM's pool
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(cfg, "compile_processes", 4)
    assert fork_lowering.processes_for(32) == 1


def test_share_out_balances_costs(rng):
    costs = [int(c) for c in rng.integers(1, 100, 37)]
    shares = fork_lowering.share_out(costs, 5)
    assert sorted(k for s in shares for k in s) == list(range(37))
    assert all(s == sorted(s) for s in shares)
    loads = [sum(costs[k] for k in s) for s in shares]
    assert max(loads) - min(loads) <= max(costs)     # greedy largest-first bound


def test_types_cross_the_pipe_by_code_or_by_value():
    from numba.cuda.descriptor import cuda_target

    ctx = cuda_target.typing_context
    ctx.refresh()       # numba-cuda loads its typing registries at first use
    existing = types.Array(types.float32, 2, "C")
    before = numba.core.types.abstract._autoincr()
    made_later = ctx.resolve_value_type(np.hypot)   # a function type made after the "fork"
    tup = types.Tuple([existing, types.int64])
    data = fork_lowering._dumps((existing, made_later, tup), before)
    got = fork_lowering._TypeUnpickler(io.BytesIO(data), {}).load()
    assert got[0] is existing and got[1] == made_later and got[2] == tup


def test_compile_processes_option_is_checked():
    with pytest.raises(qd.QuadrantsConfigError, match="compile_processes=-2"):
        config.config_from_env(compile_processes=-2)
    assert config.config_from_env(compile_processes=3).compile_processes == 3


@pytest.mark.cuda
def test_kernels_lowered_by_workers_compute_numpys_values(rng, monkeypatch):
    monkeypatch.setattr(config.current, "compile_processes", 3)
    (f, g, h, p), ((many, _), (staged, _)) = _programs()
    x = rng.uniform(-1, 1, N).astype(np.float32)
    a = rng.uniform(-1, 1, N).astype(np.float32)
    f.from_numpy(x)
    g.from_numpy(rng.uniform(-1, 1, (N, 3)).astype(np.float32))
    total = many(1.5, a)
    fx = (x * x - 1.0) * 1.5 + np.sqrt(x * x + 1.0)
    v = np.stack([fx, np.sin(fx), np.full_like(fx, 3.0)], axis=1)
    gx = v / (np.linalg.norm(v, axis=1, keepdims=True) + 1.0)
    np.testing.assert_allclose(f.to_numpy(), fx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.to_numpy(), gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(h.to_numpy(), np.arange(N) * 3 % 7)
    want_a = np.array([sum(a[j] for j in range(i + 1) if j % 3 != 1) for i in range(N)], np.float32)
    np.testing.assert_allclose(p.to_numpy(), want_a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(total, float(np.sum(fx * gx[:, 1])), rtol=1e-4)
    m = fx[0] * 0.5 + np.cos(0.5)
    got = staged(0.5)
    np.testing.assert_allclose(f.to_numpy(), fx * m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.to_numpy(), gx * m + 1.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, float(np.sum(fx * m)) + m, rtol=1e-4)


def test_workers_fork_without_stdout(monkeypatch, forks):
    """Under pythonw (or a host that closed them) sys.stdout/stderr are None: nothing to flush."""
    serial = _compile(1)
    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "stderr", None)
    forked = _compile(3)
    monkeypatch.undo()
    assert forks and forked == serial


def test_a_failing_first_task_forks_nothing(forks):
    """The first independent task lowers before any fork: when it fails, its error is raised as
    the serial path raises it and no worker is started."""
    f = qd.field(qd.f32, shape=N)

    @qd.kernel
    def broken_first():
        for i in f:
            f[i] = njit_callee(f[i], 1.0, 2.0)     # a typing error in the first task
        for i in f:
            f[i] = f[i] * 2.0
        for i in f:
            f[i] = f[i] - 1.0

    messages = _errors_with_and_without_workers(broken_first)
    assert messages[0] == messages[1] and "njit_callee" in messages[0][1]
    assert not forks and not forks.shares
