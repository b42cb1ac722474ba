"""The CUDA target on a real GPU: device fields, ndarray arguments of every kind, the launch
cache, values passed between tasks, return values, errors.

Every test here needs a GPU (``-m cuda``); the rest of the suite also runs on the GPU with
``pytest --arch=cuda``. References are numpy on random data.
"""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module", autouse=True)
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


@qd.kernel
def axpy(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1), a: qd.f32):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]


def _close_f32(actual, ref64, ops=1):
    """float32 results against a float64 reference: the GPU contracts a*x + y into one FMA
    (one rounding instead of two), so compare within a few float32 ulps of the operands' scale
    per operation instead of bit-equality with numpy's two-rounding float32 arithmetic."""
    np.testing.assert_allclose(np.asarray(actual, np.float64), ref64, rtol=2e-7 * ops,
                               atol=4e-7 * ops * max(1.0, float(np.max(np.abs(ref64), initial=0.0))))


def _plans():
    from qd_numba.targets.cuda.runtime import CudaRuntime

    return CudaRuntime.get().plan_builds


def test_numpy_arguments_are_copied_back(rng):
    x = rng.uniform(-1, 1, 1000).astype(np.float32)
    y = rng.uniform(-1, 1, 1000).astype(np.float32)
    ref = 2.5 * x.astype(np.float64) + y
    axpy(x, y, 2.5)
    _close_f32(y, ref)


def test_launch_cache_is_reused(rng):
    from numba import cuda

    x = cuda.to_device(rng.uniform(-1, 1, 4096).astype(np.float32))
    y0 = rng.uniform(-1, 1, 4096).astype(np.float32)
    y = cuda.to_device(y0)
    axpy(x, y, 1.0)
    before = _plans()
    for _ in range(10):
        axpy(x, y, 1.0)
    assert _plans() == before  # same spec: no new plan, no typing
    _close_f32(y.copy_to_host(), y0 + 11 * x.copy_to_host().astype(np.float64), ops=11)
    # another length is the same spec (shape is not part of it): still no new plan
    x2 = cuda.to_device(rng.uniform(-1, 1, 77).astype(np.float32))
    y2 = cuda.to_device(np.zeros(77, np.float32))
    axpy(x2, y2, 3.0)
    assert _plans() == before
    _close_f32(y2.copy_to_host(), 3.0 * x2.copy_to_host().astype(np.float64))


def test_torch_tensors_in_place(rng):
    torch = pytest.importorskip("torch")
    x = torch.tensor(rng.uniform(-1, 1, 3000), dtype=torch.float32, device="cuda")
    y = torch.tensor(rng.uniform(-1, 1, 3000), dtype=torch.float32, device="cuda")
    ref = 0.5 * x.cpu().numpy().astype(np.float64) + y.cpu().numpy()
    ptr = y.data_ptr()
    axpy(x, y, 0.5)
    qd.sync()
    assert y.data_ptr() == ptr
    _close_f32(y.cpu().numpy(), ref)


def test_cupy_arrays_in_place(rng):
    cp = pytest.importorskip("cupy")
    x = cp.asarray(rng.uniform(-1, 1, 3000).astype(np.float32))
    y = cp.asarray(rng.uniform(-1, 1, 3000).astype(np.float32))
    ref = -1.5 * cp.asnumpy(x).astype(np.float64) + cp.asnumpy(y)
    axpy(x, y, -1.5)
    qd.sync()
    _close_f32(cp.asnumpy(y), ref)


def test_strided_torch_view(rng):
    torch = pytest.importorskip("torch")
    base = torch.tensor(rng.uniform(-1, 1, (64, 8)), dtype=torch.float32, device="cuda")
    x = base[:, 3]          # non-contiguous
    y = torch.zeros(64, dtype=torch.float32, device="cuda")
    axpy(x, y, 2.0)
    qd.sync()
    np.testing.assert_allclose(y.cpu().numpy(), 2.0 * base[:, 3].cpu().numpy(), rtol=1e-6)




def test_fields_live_on_device(rng):
    f = qd.field(qd.f64, shape=(50, 3))
    g = qd.Vector.field(3, qd.f32, shape=(50,))
    d = rng.uniform(-2, 2, (50, 3))
    f.from_numpy(d)

    @qd.kernel
    def fill_vec():
        for i in g:
            for k in qd.static(range(3)):
                g[i][k] = f[i, k] * 2.0

    fill_vec()
    np.testing.assert_allclose(g.to_numpy(), (d * 2).astype(np.float32), rtol=1e-6)
    assert f._dev is not None and g._dev is not None
    # python-scope element access goes to device memory
    f[3, 1] = 7.25
    assert f[3, 1] == 7.25
    np.testing.assert_allclose(g[4], (d[4] * 2).astype(np.float32), rtol=1e-6)


def test_first_use_of_fields_on_device(rng):
    """A field's device buffer is made at its first kernel: copied from what python scope wrote,
    set to zero when nothing did (runtime.ensure_device); a -0.0 is data, not zero."""
    n = 3000
    untouched = qd.field(qd.f32, shape=n)
    written = qd.field(qd.f32, shape=n)
    signed = qd.field(qd.f32, shape=n)
    acc = qd.Vector.field(2, qd.f64, shape=n)
    out = qd.field(qd.f32, shape=n)
    inv = qd.field(qd.f32, shape=n)
    w = rng.uniform(-3, 3, n).astype(np.float32)
    s = np.where(rng.random(n) < 0.5, np.float32(-0.0), np.float32(0.0))
    written.from_numpy(w)
    signed.from_numpy(s)

    @qd.kernel
    def use():
        for i in range(n):
            out[i] = untouched[i] + written[i]
            inv[i] = 1.0 / signed[i]
            acc[i] += qd.Vector([written[i], 2.0])

    use()
    np.testing.assert_array_equal(out.to_numpy(), w)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(inv.to_numpy(), np.float32(1.0) / s)     # -inf where -0.0
    np.testing.assert_allclose(acc.to_numpy(), np.stack([w.astype(np.float64), np.full(n, 2.0)], axis=1))
    assert not untouched.to_numpy().any()


def test_serial_values_and_return(rng):
    x = qd.field(qd.f32, shape=(256,))
    d = rng.uniform(0, 1, 256).astype(np.float32)
    x.from_numpy(d)
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def scaled_sum(k: qd.f32) -> qd.f32:
        total[None] = 0.0
        s = x[0] * k                        # a value loaded in serial code, used by the next loop
        for i in x:
            total[None] += x[i] * s
        return total[None] + 1.0

    got = scaled_sum(3.0)
    ref = float(np.sum(d.astype(np.float64) * d[0] * 3.0) + 1.0)
    assert got == pytest.approx(ref, rel=1e-4)


def test_atomics_all_dtypes(rng):
    v = rng.integers(-50, 50, 5000).astype(np.int32)
    w = rng.uniform(-1, 1, 5000)
    acc_i = qd.field(qd.i32, shape=(4,))
    acc_f = qd.field(qd.f64, shape=(2,))

    @qd.kernel
    def reduce_all(v: qd.types.ndarray(dtype=qd.i32, ndim=1), w: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(v.shape[0]):
            acc_i[0] += v[i]
            qd.atomic_max(acc_i[1], v[i])
            qd.atomic_min(acc_i[2], v[i])
            acc_i[3] ^= v[i]
            acc_f[0] += w[i]
            qd.atomic_max(acc_f[1], w[i])

    acc_i.from_numpy(np.array([0, -1000, 1000, 0], np.int32))
    acc_f.from_numpy(np.array([0.0, -10.0]))
    reduce_all(v, w)
    np.testing.assert_array_equal(acc_i.to_numpy(), [v.sum(), v.max(), v.min(), np.bitwise_xor.reduce(v)])
    np.testing.assert_allclose(acc_f.to_numpy(), [w.sum(), w.max()], rtol=1e-10)


def test_wrong_dtype_is_our_error():
    from numba import cuda

    x = cuda.to_device(np.zeros(8, np.float64))
    y = cuda.to_device(np.zeros(8, np.float32))
    with pytest.raises(qd.QuadrantsTypeError, match="axpy.*'x'.*float32"):
        axpy(x, y, 1.0)


def test_cpu_torch_tensor_is_our_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(qd.QuadrantsTypeError, match="CPU torch tensor"):
        axpy(torch.zeros(4), torch.zeros(4), 1.0)


def test_njit_device_function(rng):
    import numba

    @numba.njit
    def smooth(a, b):
        return 0.5 * (a + b)

    @qd.kernel
    def blur(x: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(1, x.shape[0] - 1):
            out[i] = smooth(x[i - 1], x[i + 1])

    x = rng.uniform(-1, 1, 500)
    out = np.zeros(500)
    blur(x, out)
    np.testing.assert_allclose(out[1:-1], 0.5 * (x[:-2] + x[2:]), rtol=1e-12)


def test_zero_copy_views(rng):
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    a = qd.ndarray(qd.f32, shape=(300,))
    d = rng.uniform(-1, 1, 300).astype(np.float32)
    a.from_numpy(d)
    t = a.to_torch()
    c = a.to_cupy()
    assert t.is_cuda and t.data_ptr() == c.data.ptr == a._dev.device_ctypes_pointer.value
    t.mul_(2.0)                   # a write through the view is a write to the ndarray
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a.to_numpy(), d * 2)
    axpy(c, t, 1.0)               # and the views are kernel arguments in place: t = c + t = 4d
    qd.sync()
    np.testing.assert_allclose(a.to_numpy(), d * 4, rtol=1e-6)


def test_grids_follow_ndarray_shapes(rng):
    # host iteration counts are cached per (qd.ndarray objects, scalars): new objects of other
    # lengths, including an empty one, must still get the right launch
    before = _plans()
    kept = []
    for n in (1000, 0, 77, 5000, 77):
        x, y = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n,))
        dx = rng.uniform(-1, 1, n).astype(np.float32)
        dy = rng.uniform(-1, 1, n).astype(np.float32)
        x.from_numpy(dx)
        y.from_numpy(dy)
        axpy(x, y, 2.0)
        axpy(x, y, 2.0)          # the same objects again: the cached counts
        _close_f32(y.to_numpy(), 4.0 * dx.astype(np.float64) + dy, ops=2)
        kept.append((x, y))
    assert _plans() - before <= 1


# -- debug=True: bounds checks on the device ----------------------------------------------------------------

@pytest.fixture
def cuda_debug():
    qd.init(arch=qd.cuda, debug=True)
    yield
    qd.init(arch=qd.cuda)


@pytest.mark.parametrize("kind", ["numpy", "qd.ndarray", "torch"])
def test_debug_ndarray_out_of_bounds(cuda_debug, rng, kind):
    @qd.kernel
    def oob(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
        for i in range(n):
            a[i] = a[i] + 1.0

    data = rng.uniform(-1, 1, 64).astype(np.float32)
    if kind == "numpy":
        a = data.copy()
    elif kind == "qd.ndarray":
        a = qd.ndarray(qd.f32, shape=64)
        a.from_numpy(data)
    else:
        torch = pytest.importorskip("torch")
        a = torch.from_numpy(data.copy()).cuda()
    with pytest.raises(qd.QuadrantsRuntimeError, match=r"kernel 'oob'.*out-of-bounds.*task"):
        oob(a, 65)
    oob(a, 64)  # in bounds: runs and raises nothing (the failed call's effect is unspecified)
    out = a if kind == "numpy" else a.to_numpy() if kind == "qd.ndarray" else a.cpu().numpy()
    assert np.all(np.isfinite(out))


def test_debug_field_out_of_bounds_second_axis(cuda_debug, rng):
    f = qd.field(qd.i32, shape=(4, 4))

    @qd.kernel
    def oob2(m: qd.i32):
        for i, j in qd.ndrange(4, m):
            f[i, j] = i * 4 + j

    with pytest.raises(qd.QuadrantsRuntimeError, match=r"kernel 'oob2'.*out-of-bounds.*axis 1") as info:
        oob2(5)
    assert "test_cuda_runtime.py:" in str(info.value)  # the location of the task's loop
    oob2(4)  # the error word was cleared: a correct call passes
    np.testing.assert_array_equal(f.to_numpy(), np.arange(16).reshape(4, 4))


def test_debug_checks_are_off_in_release(rng):
    @qd.kernel
    def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
        for i in range(a.shape[0]):
            a[i] = a[i] * s

    data = rng.uniform(-1, 1, 256).astype(np.float32)
    a = data.copy()
    scale(a, 3.0)
    _close_f32(a, data.astype(np.float64) * 3.0)
    plan = scale.backend().plan_for((a, 3.0))
    assert plan.error_words == []  # release kernels record nothing and the launcher never syncs
    qd.init(arch=qd.cuda, debug=True)
    try:
        plan = scale.backend().plan_for((a, 3.0))
        assert len(plan.error_words) == 1
        scale(a, 2.0)
        _close_f32(a, data.astype(np.float64) * 6.0, ops=2)
    finally:
        qd.init(arch=qd.cuda)


class _DLPackOnly:
    """An array that offers only the DLPack protocol (like JAX arrays), wrapping a torch tensor."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_dlpack_arrays_in_place(rng):
    torch = pytest.importorskip("torch")
    x0 = rng.uniform(-1, 1, 3000).astype(np.float32)
    y0 = rng.uniform(-1, 1, 3000).astype(np.float32)
    x, y = torch.from_numpy(x0).cuda(), torch.from_numpy(y0.copy()).cuda()
    axpy(_DLPackOnly(x), _DLPackOnly(y), 0.5)
    _close_f32(y.cpu().numpy(), 0.5 * x0.astype(np.float64) + y0)
    # a strided DLPack view: every other element of a 2-D tensor's rows
    m = torch.from_numpy(rng.uniform(-1, 1, (40, 50)).astype(np.float32)).cuda()
    col = m[:, ::2]
    before = m.cpu().numpy().copy()

    @qd.kernel
    def double(a: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i, j in qd.ndrange(a.shape[0], a.shape[1]):
            a[i, j] = a[i, j] * 2.0

    double(_DLPackOnly(col))
    ref = before.copy()
    ref[:, ::2] *= 2.0
    np.testing.assert_array_equal(m.cpu().numpy(), ref)


def test_dlpack_host_array_is_our_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(qd.QuadrantsTypeError, match="DLPack array on device type 1"):
        axpy(_DLPackOnly(torch.zeros(8)), _DLPackOnly(torch.zeros(8)), 1.0)


def test_block_size_from_occupancy(rng):
    from qd_numba.targets.cuda.runtime import CudaRuntime

    x = rng.uniform(-1, 1, 100_000).astype(np.float32)
    y = rng.uniform(-1, 1, 100_000).astype(np.float32)
    ref = 1.5 * x.astype(np.float64) + y
    axpy(x, y, 1.5)
    _close_f32(y, ref)
    (launch,) = axpy.backend().plan_for((x, y, 1.5)).launches
    rt = CudaRuntime.get()
    assert launch.block % 32 == 0 and 32 <= launch.block <= 1024
    assert launch.grid * launch.block <= rt.max_threads  # never more threads than RNG states
    assert launch.grid >= rt.sm_count  # saturating: at least one block per SM


def test_loops_under_runtime_control_flow_run_serially(rng):
    @qd.kernel
    def rounds_then_shift(a: qd.types.ndarray(dtype=qd.f64, ndim=1), rounds: qd.i32, c: qd.f64):
        r = 0
        while r < rounds:                  # a top-level while: its loop runs on one thread
            for i in range(a.shape[0]):
                a[i] = a[i] * 0.5 + 1.0
            r += 1
        if c > 0:                          # a runtime if: likewise
            for i in range(a.shape[0]):
                a[i] = a[i] * c
        for i in range(a.shape[0]):        # unconditional: a grid-stride task
            a[i] = a[i] + 3.0

    data = rng.uniform(-1, 1, 5000)
    for rounds, c in ((3, 2.0), (0, -1.0)):
        a = data.copy()
        ref = data.copy()
        for _ in range(rounds):
            ref = ref * 0.5 + 1.0
        if c > 0:
            ref = ref * c
        rounds_then_shift(a, rounds, c)
        np.testing.assert_allclose(a, ref + 3.0, rtol=1e-12)
    kinds = [t.kind for t in rounds_then_shift.tasks(data.copy(), 1, 1.0)]
    assert kinds == ["serial", "range_for"]


def test_zero_dimensional_ndarrays(rng):
    """0-d qd.ndarrays and numpy arrays as kernel arguments (typed from a 0-d stand-in, read and
    written in place)."""
    @qd.kernel
    def scale(x: qd.types.ndarray(dtype=qd.f64, ndim=1), s: qd.types.ndarray(dtype=qd.f64, ndim=0),
              n: qd.types.ndarray(dtype=qd.i32, ndim=0)):
        for i in range(x.shape[0]):
            x[i] = x[i] * s[()]
        n[()] = n[()] - 1

    x0, s0 = rng.standard_normal(40), rng.uniform(0.5, 2.0)
    x, s, n = qd.ndarray(qd.f64, 40), qd.ndarray(qd.f64, ()), np.array(5, np.int32)
    x.from_numpy(x0)
    s.from_numpy(np.array(s0))
    scale(x, s, n)
    np.testing.assert_allclose(x.to_numpy(), x0 * s0, rtol=1e-15)
    assert n[()] == 4 and s.to_numpy().shape == ()


def test_parameters_named_like_the_call_paths_names(rng):
    """The generated ``__call__`` and ``call`` share one source (make_caller): parameters named
    ``call``, ``caller``, ``plans``, ``kernel`` or ``build`` are the kernel's arguments, not the
    call path's own objects; passed by keyword and position alike."""
    @qd.kernel
    def named(call: qd.types.ndarray(dtype=qd.f32, ndim=1), caller: qd.f32, plans: qd.i32,
              kernel: qd.types.ndarray(dtype=qd.f32, ndim=1), build: qd.f32 = 0.5):
        for i in range(call.shape[0]):
            kernel[i] = call[i] * caller + plans + build

    x = rng.uniform(-1, 1, 257).astype(np.float32)
    out = np.zeros(257, np.float32)
    named(x, np.float32(1.5), 3, out)
    _close_f32(out, x.astype(np.float64) * 1.5 + 3.5, ops=2)
    named(call=x, caller=np.float32(-2.0), plans=-1, kernel=out, build=0.25)
    _close_f32(out, x.astype(np.float64) * -2.0 - 0.75, ops=2)
    with pytest.raises(TypeError):
        named(x, np.float32(1.0))
