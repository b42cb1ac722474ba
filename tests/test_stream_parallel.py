"""``with qd.stream_parallel():`` (passes/stream_blocks.py, targets/cuda/stream_pool.py).

On the CPU (blocks run in order there): the API, every compile-time error (naming kernel and
line), the call-time errors of ``qd_stream=``, results equal to the same kernel without blocks
and to numpy on random data, the Tasks' stream groups, fusion kept inside a block, and the
compiled code's key. The ``cuda`` tests need a GPU: two blocks really overlap (a handshake between
them that only a concurrent run completes), results, and order on the caller's stream.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config as qd_config
from qd_numba.errors import QuadrantsRuntimeError, QuadrantsSyntaxError, QuadrantsWarning
from qd_numba.targets.cuda.stream_pool import StreamBlocks, launch_program, stream_blocks

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)
F64_1D = qd.types.ndarray(dtype=qd.f64, ndim=1)
F64_2D = qd.types.ndarray(dtype=qd.f64, ndim=2)


# -- the API -----------------------------------------------------------------------------------------------

def test_python_scope_is_a_no_op():
    ran = []
    with qd.stream_parallel():
        ran.append(1)
    assert ran == [1] and qd.stream_parallel is qd.lang.stream_parallel


# -- results --------------------------------------------------------------------------------------------

total = qd.field(qd.f64, shape=())


@qd.kernel
def three_blocks(a: F64_1D, b: F64_1D, m: F64_2D, x: qd.f64):
    with qd.stream_parallel():
        for i in range(a.shape[0]):
            a[i] = qd.sin(a[i]) * x
        for i in range(a.shape[0]):
            a[i] += 1.0
    with qd.stream_parallel():
        total[None] = 0.5
        for i in range(b.shape[0]):
            total[None] += b[i] * b[i]
    with qd.stream_parallel():
        for i, j in qd.ndrange(m.shape[0], m.shape[1]):
            m[i, j] = m[i, j] * x + i - j


@qd.kernel
def three_loops(a: F64_1D, b: F64_1D, m: F64_2D, x: qd.f64):
    for i in range(a.shape[0]):
        a[i] = qd.sin(a[i]) * x
    for i in range(a.shape[0]):
        a[i] += 1.0
    total[None] = 0.5
    for i in range(b.shape[0]):
        total[None] += b[i] * b[i]
    for i, j in qd.ndrange(m.shape[0], m.shape[1]):
        m[i, j] = m[i, j] * x + i - j


def _inputs(rng):
    return rng.uniform(-2, 2, 257), rng.uniform(-1, 1, 130), rng.uniform(-1, 1, (9, 13)), float(rng.uniform(0.5, 2))


def _reference(a, b, m, x):
    i, j = np.indices(m.shape)
    return np.sin(a) * x + 1.0, 0.5 + np.sum(b * b), m * x + i - j


def test_results_equal_the_plain_kernel_and_numpy(rng):
    a, b, m, x = _inputs(rng)
    ref_a, ref_total, ref_m = _reference(a, b, m, x)
    outs = []
    for kernel in (three_blocks, three_loops):
        a1, m1 = a.copy(), m.copy()
        kernel(a1, b, m1, x)
        outs.append((a1, total[None], m1))
        np.testing.assert_allclose(a1, ref_a, rtol=1e-12)
        np.testing.assert_allclose(total[None], ref_total, rtol=1e-10)
        np.testing.assert_allclose(m1, ref_m, rtol=1e-12)
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][2], outs[1][2])


def test_tasks_carry_their_block(rng):
    a, b, m, x = _inputs(rng)
    blocks = [(t.kind, t.stream_group) for t in three_blocks.tasks(a, b, m, x)]
    assert blocks == [("range_for", 1), ("range_for", 1), ("serial", 2), ("range_for", 2), ("range_for", 3)]
    assert {t.stream_group for t in three_loops.tasks(a, b, m, x)} == {0}


@qd.kernel
def template_blocks(f: qd.template(), a: F64_1D, s: qd.f64):
    """A docstring is fine."""
    with qd.stream_parallel():
        for i, j in f:
            f[i, j] = f[i, j] * s
    with qd.stream_parallel():
        for i in range(a.shape[0]):
            a[i] = a[i] + s


@qd.data_oriented
class Pair:
    def __init__(self, n):
        self.u = qd.field(qd.f64, shape=(n,))
        self.v = qd.field(qd.f64, shape=(n,))

    @qd.kernel
    def step(self, s: qd.f64):
        with qd.stream_parallel():
            for i in self.u:
                self.u[i] = qd.cos(self.u[i]) * s
        with qd.stream_parallel():
            for i in self.v:
                self.v[i] += s


def test_template_arguments_and_methods(rng):
    f = qd.field(qd.f64, shape=(6, 5))
    f0, a, s = rng.uniform(-1, 1, (6, 5)), rng.uniform(-1, 1, 11), float(rng.uniform(1, 2))
    f.from_numpy(f0)
    ref_a = a + s
    template_blocks(f, a, s)
    np.testing.assert_allclose(f.to_numpy(), f0 * s, rtol=1e-12)
    np.testing.assert_allclose(a, ref_a, rtol=1e-12)
    pair = Pair(9)
    u0, v0 = rng.uniform(-1, 1, 9), rng.uniform(-1, 1, 9)
    pair.u.from_numpy(u0)
    pair.v.from_numpy(v0)
    pair.step(s)
    np.testing.assert_allclose(pair.u.to_numpy(), np.cos(u0) * s, rtol=1e-12)
    np.testing.assert_allclose(pair.v.to_numpy(), v0 + s, rtol=1e-12)


@qd.kernel(fuse=True)
def fusable_blocks(a: F64_1D, b: F64_1D, c: F64_1D):
    with qd.stream_parallel():
        for i in range(a.shape[0]):
            a[i] = a[i] * 2.0
        for i in range(a.shape[0]):
            b[i] = b[i] + 1.0
    with qd.stream_parallel():     # runs at the same time as the first block: its own array
        for i in range(a.shape[0]):
            c[i] = c[i] - 3.0 * a.shape[0]


def test_fusion_stays_inside_a_block(rng):
    a, b, c = rng.uniform(-1, 1, 100), rng.uniform(-1, 1, 100), rng.uniform(-1, 1, 100)
    tasks = fusable_blocks.tasks(a, b, c)
    assert [(len(t.fused_from), t.stream_group) for t in tasks] == [(2, 1), (0, 2)]
    ref_a, ref_b, ref_c = a * 2.0, b + 1.0, c - 300.0
    fusable_blocks(a, b, c)
    np.testing.assert_allclose(a, ref_a, rtol=1e-12)
    np.testing.assert_allclose(b, ref_b, rtol=1e-12)
    np.testing.assert_allclose(c, ref_c, rtol=1e-12)


def _block_warnings(kernel, *args) -> list:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel.tasks(*args)
    return [str(w.message) for w in caught if issubclass(w.category, QuadrantsWarning)]


def test_data_shared_between_blocks_is_warned_about(rng):
    """Data one block stores to and another block uses (or one updates atomically and another
    loads) races on a GPU, where the blocks run at the same time: a QuadrantsWarning naming the
    kernel, the data and both blocks' loops. Atomic updates from several blocks, and data used in
    one block only, are fine."""
    acc = qd.field(qd.f64, shape=())

    @qd.kernel
    def store_then_store(a: F64_1D, b: F64_1D):
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                a[i] = a[i] * 2.0
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                a[i] = a[i] - 3.0

    @qd.kernel
    def store_then_load(a: F64_1D, b: F64_1D):
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                a[i] = 1.0
        with qd.stream_parallel():
            for i in range(b.shape[0]):
                b[i] = a[i] + 1.0

    @qd.kernel
    def atomic_then_load(a: F64_1D, b: F64_1D):
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                acc[None] += a[i]
        with qd.stream_parallel():
            for i in range(b.shape[0]):
                b[i] = acc[None]

    @qd.kernel
    def atomics_only(a: F64_1D, b: F64_1D):
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                acc[None] += a[i]
        with qd.stream_parallel():
            for i in range(b.shape[0]):
                acc[None] += b[i]

    a, b = rng.uniform(-1, 1, 8), rng.uniform(-1, 1, 8)
    (w,) = _block_warnings(store_then_store, a, b)
    assert "kernel 'store_then_store'" in w and "'a' is written" in w and "stores to it" in w
    assert w.count("test_stream_parallel.py:") == 2
    (w,) = _block_warnings(store_then_load, a, b)
    assert "'a' is written" in w and "loads it" in w
    (w,) = _block_warnings(atomic_then_load, a, b)
    assert "'acc' is written" in w and "loads it" in w
    assert _block_warnings(atomics_only, a, b) == []
    assert _block_warnings(fusable_blocks, a, b, rng.uniform(-1, 1, 8)) == []
    assert _block_warnings(three_blocks, a, b, rng.uniform(size=(3, 4)), 0.5) == []


@qd.kernel
def one_block_two_loops(a: F64_1D, b: F64_1D):
    with qd.stream_parallel():
        for i in range(a.shape[0]):
            a[i] = a[i] + 1.0
        for i in range(b.shape[0]):
            b[i] = b[i] * 2.0


@qd.kernel
def two_blocks_one_loop_each(a: F64_1D, b: F64_1D):
    with qd.stream_parallel():
        for i in range(a.shape[0]):
            a[i] = a[i] + 1.0
    with qd.stream_parallel():
        for i in range(b.shape[0]):
            b[i] = b[i] * 2.0


@qd.kernel
def no_blocks(a: F64_1D, b: F64_1D):
    for i in range(a.shape[0]):
        a[i] = a[i] + 1.0
    for i in range(b.shape[0]):
        b[i] = b[i] * 2.0


def _artifact_key(kernel, *args):
    if qd_config.current.arch == "cpu":
        kernel(*args)
        return kernel.last_instance.artifact_key
    return kernel.backend().plan_for(args).artifact_key


def test_block_structure_is_part_of_the_key(rng):
    a, b = rng.uniform(-1, 1, 40), rng.uniform(-1, 1, 30)
    keys = {_artifact_key(k, a.copy(), b.copy()) for k in (one_block_two_loops, two_blocks_one_loop_each, no_blocks)}
    assert len(keys) == 3 and None not in keys
    groups = [[t.stream_group for t in k.tasks(a, b)] for k in (one_block_two_loops, two_blocks_one_loop_each)]
    assert groups == [[1, 1], [1, 2]]


def test_launch_program_forks_runs_of_groups():
    # tasks outside groups run in order on the caller's stream; a run of groups is one fork/join
    assert launch_program([1, 1, 2, 3]) == [(True, [[0, 1], [2], [3]])]
    assert launch_program([0, 1, 2, 2, 0, 3]) == [(False, [0]), (True, [[1], [2, 3]]), (False, [4]),
                                                  (True, [[5]])]


def test_fork_join_calls_in_order():
    # the launcher with stand-ins for the driver: what runs on which stream, in which order
    calls = []
    packed = np.zeros(2 + 4 * 5, np.int64)
    packed[1] = 77                                   # the caller's stream
    blocks = StreamBlocks(packed, launch_program([0, 1, 1, 2, 3]), [501, 502], (11, 12),
                          lambda address, k: calls.append(("launch", k, int(packed[1]))) or -1,
                          lambda event, stream: calls.append(("record", event, stream)) or 0,
                          lambda stream, event, flags: calls.append(("wait", stream, event)) or 0)
    assert blocks.launch() == -1
    assert calls == [("launch", 0, 77), ("record", 11, 77),
                     ("launch", 1, 77), ("launch", 2, 77),
                     ("wait", 501, 11), ("launch", 3, 501), ("record", 12, 501), ("wait", 77, 12),
                     ("wait", 502, 11), ("launch", 4, 502), ("record", 12, 502), ("wait", 77, 12)]
    assert packed[1] == 77
    # a failed launch is reported as the native launcher reports it; the stream word is restored
    failing = StreamBlocks(packed, launch_program([1, 2]), [501], (11, 12),
                           lambda address, k: (k << 32) | 700 if packed[1] == 501 else -1,
                           lambda event, stream: 0, lambda stream, event, flags: 0)
    assert failing.launch() == (1 << 32) | 700 and packed[1] == 77


def test_plans_that_launch_in_order():
    # fewer than two groups, gradient kernels, debug plans and profiled plans need no fork/join
    def plan(groups, autodiff=None, error_words=(), timer=None):
        launches = [SimpleNamespace(task=SimpleNamespace(stream_group=g)) for g in groups]
        return SimpleNamespace(launches=launches, kernel=SimpleNamespace(autodiff_mode=autodiff),
                               error_words=list(error_words), timer=timer)

    assert stream_blocks(plan([0, 0])) is None and stream_blocks(plan([1, 1, 0])) is None
    assert stream_blocks(plan([1, 2], autodiff="reverse")) is None
    assert stream_blocks(plan([1, 2], error_words=[(None, 8)])) is None
    assert stream_blocks(plan([1, 2], timer=object())) is None


# -- compile-time errors ------------------------------------------------------------------------------------

def _raises(kernel, *args, match):
    with pytest.raises(QuadrantsSyntaxError, match=match) as info:
        kernel(*args)
    text = str(info.value)
    assert f"kernel '{kernel.name}'" in text
    return text


def test_statement_before_a_block_is_rejected(rng):
    @qd.kernel
    def mixed(a: F64_1D):
        total[None] = 1.0
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                a[i] = 1.0

    text = _raises(mixed, rng.uniform(size=4), match="every top-level statement")
    assert "total[None] = 1.0" in text


def test_loop_after_a_block_is_rejected(rng):
    @qd.kernel
    def mixed(a: F64_1D):
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                a[i] = 1.0
        for i in range(a.shape[0]):
            a[i] += 2.0

    _raises(mixed, rng.uniform(size=4), match="every top-level statement")


def test_nested_blocks_are_rejected(rng):
    @qd.kernel
    def nested(a: F64_1D):
        with qd.stream_parallel():
            with qd.stream_parallel():
                for i in range(a.shape[0]):
                    a[i] = 1.0

    _raises(nested, rng.uniform(size=4), match="cannot be nested")


def test_arguments_are_rejected(rng):
    @qd.kernel
    def with_argument(a: F64_1D):
        with qd.stream_parallel(2):
            for i in range(a.shape[0]):
                a[i] = 1.0

    _raises(with_argument, rng.uniform(size=4), match="takes no arguments")


def test_block_inside_a_loop_is_rejected(rng):
    @qd.kernel
    def inner(a: F64_1D):
        for i in range(a.shape[0]):
            with qd.stream_parallel():
                a[i] = 1.0

    text = _raises(inner, rng.uniform(size=4), match="top level")
    assert "with qd.stream_parallel()" in text


@qd.func
def _func_with_block(a, i):
    with qd.stream_parallel():
        a[i] = 1.0


def test_block_in_a_func_is_rejected(rng):
    @qd.kernel
    def calls(a: F64_1D):
        for i in range(a.shape[0]):
            _func_with_block(a, i)

    _raises(calls, rng.uniform(size=4), match="not @qd.func")


def test_block_in_a_graph_kernel_is_rejected(rng):
    @qd.kernel(graph=True)
    def graphed(a: F64_1D):
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                a[i] = 1.0

    _raises(graphed, rng.uniform(size=4), match="graph=True")


def test_other_with_statements_are_rejected(rng):
    @qd.kernel
    def other(a: F64_1D):
        with contextlib.nullcontext():
            for i in range(a.shape[0]):
                a[i] = 1.0

    _raises(other, rng.uniform(size=4), match="only supports qd.stream_parallel")


def test_return_inside_a_block_is_rejected(rng):
    @qd.kernel
    def returns(a: F64_1D) -> qd.f64:
        with qd.stream_parallel():
            return a[0]

    _raises(returns, rng.uniform(size=4), match="cannot return a value")


def test_return_from_a_block_is_rejected(rng):
    @qd.kernel
    def leaves(a: F64_1D):
        with qd.stream_parallel():
            if a[0] > 0:
                return
            for i in range(a.shape[0]):
                a[i] = 1.0

    _raises(leaves, rng.uniform(size=4), match="'return' inside")


def test_value_crossing_blocks_is_rejected(rng):
    @qd.kernel
    def crossing(a: F64_1D, b: F64_1D):
        with qd.stream_parallel():
            n = qd.cast(a[0], qd.i32)
            for i in range(a.shape[0]):
                a[i] = 1.0
        with qd.stream_parallel():
            for i in range(n):
                b[i] = 2.0

    _raises(crossing, np.full(4, 2.0), rng.uniform(size=4), match="'n' is computed in one")


def test_serial_code_spanning_two_blocks_is_rejected(rng):
    @qd.kernel
    def spanning(a: F64_1D):
        with qd.stream_parallel():
            for i in range(a.shape[0]):
                a[i] = 1.0
            total[None] = 1.0
        with qd.stream_parallel():
            total[None] += 2.0
            for i in range(a.shape[0]):
                a[i] += 1.0

    _raises(spanning, rng.uniform(size=4), match="runs as one serial task")


# -- call-time errors: qd_stream= with derivative kernels and Tapes -----------------------------------------

loss = qd.field(qd.f64, shape=(), needs_grad=True)
xs = qd.field(qd.f64, shape=(8,), needs_grad=True)


@qd.kernel
def sp_loss():
    with qd.stream_parallel():
        for i in xs:
            loss[None] += xs[i] * xs[i]


def test_qd_stream_is_refused_for_the_gradient_and_in_a_tape(rng):
    xs.from_numpy(rng.uniform(-1, 1, 8))
    with qd.create_stream() as s:
        with pytest.raises(QuadrantsRuntimeError, match="derivative kernels"):
            sp_loss.grad(qd_stream=s)
        with pytest.raises(QuadrantsRuntimeError, match="inside a qd.ad.Tape"):
            with qd.ad.Tape(loss=loss):
                sp_loss(qd_stream=s)
    loss[None] = 0.0
    with qd.ad.Tape(loss=loss):
        sp_loss()
    np.testing.assert_allclose(xs.grad.to_numpy(), 2.0 * xs.to_numpy(), rtol=1e-12)


# -- on a GPU -----------------------------------------------------------------------------------------------

@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


SPIN = 20_000_000


@qd.kernel
def handshake(flags: qd.types.ndarray(dtype=qd.i32, ndim=1), seen: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    # each block raises its flag, then waits (boundedly) for the other's: both see the other's
    # flag only when the two blocks run at the same time
    with qd.stream_parallel():
        for _ in range(1):
            qd.atomic_add(flags[0], 1)
            k = 0
            while k < SPIN and qd.atomic_add(flags[1], 0) == 0:
                k += 1
            seen[0] = qd.atomic_add(flags[1], 0)
    with qd.stream_parallel():
        for _ in range(1):
            qd.atomic_add(flags[1], 1)
            k = 0
            while k < SPIN and qd.atomic_add(flags[0], 0) == 0:
                k += 1
            seen[1] = qd.atomic_add(flags[0], 0)


@pytest.mark.cuda
def test_two_blocks_run_concurrently(on_cuda):
    flags, seen = qd.ndarray(qd.i32, 2), qd.ndarray(qd.i32, 2)
    for _ in range(3):
        flags.fill(0)
        seen.fill(0)
        handshake(flags, seen)
        np.testing.assert_array_equal(seen.to_numpy(), [1, 1])


STEPS = 500


@qd.kernel
def heavy_pair(x: F32_1D, y: F32_1D):
    with qd.stream_parallel():
        for i in range(x.shape[0]):
            v = x[i]
            for _ in range(STEPS):
                v = qd.sin(v) * 0.5 + 0.25
            x[i] = v
    with qd.stream_parallel():
        for i in range(y.shape[0]):
            v = y[i]
            for _ in range(STEPS):
                v = qd.sin(v) * 0.75 - 0.1
            y[i] = v


@qd.kernel
def follow(x: F32_1D, y: F32_1D, z: F32_1D):
    for i in range(z.shape[0]):
        z[i] = x[i] + 2.0 * y[i]


def _heavy_ref(x, a, c):
    v = x.astype(np.float64)
    for _ in range(STEPS):
        v = np.sin(v) * a + c
    return v


@pytest.mark.cuda
def test_results_and_order_on_the_callers_stream(rng, on_cuda):
    n = 1 << 14
    x0, y0 = rng.uniform(-1, 1, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
    rx, ry = _heavy_ref(x0, 0.5, 0.25), _heavy_ref(y0, 0.75, -0.1)
    x, y, z = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    # the legacy default stream: the copies after the call see both blocks' results
    x.from_numpy(x0)
    y.from_numpy(y0)
    heavy_pair(x, y)
    np.testing.assert_allclose(x.to_numpy(), rx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y.to_numpy(), ry, rtol=1e-4, atol=1e-5)
    # numpy arguments are copied back after the join
    xh, yh = x0.copy(), y0.copy()
    heavy_pair(xh, yh)
    np.testing.assert_allclose(xh, rx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(yh, ry, rtol=1e-4, atol=1e-5)
    # a created stream: the next kernel on it runs after both blocks
    x.from_numpy(x0)
    y.from_numpy(y0)
    with qd.create_stream() as s, qd.create_stream() as other:
        qd.sync()
        heavy_pair(x, y, qd_stream=s)
        follow(x, y, z, qd_stream=s)
        done = qd.create_event()
        done.record(s)
        done.wait(qd_stream=other)
        follow(x, y, z, qd_stream=other)   # same values again, ordered by the event
        other.synchronize()
        done.destroy()
    np.testing.assert_allclose(z.to_numpy(), rx + 2.0 * ry, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_foreign_non_blocking_stream_is_ordered(rng, on_cuda):
    from cuda.bindings import driver as drv

    n = 1 << 13
    x0, y0 = rng.uniform(-1, 1, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
    x, y = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    x.from_numpy(x0)
    y.from_numpy(y0)
    err, handle = drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert int(err) == 0
    heavy_pair(x, y, qd_stream=int(handle))
    got = x.to_numpy(), y.to_numpy()     # fenced after the kernel, which joined on the stream
    drv.cuStreamSynchronize(handle)
    drv.cuStreamDestroy(handle)
    np.testing.assert_allclose(got[0], _heavy_ref(x0, 0.5, 0.25), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], _heavy_ref(y0, 0.75, -0.1), rtol=1e-4, atol=1e-5)


def test_graph_branches_of_stream_parallel_blocks():
    """The graph that replays a stream-parallel plan (automatic graph replay) has the fork/join's
    shape: each block a chain after the node before its run of blocks, the node after the run
    waiting for every block's last task."""
    from qd_numba.graph import dependencies
    from qd_numba.targets.cuda.graphs import stream_labels

    groups = [0, 1, 1, 2, 3, 3, 0, 1, 2]
    assert dependencies(stream_labels(groups)) == [[], [0], [1], [0], [0], [4], [2, 3, 5], [6], [6]]
    assert dependencies(stream_labels([1, 2])) == [[], []]
