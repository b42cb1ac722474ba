"""``kernel.tasks()`` is one Task list for every target: PlanTasks decides the serial tasks and
which top-level loops are parallel, before any target sees the kernel."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.targets.cuda.compile import numba_cuda_importable

N = 64
x = qd.field(qd.f32, shape=(N,))
total = qd.field(qd.f32, shape=())


@qd.kernel
def serial_around(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    total[None] = 0.0
    for i in range(a.shape[0]):
        x[i] = a[i] * 2.0
    m = total[None] + 1.0
    for i in x:
        total[None] += x[i] * m
    return total[None]


@qd.kernel
def loop_under_if(a: qd.types.ndarray(dtype=qd.f32, ndim=1), flag: qd.i32):
    if flag > 0:
        for i in range(a.shape[0]):      # not at the outermost scope: serial, as in Quadrants
            a[i] = a[i] + 1.0
    for i in range(a.shape[0]):
        a[i] *= 3.0


@qd.kernel
def while_then_loop(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
    k = 0
    s = 0
    while k < n:                         # a serial value a later task reads
        s += k
        k += 1
    for i in range(a.shape[0]):
        a[i] += s


@qd.kernel
def nd_and_grouped(b: qd.types.ndarray(dtype=qd.f32, ndim=2)):
    for i, j in qd.ndrange(b.shape[0], b.shape[1]):
        b[i, j] += i - j
    for idx in qd.grouped(b):
        b[idx] *= 2.0


def _signature(tasks):
    return [(t.index, t.kind, t.name, t.uid, t.bounds, t.ndim, t.loc, t.serialize, t.fused_from) for t in tasks]


def _cuda_tasks(kernel, param_types, templates=None):
    from qd_numba.targets.cuda.plan import compile_state

    return compile_state(kernel, param_types, templates or {}).tasks


@pytest.mark.parametrize("case", ["serial_around", "loop_under_if", "while_then_loop", "nd_and_grouped"])
def test_task_lists_agree_and_results_match_numpy(case, rng, arch):
    from numba.core import types

    a = rng.random(N).astype(np.float32)
    if case == "serial_around":
        got = serial_around(a)
        m = 1.0
        np.testing.assert_allclose(got, np.sum(a * 2 * m), rtol=1e-4)
        tasks, ptypes = serial_around.tasks(a), {"a": types.Array(types.float32, 1, "C")}
        kernel = serial_around
        assert [t.kind for t in tasks] == ["serial", "range_for", "serial", "range_for", "serial"]
    elif case == "loop_under_if":
        b = a.copy()
        loop_under_if(b, 1)
        np.testing.assert_allclose(b, (a + 1) * 3, rtol=1e-6)
        c = a.copy()
        loop_under_if(c, 0)
        np.testing.assert_allclose(c, a * 3, rtol=1e-6)
        tasks, kernel = loop_under_if.tasks(b, 1), loop_under_if
        ptypes = {"a": types.Array(types.float32, 1, "C"), "flag": types.int32}
        assert [t.kind for t in tasks] == ["serial", "range_for"]
    elif case == "while_then_loop":
        b = a.copy()
        while_then_loop(b, 7)
        np.testing.assert_allclose(b, a + 21, rtol=1e-6)
        tasks, kernel = while_then_loop.tasks(b, 7), while_then_loop
        ptypes = {"a": types.Array(types.float32, 1, "C"), "n": types.int32}
        assert [t.kind for t in tasks] == ["serial", "range_for"]
    else:
        m = rng.random((5, 7)).astype(np.float32)
        ref = m.copy()
        ref += np.arange(5)[:, None] - np.arange(7)[None, :]
        ref *= 2
        nd_and_grouped(m)
        np.testing.assert_allclose(m, ref, rtol=1e-6)
        tasks, kernel = nd_and_grouped.tasks(m), nd_and_grouped
        ptypes = {"b": types.Array(types.float32, 2, "C")}
        assert [t.kind for t in tasks] == ["range_for", "range_for"]
    if arch == "cpu" and numba_cuda_importable():
        assert _signature(_cuda_tasks(kernel, ptypes)) == _signature(tasks)
