"""Fields and ndarrays: python-scope access, kernel parameters, templates, returns."""


import numpy as np
import pytest

import qd_numba as qd

DTYPES = [(qd.i32, np.int32), (qd.i64, np.int64), (qd.u8, np.uint8),
          (qd.f32, np.float32), (qd.f64, np.float64)]


def rand(rng, shape, npdt):
    if np.issubdtype(npdt, np.integer):
        info = np.iinfo(npdt)
        lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
        return rng.integers(lo, hi, size=shape, endpoint=False).astype(npdt)
    return rng.uniform(-10, 10, size=shape).astype(npdt)


@pytest.mark.parametrize("qdt,npdt", DTYPES)
@pytest.mark.parametrize("shape", [(), (7,), (4, 5), (2, 3, 4)])
def test_field_python_scope(rng, qdt, npdt, shape):
    x = qd.field(qdt, shape=shape)
    assert x.shape == shape
    assert x.dtype == qdt
    data = rand(rng, shape, npdt)
    x.from_numpy(data)
    out = x.to_numpy()
    assert out.dtype == npdt and out.shape == shape
    np.testing.assert_array_equal(out, data)
    # to_numpy is a copy
    out[...] = 0 if out.ndim == 0 else out
    if shape == ():
        assert x[None] == data.item()
        v = rand(rng, (), npdt).item()
        x[None] = v
        assert x[None] == v
    else:
        idx = tuple(int(rng.integers(0, n)) for n in shape)
        key = idx[0] if len(idx) == 1 else idx
        assert x[key] == data[idx]
        v = rand(rng, (), npdt).item()
        x[key] = v
        data[idx] = v
        np.testing.assert_array_equal(x.to_numpy(), data)
    fv = rand(rng, (), npdt).item()
    x.fill(fv)
    np.testing.assert_array_equal(x.to_numpy(), np.full(shape, fv, dtype=npdt))


def test_needs_grad(rng):
    x = qd.field(qd.f32, shape=(5,), needs_grad=True)
    assert x.grad is not None
    assert x.grad.shape == (5,)
    assert x.grad.dtype == qd.f32
    g = rand(rng, (5,), np.float32)
    x.grad.from_numpy(g)
    np.testing.assert_array_equal(x.grad.to_numpy(), g)
    y = qd.field(qd.f32, shape=(5,))
    assert y.grad is None


# -- kernels over fields of each rank and dtype ------------------------------------------------

@qd.kernel
def affine(src: qd.template(), dst: qd.template(), a: qd.i32):
    for idx in qd.grouped(src):
        dst[idx] = src[idx] * 2 + a


@pytest.mark.parametrize("qdt,npdt", DTYPES)
@pytest.mark.parametrize("shape", [(9,), (3, 4), (2, 3, 4)])
def test_field_kernel_all_ranks(rng, qdt, npdt, shape):
    src = qd.field(qdt, shape=shape)
    dst = qd.field(qdt, shape=shape)
    data = rand(rng, shape, npdt)
    if npdt == np.uint8:
        data = (data % 100).astype(np.uint8)
    src.from_numpy(data)
    affine(src, dst, 3)
    ref = (data * npdt(2) + npdt(3)).astype(npdt)
    if np.issubdtype(npdt, np.floating):
        np.testing.assert_allclose(dst.to_numpy(), ref, rtol=1e-6)
    else:
        np.testing.assert_array_equal(dst.to_numpy(), ref)


z0 = qd.field(qd.f64, shape=())
z1 = qd.field(qd.f64, shape=(16,))


@qd.kernel
def sum_to_scalar():
    for i in range(16):
        z0[None] += z1[i]


def test_rank0_field_in_kernel(rng):
    data = rng.uniform(-1, 1, 16)
    z1.from_numpy(data)
    z0[None] = 1.5
    sum_to_scalar()
    np.testing.assert_allclose(z0[None], 1.5 + data.sum(), rtol=1e-12)


def test_field_element_in_a_condition_is_read_when_the_kernel_runs(rng):
    flag = qd.field(qd.f32, shape=4)
    out = qd.field(qd.i32, shape=())

    @qd.kernel
    def branch():
        out[None] = 0
        for _ in range(4):
            if flag[1] > 0.5:      # not a compile-time value: the field's contents at each call
                qd.atomic_add(out[None], 1)

    values = rng.random(4).astype(np.float32)
    values[1] = 0.25
    flag.from_numpy(values)
    branch()
    assert out[None] == 0
    values[1] = 0.75
    flag.from_numpy(values)
    branch()
    assert out[None] == 4


def test_field_created_after_kernel_ran(rng):
    a = qd.field(qd.f32, shape=(8,))
    b = qd.field(qd.f32, shape=(8,))
    d = rand(rng, (8,), np.float32)
    a.from_numpy(d)
    affine(a, b, 1)
    np.testing.assert_allclose(b.to_numpy(), d * 2 + 1, rtol=1e-6)
    # new fields after compilation & launch
    c = qd.field(qd.f32, shape=(8,))
    e = qd.field(qd.f32, shape=(8,))
    d2 = rand(rng, (8,), np.float32)
    c.from_numpy(d2)
    affine(c, e, -4)
    np.testing.assert_allclose(e.to_numpy(), d2 * 2 - 4, rtol=1e-6)
    # the original instance still works on the original fields
    a.from_numpy(d2)
    affine(a, b, 0)
    np.testing.assert_allclose(b.to_numpy(), d2 * 2, rtol=1e-6)


# -- ndarray parameters -------------------------------------------------------------------------

@qd.kernel
def nd_scale(a: qd.types.ndarray(dtype=qd.f32, ndim=2), s: qd.f32):
    for i, j in a:
        a[i, j] = a[i, j] * s + i - j


@qd.kernel
def nd_copy1(src: qd.types.NDArray[qd.f32, 1], dst: qd.types.NDArray[qd.f32, 1]):
    for i in range(src.shape[0]):
        dst[i] = src[i] * src[i]


def test_numpy_array_in_place(rng):
    a = rng.uniform(-5, 5, (6, 7)).astype(np.float32)
    ref = a * np.float32(1.5) + (np.arange(6)[:, None] - np.arange(7)[None, :]).astype(np.float32)
    alias = a
    nd_scale(a, 1.5)
    assert alias is a
    np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-5)


def test_qd_ndarray_param(rng):
    a = qd.ndarray(qd.f32, (6, 7))
    d = rng.uniform(-5, 5, (6, 7)).astype(np.float32)
    a.from_numpy(d)
    nd_scale(a, -2.0)
    ref = d * np.float32(-2) + (np.arange(6)[:, None] - np.arange(7)[None, :]).astype(np.float32)
    np.testing.assert_allclose(a.to_numpy(), ref, rtol=1e-5, atol=1e-5)
    assert a.shape == (6, 7) and a.dtype == qd.f32


def test_ndarray_alias_annotation(rng):
    src = rng.uniform(-3, 3, 11).astype(np.float32)
    dst = np.zeros(11, np.float32)
    nd_copy1(src, dst)
    np.testing.assert_allclose(dst, src * src, rtol=1e-6)
    # and with qd.ndarray arguments of a different length
    s2, d2 = qd.ndarray(qd.f32, (5,)), qd.ndarray(qd.f32, (5,))
    v = rng.uniform(-3, 3, 5).astype(np.float32)
    s2.from_numpy(v)
    nd_copy1(s2, d2)
    np.testing.assert_allclose(d2.to_numpy(), v * v, rtol=1e-6)


def test_ndarray_python_scope(rng):
    a = qd.ndarray(qd.i64, (3, 4))
    d = rng.integers(-100, 100, (3, 4))
    a.from_numpy(d)
    assert a[1, 2] == d[1, 2]
    a[2, 3] = 77
    d[2, 3] = 77
    np.testing.assert_array_equal(a.to_numpy(), d)


# -- scalar params and return ----------------------------------------------------------------

acc = qd.field(qd.f32, shape=())


@qd.kernel
def dot(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    acc[None] = 0.0
    for i in range(a.shape[0]):
        acc[None] += a[i] * b[i]
    return acc[None]


@qd.kernel
def last_local(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    s = 0.0
    for i in range(a.shape[0]):
        s = a[i]
    return s


@qd.kernel
def poly(x: qd.f64, n: qd.i32) -> qd.f64:
    r = 0.0
    p = 1.0
    for _ in range(1):
        pass
    k = 0
    while k < n:
        r += p
        p *= x
        k += 1
    return r


def test_scalar_return_serial(rng):
    x = float(rng.uniform(-0.9, 0.9))
    n = int(rng.integers(3, 10))
    assert np.isclose(poly(x, n), sum(x**k for k in range(n)), rtol=1e-12)


def test_scalar_return_reduction(rng):
    a = rng.uniform(-1, 1, 20).astype(np.float32)
    b = rng.uniform(-1, 1, 20).astype(np.float32)
    np.testing.assert_allclose(dot(a, b), np.dot(a, b), rtol=1e-4, atol=1e-5)


def test_local_assigned_in_loop_rejected():
    # documented: a local assigned inside a parallel loop and read after it is an error (a
    # kernel-scope reduction, updated only with += / qd.atomic_*, is not: tests/test_reductions.py)
    with pytest.raises(qd.QuadrantsSyntaxError, match="parallel"):
        last_local(np.ones(4, np.float32))


# -- template params -------------------------------------------------------------------------

@qd.kernel
def add_const(x: qd.template(), c: qd.template()):
    for i in x:
        x[i] += c


def test_template_int_instances(rng):
    x = qd.field(qd.i32, shape=(10,))
    d = rng.integers(-50, 50, 10).astype(np.int32)
    x.from_numpy(d)
    before = add_const.compile_count
    add_const(x, 3)
    add_const(x, 3)
    assert add_const.compile_count == before + 1
    add_const(x, 5)
    assert add_const.compile_count == before + 2
    add_const(x, 3)
    assert add_const.compile_count == before + 2
    y = qd.field(qd.i32, shape=(10,))
    y.from_numpy(d)
    add_const(y, 3)
    assert add_const.compile_count == before + 3
    np.testing.assert_array_equal(x.to_numpy(), d + 14)
    np.testing.assert_array_equal(y.to_numpy(), d + 3)
