"""``@qd.real_func`` taking fields (``qd.template()``) and ndarrays (``qd.types.ndarray(...)``) as
Quadrants does: passed by reference (the function's writes are the caller's data), compiled once
per type of the data arguments, recursion and real-to-real calls included; every kernel also
compiles to a CUDA cubin (conftest). Against numpy on random data."""

import numpy as np
import pytest

import qd_numba as qd

N = 24
values = qd.field(qd.f32, shape=N)
counts = qd.field(qd.i32, shape=N)
pairs = qd.Vector.field(2, qd.f64, shape=N)


@qd.real_func
def scale_and_get(f: qd.template(), i: qd.i32, k: qd.f32) -> qd.f32:
    old = f[i]
    f[i] = old * k
    return old


@qd.real_func
def fill_row(a: qd.types.ndarray(dtype=qd.f64, ndim=2), i: qd.i32, start: qd.f64):
    for j in range(a.shape[1]):
        a[i, j] = start + j


@qd.real_func
def prefix_sum(a: qd.types.ndarray(dtype=qd.i32, ndim=1), n: qd.i32) -> qd.i32:
    """Sum of a[0..n), by recursion over the ndarray."""
    if n == 0:
        return 0
    return a[n - 1] + prefix_sum(a, n - 1)


@qd.real_func
def swap_pair(p: qd.template(), i: qd.i32):
    v = p[i]
    p[i] = qd.Vector([v[1], v[0]])


@qd.real_func
def through(f: qd.template(), i: qd.i32) -> qd.f32:
    return scale_and_get(f, i, 1.0) + 0.5     # a real function passing its field on


@qd.kernel
def use_data(a: qd.types.ndarray(dtype=qd.f64, ndim=2), ints: qd.types.ndarray(dtype=qd.i32, ndim=1),
             olds: qd.types.ndarray(dtype=qd.f32, ndim=1), sums: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(N):
        olds[i] = scale_and_get(values, i, 3.0)
        fill_row(a, i, i * 10.0)
        sums[i] = prefix_sum(ints, i + 1)
        swap_pair(pairs, i)
        counts[i] = qd.i32(through(values, i))


@pytest.fixture
def device_stack(arch):
    """prefix_sum recurses 24 calls deep with ndarray arguments: more than the driver's default
    1 KiB of stack per GPU thread (an illegal address on the device). As in Quadrants, the user
    sets ``cuda_stack_limit``; applied here as ``qd.init`` does, without releasing the fields."""
    if arch != "cuda":
        yield
        return
    from qd_numba import config
    from qd_numba.targets.base import target_for

    saved = config.current.cuda_stack_limit
    config.current.cuda_stack_limit = 16 * 1024
    target_for(config.current.arch).configure(config.current)
    yield
    config.current.cuda_stack_limit = saved


def test_real_func_reads_and_writes_fields_and_ndarrays(rng, device_stack):
    v = rng.uniform(-5, 5, N).astype(np.float32)
    p = rng.normal(size=(N, 2))
    ints = rng.integers(-100, 100, N).astype(np.int32)
    values.from_numpy(v)
    pairs.from_numpy(p)
    a = rng.normal(size=(N, 3))
    olds, sums = np.zeros(N, np.float32), np.zeros(N, np.int32)
    use_data(a, ints, olds, sums)
    np.testing.assert_array_equal(olds, v)
    np.testing.assert_allclose(values.to_numpy(), v * np.float32(3), rtol=1e-6)
    np.testing.assert_array_equal(a, np.arange(N)[:, None] * 10.0 + np.arange(3))
    np.testing.assert_array_equal(sums, np.cumsum(ints))
    np.testing.assert_array_equal(pairs.to_numpy(), p[:, ::-1])
    np.testing.assert_array_equal(counts.to_numpy(), np.trunc(v * np.float32(3) + np.float32(0.5)).astype(np.int32))


other = qd.field(qd.f64, shape=N)


@qd.kernel
def two_field_types():
    for i in range(N):
        scale_and_get(values, i, 2.0)
        scale_and_get(other, i, 0.5)


def test_one_function_many_field_types(rng):
    v, o = rng.uniform(-5, 5, N).astype(np.float32), rng.uniform(-5, 5, N)
    values.from_numpy(v)
    other.from_numpy(o)
    two_field_types()
    np.testing.assert_allclose(values.to_numpy(), v * 2, rtol=1e-6)
    np.testing.assert_allclose(other.to_numpy(), o * 0.5, rtol=1e-12)


@qd.kernel
def wrong_dtype(a: qd.types.ndarray(dtype=qd.f32, ndim=2)):
    for i in range(N):
        fill_row(a, i, 1.0)


@qd.kernel
def scalar_for_field(n: qd.i32):
    for i in range(N):
        scale_and_get(n, i, 1.0)


def test_wrong_data_argument_is_our_error():
    with pytest.raises(qd.QuadrantsTypeError) as info:
        wrong_dtype(np.zeros((N, 3), np.float32))
    text = str(info.value)
    for fragment in ("kernel 'wrong_dtype'", "qd.real_func 'fill_row', argument 'a': expected dtype float64, got "
                     "float32", "fill_row(a, i, 1.0)"):
        assert fragment in text, text
    with pytest.raises(qd.QuadrantsTypeError) as info:
        scalar_for_field(3)
    text = str(info.value)
    for fragment in ("kernel 'scalar_for_field'", "argument 'f': expected a field or ndarray, got int32",
                     "scale_and_get(n, i, 1.0)"):
        assert fragment in text, text


def test_unannotated_data_parameter_is_still_an_error():
    with pytest.raises(qd.QuadrantsSyntaxError, match=r"real_func '.*bad'.*parameter 'f'.*qd.template\(\)"):
        @qd.real_func
        def bad(f, i: qd.i32):
            f[i] = 0


@pytest.mark.cuda
def test_real_func_with_data_on_cuda(rng):
    qd.init(arch=qd.cuda)
    try:
        field = qd.field(qd.f32, shape=N)

        @qd.kernel
        def on_gpu(a: qd.types.ndarray(dtype=qd.f64, ndim=2), olds: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(N):
                olds[i] = scale_and_get(field, i, 3.0)
                fill_row(a, i, i * 10.0)

        v = rng.uniform(-5, 5, N).astype(np.float32)
        field.from_numpy(v)
        a, olds = np.zeros((N, 4)), np.zeros(N, np.float32)
        on_gpu(a, olds)
        np.testing.assert_array_equal(olds, v)
        np.testing.assert_allclose(field.to_numpy(), v * np.float32(3), rtol=1e-6)
        np.testing.assert_array_equal(a, np.arange(N)[:, None] * 10.0 + np.arange(4))
    finally:
        qd.init()
