"""Every error path raises a qd_numba exception (a QuadrantsError subclass) whose message names the
kernel and, for argument errors, the argument. Argument errors are raised at the call, before any work."""

import numba
import numpy as np
import pytest

import qd_numba as qd

RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _reset_config():
    qd.init()
    yield
    qd.init()


def make_fill():
    @qd.kernel
    def fill(a: qd.types.ndarray(dtype=qd.f32, ndim=1), v: qd.f32):
        for i in range(a.shape[0]):
            a[i] = a[i] * 2.0 + v

    return fill


def make_fill_int():
    @qd.kernel
    def fill_int(a: qd.types.ndarray(dtype=qd.i32, ndim=1), v: qd.i32):
        for i in range(a.shape[0]):
            a[i] = v

    return fill_int


def test_all_errors_are_quadrants_errors():
    for exc in (qd.QuadrantsTypeError, qd.QuadrantsSyntaxError, qd.QuadrantsIndexError,
                qd.QuadrantsRuntimeError, qd.QuadrantsNameError,
                qd.QuadrantsCompilationError, qd.QuadrantsAssertionError):
        assert issubclass(exc, qd.QuadrantsError)
    assert issubclass(qd.QuadrantsTypeError, TypeError)
    assert issubclass(qd.QuadrantsSyntaxError, SyntaxError)
    assert issubclass(qd.QuadrantsIndexError, IndexError)
    assert issubclass(qd.QuadrantsRuntimeError, RuntimeError)


def test_kernel_runs_and_matches_numpy():
    fill = make_fill()
    x = RNG.standard_normal(1000).astype(np.float32)
    a = x.copy()
    fill(a, 0.5)
    np.testing.assert_allclose(a, x * 2.0 + np.float32(0.5), rtol=1e-6)


# -- argument checks at the call -------------------------------------------------------------------------


@pytest.mark.parametrize("bad, needle", [
    (lambda x: x.astype(np.float64), "dtype"),
    (lambda x: x.reshape(10, 10), "ndim"),
    (lambda x: x.astype(np.int32), "dtype"),
])
def test_bad_ndarray_raises_before_work(bad, needle):
    fill = make_fill()
    x = RNG.standard_normal(100).astype(np.float32)
    arr = bad(x)
    before = arr.copy()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(arr, 1.0)
    msg = str(info.value)
    assert "fill" in msg and "'a'" in msg and needle in msg
    np.testing.assert_array_equal(arr, before)


def test_bad_ndarray_after_compile_raises():
    """The fast path (instance already compiled) must check the arguments too."""
    fill = make_fill()
    good = RNG.standard_normal(8).astype(np.float32)
    fill(good, 1.0)
    bad = np.zeros(8, np.float64)
    with pytest.raises(qd.QuadrantsTypeError, match="fill.*'a'.*dtype"):
        fill(bad, 1.0)
    np.testing.assert_array_equal(bad, 0)


def test_list_for_ndarray():
    fill = make_fill()
    data = [1.0, 2.0, 3.0]
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(data, 1.0)
    msg = str(info.value)
    assert "fill" in msg and "'a'" in msg and "list" in msg
    assert data == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("warm", [False, True])
def test_string_for_scalar(warm):
    fill = make_fill()
    a = RNG.standard_normal(16).astype(np.float32)
    if warm:
        fill(a, 0.0)
    before = a.copy()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(a, "1.0")
    msg = str(info.value)
    assert "fill" in msg and "'v'" in msg and "str" in msg
    np.testing.assert_array_equal(a, before)


@pytest.mark.parametrize("warm", [False, True])
def test_float_for_int_param(warm):
    fill_int = make_fill_int()
    a = np.arange(10, dtype=np.int32)
    if warm:
        fill_int(a, 3)
        np.testing.assert_array_equal(a, 3)
    before = a.copy()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill_int(a, 1.5)
    msg = str(info.value)
    assert "fill_int" in msg and "'v'" in msg
    np.testing.assert_array_equal(a, before)


def test_wrong_number_of_arguments():
    fill = make_fill()
    with pytest.raises(qd.QuadrantsTypeError, match="fill"):
        fill(np.zeros(3, np.float32))


# -- compile-time errors ----------------------------------------------------------------------------------


def test_missing_annotation():
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        @qd.kernel
        def no_annot(a):
            pass
    msg = str(info.value)
    assert "no_annot" in msg and "'a'" in msg and "annotation" in msg


def test_kernel_called_from_kernel():
    fill = make_fill()

    @qd.kernel
    def outer(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        fill(a, 1.0)

    a = np.zeros(4, np.float32)
    with pytest.raises(qd.QuadrantsSyntaxError, match="outer.*fill"):
        outer(a)


def test_kernel_called_from_kernel_leaves_data_untouched():
    """The compile error comes before any work: the array is untouched."""
    fill = make_fill()

    @qd.kernel
    def outer2(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        fill(a, 1.0)

    a = np.zeros(4, np.float32)
    with pytest.raises(qd.QuadrantsSyntaxError, match="outer2.*fill"):
        outer2(a)
    np.testing.assert_array_equal(a, 0)


def test_break_out_of_top_level_loop():
    @qd.kernel
    def brk(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            if i > 2:
                break
            a[i] = 1.0

    a = np.zeros(8, np.float32)
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        brk(a)
    msg = str(info.value)
    assert "brk" in msg and "break" in msg
    np.testing.assert_array_equal(a, 0)


def test_break_in_inner_loop_is_fine():
    @qd.kernel
    def inner_break(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(a.shape[0]):
            for j in range(100):
                if j >= i:
                    break
                a[i] += 1

    a = np.zeros(20, np.int32)
    inner_break(a)
    np.testing.assert_array_equal(a, np.arange(20))


def test_local_assigned_in_parallel_loop_read_after():
    @qd.kernel
    def leak(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        x = 0.0
        for i in range(a.shape[0]):
            x = a[i]
        a[0] = x

    a = np.ones(4, np.float32)
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        leak(a)
    msg = str(info.value)
    assert "leak" in msg and "'x'" in msg
    np.testing.assert_array_equal(a, 1)


def test_field_indexed_with_too_few_indices():
    f = qd.field(qd.f32, shape=(3, 3))

    @qd.kernel
    def one_index():
        for i in range(3):
            f[i] = 1.0

    with pytest.raises(qd.QuadrantsIndexError) as info:
        one_index()
    assert "2" in str(info.value) and "1" in str(info.value)
    np.testing.assert_array_equal(f.to_numpy(), 0)


def test_field_index_error_names_kernel():
    f = qd.field(qd.f32, shape=(3, 3))

    @qd.kernel
    def one_index_named():
        for i in range(3):
            f[i] = 1.0

    with pytest.raises(qd.QuadrantsIndexError, match="one_index_named") as info:
        one_index_named()
    assert "f[i] = 1.0" in str(info.value)  # the source line of the bad access


def test_write_to_readonly_array():
    fill = make_fill()
    a = RNG.standard_normal(8).astype(np.float32)
    a.flags.writeable = False
    before = a.copy()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(a, 1.0)
    assert "fill" in str(info.value)
    np.testing.assert_array_equal(a, before)


def test_write_to_readonly_array_message():
    fill = make_fill()
    a = np.zeros(8, np.float32)
    a.flags.writeable = False
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(a, 1.0)
    msg = str(info.value)
    assert "'a'" in msg and "read-only" in msg and "launch_range" not in msg


def _readonly_writers():
    @qd.func
    def store(arr, i, v):
        arr[i] = v

    @qd.kernel
    def atomic_into(src: qd.types.ndarray(dtype=qd.f32, ndim=1), acc: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(src.shape[0]):
            acc[0] += src[i]

    @qd.kernel
    def through_func(src: qd.types.ndarray(dtype=qd.f32, ndim=1), acc: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(src.shape[0]):
            store(acc, i, src[i])

    @numba.njit
    def njit_store(arr, i, v):
        arr[i] = v

    @qd.kernel
    def through_njit(src: qd.types.ndarray(dtype=qd.f32, ndim=1), acc: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(src.shape[0]):
            njit_store(acc, i, src[i])

    @qd.kernel
    def vector_store(src: qd.types.ndarray(dtype=qd.f32, ndim=1),
                     acc: qd.types.ndarray(dtype=qd.types.vector(3, qd.f32), ndim=1)):
        for i in range(src.shape[0]):
            acc[i] = qd.Vector([src[i], 0.0, 1.0])

    return {"atomic": (atomic_into, 1), "func": (through_func, 1), "njit": (through_njit, 1),
            "vector": (vector_store, 3)}


@pytest.mark.parametrize("which", ["atomic", "func", "njit", "vector"])
def test_write_to_readonly_array_every_path(which):
    kern, ncomp = _readonly_writers()[which]
    src = RNG.standard_normal(16).astype(np.float32)
    acc = RNG.standard_normal((16, 3) if ncomp == 3 else 16).astype(np.float32)
    acc.flags.writeable = False
    before = acc.copy()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        kern(src, acc)
    msg = str(info.value)
    assert kern.name in msg and "'acc'" in msg and "read-only" in msg
    np.testing.assert_array_equal(acc, before)
    # the same kernel with a writable array runs (the read-only one was the only problem)
    writable = before.copy()
    kern(src, writable)
    if which == "atomic":
        np.testing.assert_allclose(writable[0], before[0] + src.sum(dtype=np.float64), rtol=1e-4)
    elif which == "vector":
        np.testing.assert_allclose(writable, np.stack([src, np.zeros(16), np.ones(16)], axis=1), rtol=1e-6)
    else:
        np.testing.assert_allclose(writable, src, rtol=1e-6)


def test_readonly_array_can_be_read():
    @qd.kernel
    def copy(src: qd.types.ndarray(dtype=qd.f32, ndim=1), dst: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(src.shape[0]):
            dst[i] = src[i] + 1.0

    src = RNG.standard_normal(64).astype(np.float32)
    src.flags.writeable = False
    dst = np.zeros_like(src)
    copy(src, dst)
    np.testing.assert_allclose(dst, src + 1.0, rtol=1e-6)


def test_static_of_runtime_value():
    @qd.kernel
    def bad_static(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
        for i in range(qd.static(n)):
            a[i] = 1.0

    a = np.zeros(4, np.float32)
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        bad_static(a, 2)
    msg = str(info.value)
    assert "bad_static" in msg and "qd.static" in msg
    np.testing.assert_array_equal(a, 0)


def test_recursive_func():
    @qd.func
    def rec(x):
        return rec(x - 1) if x > 0 else 0

    @qd.kernel
    def use_rec(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = rec(i)

    a = np.zeros(4, np.float32)
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        use_rec(a)
    msg = str(info.value)
    assert "use_rec" in msg and "recursive" in msg and "rec" in msg


def test_func_called_from_python():
    @qd.func
    def helper(x):
        return x + 1

    with pytest.raises(qd.QuadrantsSyntaxError, match="helper"):
        helper(1)


@pytest.mark.skipif(__import__("qd_numba.targets.cuda_compile", fromlist=["x"]).cuda_available(),
                    reason="a GPU is present")
def test_init_cuda_without_gpu():
    with pytest.raises(qd.QuadrantsRuntimeError, match="cuda"):
        qd.init(arch=qd.cuda)
    # the failed init leaves the CPU backend usable
    qd.init()
    fill = make_fill()
    a = np.zeros(4, np.float32)
    fill(a, 1.0)
    np.testing.assert_array_equal(a, 1)


def test_init_unknown_arch():
    with pytest.raises(qd.QuadrantsRuntimeError):
        qd.init(arch="tpu")


# -- debug mode --------------------------------------------------------------------------------------------


def test_debug_ndarray_out_of_bounds():
    qd.init(debug=True)

    @qd.kernel
    def oob(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
        for i in range(n):
            a[i] = 1.0

    buf = np.zeros(16, np.float32)
    a = buf[:4]
    with pytest.raises(qd.QuadrantsRuntimeError) as info:
        oob(a, 8)
    assert "oob" in str(info.value) and "out-of-bounds" in str(info.value)
    np.testing.assert_array_equal(buf[4:], 0)  # nothing written past the end
    oob(a, 4)  # in-bounds works in debug mode
    np.testing.assert_array_equal(a, 1)


def test_debug_field_out_of_bounds():
    qd.init(debug=True)
    f = qd.field(qd.f32, shape=4)

    @qd.kernel
    def oob_field(n: qd.i32):
        for i in range(n):
            f[i] = 1.0

    with pytest.raises(qd.QuadrantsRuntimeError, match="oob_field"):
        oob_field(8)


def test_debug_2d_field_out_of_bounds_on_second_axis():
    qd.init(debug=True)
    f = qd.field(qd.i32, shape=(4, 4))

    @qd.kernel
    def oob2(m: qd.i32):
        for i, j in qd.ndrange(4, m):
            f[i, j] = 1

    with pytest.raises(qd.QuadrantsRuntimeError, match="oob2"):
        oob2(5)
    oob2(4)
    np.testing.assert_array_equal(f.to_numpy(), 1)


def test_reinit_turns_debug_off():
    qd.init(debug=True)
    qd.init()
    from qd_numba import config

    assert config.current.debug is False


def test_init_recompiles_kernels_for_the_new_config(rng):
    @qd.kernel
    def poke(a: qd.types.ndarray(dtype=qd.f32, ndim=1), k: qd.i32):
        for i in range(1):
            a[k + i] = 1.0

    buf = rng.uniform(-1, 1, 8).astype(np.float32)
    poke(buf[:4], 2)  # compiled without bounds checks
    assert buf[2] == 1.0
    qd.init(debug=True)  # a new configuration: the kernel compiles again, with checks
    try:
        before = buf.copy()
        with pytest.raises(qd.QuadrantsRuntimeError, match="poke"):
            poke(buf[:4], 4)
        np.testing.assert_array_equal(buf, before)
    finally:
        qd.init()


def test_keyword_arguments_defaults_and_bad_calls(rng):
    @qd.kernel
    def axpby(x: qd.types.ndarray(dtype=qd.f64, ndim=1), y: qd.types.ndarray(dtype=qd.f64, ndim=1),
              a: qd.f64, b: qd.f64 = 1.0):
        for i in range(x.shape[0]):
            y[i] = a * x[i] + b * y[i]

    x, y0 = rng.standard_normal(20), rng.standard_normal(20)
    for call, (a, b) in ((lambda y: axpby(x, y, 2.0), (2.0, 1.0)),             # default b
                         (lambda y: axpby(x, y, b=0.5, a=3.0), (3.0, 0.5)),     # keywords, any order
                         (lambda y: axpby(y=y, x=x, a=-1.0), (-1.0, 1.0))):     # all by keyword
        y = y0.copy()
        call(y)
        np.testing.assert_allclose(y, a * x + b * y0, rtol=1e-12)
    for bad, what in ((lambda: axpby(x, y0), "missing a required argument: 'a'"),
                      (lambda: axpby(x, y0, 1.0, 2.0, 3.0), "too many positional arguments"),
                      (lambda: axpby(x, y0, 1.0, c=2.0), "unexpected keyword argument 'c'"),
                      (lambda: axpby(x, a=1.0), "missing a required argument: 'y'")):
        with pytest.raises(qd.QuadrantsTypeError, match=rf"kernel 'axpby'.*{what}"):
            bad()
