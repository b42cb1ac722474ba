"""Explicit streams and events (qd_numba/streams.py): ``qd.create_stream``, ``qd.create_event``,
``qd_stream=`` on kernel calls.

The API tests run on the current arch (streams are no-ops on the CPU); the ``cuda`` ones need a
GPU: producer and consumer on two streams ordered by an event, copies after work on a stream,
non-blocking and foreign streams. References are numpy on random data.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.errors import QuadrantsRuntimeError, QuadrantsTypeError
from qd_numba.streams import stream_handle


@qd.kernel
def scale_add(x: qd.types.ndarray(dtype=qd.f64, ndim=1), y: qd.types.ndarray(dtype=qd.f64, ndim=1), a: qd.f64):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]


def test_kernel_on_a_stream_gives_the_plain_results(rng):
    x, y = rng.uniform(-1, 1, 300), rng.uniform(-1, 1, 300)
    ref = 1.5 * x + (0.5 * x + y)
    with qd.create_stream() as s:
        scale_add(x, y, 0.5, qd_stream=s)
        scale_add(x=x, y=y, a=1.5, qd_stream=s)
        s.synchronize()
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_events_and_none_stream(rng):
    x, y = rng.uniform(-1, 1, 64), rng.uniform(-1, 1, 64)
    ref = 2.0 * x + y
    s, e = qd.create_stream(), qd.create_event()
    scale_add(x, y, 2.0, qd_stream=None)
    e.record(s)
    e.wait(qd_stream=s)
    e.wait()
    e.synchronize()
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    with e:
        pass
    with pytest.raises(QuadrantsRuntimeError, match="destroyed"):
        e.record(s)
    s.destroy()
    s.destroy()   # twice: nothing
    with pytest.raises(QuadrantsRuntimeError, match="kernel 'scale_add'.*destroyed stream"):
        scale_add(x, y, 1.0, qd_stream=s)


def test_stream_handles_of_other_libraries():
    class Torchish:
        cuda_stream = 0x1234

    class Cupyish:
        ptr = 0x2345

    class NumbaHandle:
        value = 0x3456

    class Numbaish:
        handle = NumbaHandle()

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x4567)

    assert stream_handle(Torchish(), "w") == 0x1234
    assert stream_handle(Cupyish(), "w") == 0x2345
    assert stream_handle(Numbaish(), "w") == 0x3456
    assert stream_handle(Protocol(), "w") == 0x4567
    assert stream_handle(0x5678, "w") == 0x5678
    assert stream_handle(None, "w") == 0
    assert stream_handle(qd.Stream(0x42), "w") == 0x42
    with pytest.raises(QuadrantsTypeError, match="got str"):
        stream_handle("s", "w")
    with pytest.raises(QuadrantsTypeError, match="negative"):
        stream_handle(-1, "w")


def test_bad_stream_argument_names_the_kernel(rng):
    x, y = rng.uniform(-1, 1, 8), rng.uniform(-1, 1, 8)
    with pytest.raises(QuadrantsTypeError, match="kernel 'scale_add'.*got float"):
        scale_add(x, y, 1.0, qd_stream=1.5)


def test_foreign_handles_on_cpu_run_synchronously(rng, arch):
    if arch != "cpu":
        pytest.skip("made-up handles are only harmless where streams are no-ops")
    x, y = rng.uniform(-1, 1, 50), rng.uniform(-1, 1, 50)
    ref = 3.0 * x + y
    scale_add(x, y, 3.0, qd_stream=0x1234)
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_stream_with_gradient_kernel_or_tape_is_refused(rng):
    n = 16
    x = qd.field(qd.f64, shape=n, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def total():
        for i in x:
            loss[None] += x[i] * x[i]

    x.from_numpy(rng.uniform(-1, 1, n))
    s = qd.create_stream()
    with pytest.raises(QuadrantsRuntimeError, match="kernel 'total.grad'.*derivative kernels"):
        total.grad(qd_stream=s)
    with pytest.raises(QuadrantsRuntimeError, match="kernel 'total'.*qd.ad.Tape"):
        with qd.ad.Tape(loss=loss):
            total(qd_stream=s)
    with qd.ad.Tape(loss=loss):    # qd_stream=None is the default stream: allowed
        total(qd_stream=None)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * x.to_numpy(), rtol=1e-12)
    s.destroy()


def test_stream_with_gradient_kernel_of_ndarrays_is_refused(rng):
    @qd.kernel
    def square(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(a.shape[0]):
            b[i] = a[i] * a[i]

    a, b = rng.uniform(-1, 1, 8), np.zeros(8)
    square(a, b, qd_stream=None)
    np.testing.assert_allclose(b, a * a, rtol=1e-12)
    with qd.create_stream() as s, pytest.raises(QuadrantsRuntimeError, match="kernel 'square.grad'.*derivative"):
        square.grad(a, b, qd_stream=s)


def test_generated_call_path_does_not_look_for_streams(rng):
    x, y = rng.uniform(-1, 1, 8), rng.uniform(-1, 1, 8)
    scale_add(x, y, 1.0)
    source = inspect.getsource(type(scale_add).__call__)
    assert "__qd_unknown" in source and "stream" not in source


# -- on a GPU --------------------------------------------------------------------------------------------

@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


STEPS = 2000


@qd.kernel
def produce(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        v = x[i]
        for _ in range(STEPS):
            v = qd.sin(v) * 0.5 + 0.25
        y[i] = v


@qd.kernel
def consume(y: qd.types.ndarray(dtype=qd.f32, ndim=1), z: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(y.shape[0]):
        z[i] = 2.0 * y[i] + 1.0


def _produce_ref(x):
    v = x.astype(np.float64)
    for _ in range(STEPS):
        v = np.sin(v) * 0.5 + 0.25
    return v


@pytest.mark.cuda
def test_event_orders_consumer_after_producer_on_two_streams(rng, on_cuda):
    n = 1 << 16
    x0 = rng.uniform(-1, 1, n).astype(np.float32)
    x, y, z = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    x.from_numpy(x0)
    s1, s2, done = qd.create_stream(), qd.create_stream(), qd.create_event()
    for _ in range(3):
        y.fill(0)
        z.fill(0)
        qd.sync()
        produce(x, y, qd_stream=s1)
        done.record(s1)
        done.wait(qd_stream=s2)
        consume(y, z, qd_stream=s2)
        s2.synchronize()
        np.testing.assert_allclose(z.to_numpy(), 2.0 * _produce_ref(x0) + 1.0, rtol=1e-4, atol=1e-5)
    s1.destroy()
    s2.destroy()
    done.destroy()


@pytest.mark.cuda
def test_copies_follow_work_on_a_created_stream(rng, on_cuda):
    n = 1 << 15
    x0 = rng.uniform(-1, 1, n).astype(np.float32)
    x, y = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    x.from_numpy(x0)
    with qd.create_stream() as s:
        produce(x, y, qd_stream=s)
        got = y.to_numpy()   # no synchronize: the copy is ordered after the kernel
    np.testing.assert_allclose(got, _produce_ref(x0), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_non_blocking_raw_handle_is_fenced_with_copies(rng, on_cuda):
    from cuda.bindings import driver as drv

    err, handle = drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert int(err) == 0
    n = 1 << 15
    x0 = rng.uniform(-1, 1, n).astype(np.float32)
    x, y = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    for _ in range(3):
        x.from_numpy(x0)          # the kernel on the stream waits for this upload
        produce(x, y, qd_stream=int(handle))
        np.testing.assert_allclose(y.to_numpy(), _produce_ref(x0), rtol=1e-4, atol=1e-5)
        x0 = rng.uniform(-1, 1, n).astype(np.float32)
    host = np.zeros(n, np.float32)   # a numpy argument: copied back after the kernel
    produce(x0, host, qd_stream=int(handle))
    np.testing.assert_allclose(host, _produce_ref(x0), rtol=1e-4, atol=1e-5)
    drv.cuStreamSynchronize(handle)
    drv.cuStreamDestroy(handle)


@pytest.mark.cuda
def test_numba_cuda_stream_and_return_value(rng, on_cuda):
    from numba import cuda

    @qd.kernel
    def total(y: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
        s = 0.0
        for i in range(y.shape[0]):
            s += y[i]
        return s

    n = 4096
    x0 = rng.uniform(-1, 1, n).astype(np.float32)
    stream = cuda.stream()
    x, y = cuda.to_device(x0, stream=stream), cuda.device_array(n, np.float32, stream=stream)
    produce(x, y, qd_stream=stream)
    got = total(y, qd_stream=stream)
    ref = _produce_ref(x0)
    np.testing.assert_allclose(y.copy_to_host(stream=stream), ref, rtol=1e-4, atol=1e-5)
    stream.synchronize()
    assert abs(got - ref.sum()) <= 1e-3 * n


@pytest.mark.cuda
def test_torch_stream_interop(rng, on_cuda):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    n = 1 << 14
    x0 = rng.uniform(-1, 1, n).astype(np.float32)
    ts = torch.cuda.Stream()
    with torch.cuda.stream(ts):
        x = torch.from_numpy(x0).cuda()
        y = torch.empty_like(x)
        produce(x, y, qd_stream=ts)
        out = (y * 2.0).cpu()       # torch work on the same stream, after our kernel
    np.testing.assert_allclose(out.numpy(), 2.0 * _produce_ref(x0), rtol=1e-4, atol=1e-5)
    produce(x, y, qd_stream=ts.cuda_stream)   # the raw handle
    ts.synchronize()
    np.testing.assert_allclose(y.cpu().numpy(), _produce_ref(x0), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_stream_call_leaves_the_default_stream_for_plain_calls(rng, on_cuda):
    n = 1024
    x0 = rng.uniform(-1, 1, n).astype(np.float32)
    x, y = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    x.from_numpy(x0)
    with qd.create_stream() as s:
        produce(x, y, qd_stream=s)
        plan = produce.backend().plan_for((x, y))
        assert plan.packed[1] == 0
    produce(x, y)
    np.testing.assert_allclose(y.to_numpy(), _produce_ref(x0), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_launch_goes_to_the_given_stream(rng, on_cuda):
    from cuda.bindings import driver as drv

    n = 1 << 20
    x, y = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    x.from_numpy(rng.uniform(-1, 1, n).astype(np.float32))
    produce(x, y)   # compiled and warm
    qd.sync()
    with qd.create_stream() as s, qd.create_stream() as idle:
        produce(x, y, qd_stream=s)   # milliseconds of work: still running when queried
        (busy,), (other,) = drv.cuStreamQuery(s.handle), drv.cuStreamQuery(idle.handle)
        assert busy == drv.CUresult.CUDA_ERROR_NOT_READY
        assert other == drv.CUresult.CUDA_SUCCESS
        s.synchronize()
        assert drv.cuStreamQuery(s.handle)[0] == drv.CUresult.CUDA_SUCCESS


@pytest.mark.cuda
def test_debug_bounds_check_on_a_stream(rng, on_cuda):
    @qd.kernel
    def bump(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
        for i in range(n):
            a[i] = a[i] + 1.0

    qd.init(arch=qd.cuda, debug=True)
    data = rng.uniform(-1, 1, 64).astype(np.float32)
    a = qd.ndarray(qd.f32, 64)
    a.from_numpy(data)
    with qd.create_stream() as s:
        with pytest.raises(QuadrantsRuntimeError, match="bump"):
            bump(a, 65, qd_stream=s)
        a.from_numpy(data)
        bump(a, 64, qd_stream=s)
        np.testing.assert_allclose(a.to_numpy(), data + 1.0, rtol=1e-6)


@pytest.mark.cuda
def test_profiled_launch_on_a_stream(rng, on_cuda):
    qd.init(arch=qd.cuda, kernel_profiler=True)
    n = 4096
    x0 = rng.uniform(-1, 1, n).astype(np.float32)
    x, y = qd.ndarray(qd.f32, n), qd.ndarray(qd.f32, n)
    x.from_numpy(x0)
    with qd.create_stream() as s:
        produce(x, y, qd_stream=s)
        s.synchronize()
    np.testing.assert_allclose(y.to_numpy(), _produce_ref(x0), rtol=1e-4, atol=1e-5)
    assert qd.profiler.query_kernel_profiler_info(produce.qualname).counter == 1
