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
                qd.QuadrantsCompilationError, qd.QuadrantsAssertionError, qd.QuadrantsConfigError):
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
    """A float for an integer parameter is cast (truncated, issue 14); one that cannot be is our
    error, before anything runs."""
    fill_int = make_fill_int()
    a = np.arange(10, dtype=np.int32)
    if warm:
        fill_int(a, 3)
        np.testing.assert_array_equal(a, 3)
    fill_int(a, -7.75)
    np.testing.assert_array_equal(a, -7)
    before = a.copy()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill_int(a, float("inf"))
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


@pytest.mark.skipif(__import__("qd_numba.targets.cuda.compile", fromlist=["x"]).cuda_available(),
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


# -- first-hour mistakes: each message says what to write instead --------------------------------------


def _no_keyerror_chain(exc):
    """Neither a chained KeyError (the call path's cache miss) nor Numba's exception shows."""
    import traceback

    shown = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert not isinstance(exc.__context__, KeyError), shown
    assert "During handling of the above exception" not in shown and "KeyError" not in shown, shown


def _plain_python_helper(x):
    return x * 3.0 + 1.0


def _bad_calls():
    """(name, call, expected error) for mistakes caught at the argument check and at compile time."""

    @qd.kernel
    def needs_helper(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = _plain_python_helper(a[i])

    fill = make_fill()
    return [("dtype", lambda a: fill(a.astype(np.float64), 1.0), qd.QuadrantsTypeError),
            ("helper", lambda a: needs_helper(a), qd.QuadrantsTypeError),
            ("field", lambda a: fill(qd.field(qd.f32, shape=4), 1.0), qd.QuadrantsTypeError)]


@pytest.mark.parametrize("which", ["dtype", "helper", "field"])
def test_errors_do_not_chain_the_cache_miss(which, rng):
    """The call path looks the compiled instance up and handles the miss; errors raised then
    (argument checks, compilation) carry no KeyError context, on the first and on later calls."""
    (name, call, exc_type), = [c for c in _bad_calls() if c[0] == which]
    a = rng.standard_normal(8).astype(np.float32)
    for _ in range(2):
        with pytest.raises(exc_type) as info:
            call(a)
        _no_keyerror_chain(info.value)


def test_errors_do_not_chain_the_cache_miss_after_a_good_call(rng):
    fill = make_fill()
    x = rng.standard_normal(8).astype(np.float32)
    a = x.copy()
    fill(a, 0.5)  # compiled: the next call with other types misses the cache
    np.testing.assert_allclose(a, x * 2.0 + np.float32(0.5), rtol=1e-6)
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(x.astype(np.float64), 1.0)
    _no_keyerror_chain(info.value)
    assert info.value.__context__ is None


def test_plain_python_function_in_kernel(rng):
    @qd.kernel
    def uses_plain(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = _plain_python_helper(a[i])

    a = rng.standard_normal(8).astype(np.float32)
    before = a.copy()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        uses_plain(a)
    msg = str(info.value)
    assert "uses_plain" in msg and "'_plain_python_helper'" in msg
    assert "@qd.func" in msg and "@numba.njit" in msg
    assert "a[i] = _plain_python_helper(a[i])" in msg  # the source line
    assert "NameError" not in msg
    np.testing.assert_array_equal(a, before)

    # decorated, the same function works
    jitted = numba.njit(_plain_python_helper)

    @qd.kernel
    def uses_njit(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = jitted(a[i])

    uses_njit(a)
    np.testing.assert_allclose(a, before * 3.0 + 1.0, rtol=1e-6)


def test_python_function_registered_with_numba_is_callable(rng):
    """A plain function that Numba knows (register_jitable / overload) is not rejected."""
    from numba.extending import register_jitable

    @register_jitable
    def cube(x):
        return x * x * x

    @qd.kernel
    def cubes(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = cube(a[i])

    x = rng.standard_normal(16)
    a = x.copy()
    cubes(a)
    np.testing.assert_allclose(a, x ** 3, rtol=1e-12)


def test_undefined_name():
    @qd.kernel
    def typo(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = undefined_scale * a[i]  # noqa: F821

    a = np.ones(4, np.float32)
    with pytest.raises(NameError) as info:  # a QuadrantsNameError is also a NameError
        typo(a)
    assert isinstance(info.value, qd.QuadrantsNameError)
    msg = str(info.value)
    assert "typo" in msg and "'undefined_scale'" in msg and "a[i] = undefined_scale * a[i]" in msg
    _no_keyerror_chain(info.value)


def test_undefined_name_on_the_dead_side_of_static_if(rng):
    @qd.kernel
    def guarded(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            if qd.static(False):
                a[i] = not_defined_anywhere(a[i])  # noqa: F821
            else:
                a[i] = a[i] + 1.0

    x = rng.standard_normal(8).astype(np.float32)
    a = x.copy()
    guarded(a)
    np.testing.assert_allclose(a, x + 1.0, rtol=1e-6)


def test_missing_module_attribute():
    @qd.kernel
    def misspelt(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = qd.sinn(a[i])

    with pytest.raises(qd.QuadrantsNameError) as info:
        misspelt(np.ones(4, np.float32))
    msg = str(info.value)
    assert "misspelt" in msg and "'sinn'" in msg and "qd.sinn(a[i])" in msg


def test_zero_d_field_without_none(rng):
    globals()["TOTAL_0D"] = total = qd.field(qd.f32, shape=())  # a global, as in user code
    try:
        @qd.kernel
        def accumulate(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                TOTAL_0D += a[i]  # noqa: F821, F841

        a = rng.standard_normal(32).astype(np.float32)
        with pytest.raises(qd.QuadrantsNameError) as info:
            accumulate(a)
        msg = str(info.value)
        assert "accumulate" in msg and "TOTAL_0D[None] +=" in msg and "0-d field" in msg
        assert "TOTAL_0D += a[i]" in msg  # the source line
        assert "failed to analyze the bytecode" not in msg

        @qd.kernel
        def accumulate_ok(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                TOTAL_0D[None] += a[i]  # noqa: F821

        accumulate_ok(a)
        np.testing.assert_allclose(total[None], a.sum(dtype=np.float64), rtol=1e-5)
    finally:
        del globals()["TOTAL_0D"]


def test_zero_d_field_read_without_none(rng):
    scale = qd.field(qd.f32, shape=())
    scale[None] = 2.5

    @qd.kernel
    def scaled(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = scale * a[i]

    a = rng.standard_normal(8).astype(np.float32)
    with pytest.raises(qd.QuadrantsTypeError) as info:
        scaled(a)
    msg = str(info.value)
    assert "scaled" in msg and "x[None]" in msg and "a[i] = scale * a[i]" in msg
    assert "Failed in nopython mode" not in msg and "During:" not in msg


def test_local_zero_d_field_assigned_without_none():
    """A field of an enclosing function: the frontend cannot see it, the hint still says [None]."""
    counter = qd.field(qd.i32, shape=())

    @qd.kernel
    def count(n: qd.i32):
        for _ in range(n):
            counter += 1  # noqa: F823, F841

    with pytest.raises(qd.QuadrantsNameError, match=r"counter\[None\] \+="):
        count(4)


@pytest.mark.parametrize("given", ["field", "dict", "object", "str"])
def test_unsupported_object_for_ndarray_parameter(given, arch, rng):
    fill = make_fill()
    value = {"field": qd.field(qd.f32, shape=8), "dict": {"a": 1}, "object": object(), "str": "abc"}[given]
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(value, 1.0)
    msg = str(info.value)
    assert "fill" in msg and "'a'" in msg and "numpy" in msg and "qd.ndarray" in msg
    assert type(value).__name__ in msg or repr(value) in msg
    if given == "field" and arch == "cpu":
        assert "qd.template()" in msg


def test_field_through_template_parameter(rng):
    f = qd.field(qd.f32, shape=8)
    x = rng.standard_normal(8).astype(np.float32)
    f.from_numpy(x)

    @qd.kernel
    def double(t: qd.template()):
        for i in t:
            t[i] = t[i] * 2.0

    double(f)
    np.testing.assert_allclose(f.to_numpy(), x * 2.0, rtol=1e-6)


def test_dtype_mismatch_says_how_to_convert():
    fill = make_fill()
    with pytest.raises(qd.QuadrantsTypeError) as info:
        fill(np.zeros(4), 1.0)
    assert ".astype(np.float32)" in str(info.value) and "float64" in str(info.value)
    fill_int = make_fill_int()
    with pytest.raises(qd.QuadrantsTypeError, match=r"\.astype\(np\.int32\)"):
        fill_int(np.zeros(4, np.int64), 1)


def test_global_list_at_constant_index_warns_once(rng):
    weights = [0.5, 2.0, -1.0]

    @qd.kernel
    def weighted(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = a[i] * weights[1] + weights[2]

    x = rng.standard_normal(8).astype(np.float32)
    a = x.copy()
    with pytest.warns(qd.QuadrantsWarning) as record:
        weighted(a)
    frozen = [w for w in record if issubclass(w.category, qd.QuadrantsWarning)]
    assert len(frozen) == 1  # once per kernel and global, though read twice
    msg = str(frozen[0].message)
    assert "weighted" in msg and "'weights'" in msg and "tuple" in msg and "field" in msg
    assert frozen[0].filename == __file__
    np.testing.assert_allclose(a, x * 2.0 - 1.0, rtol=1e-6)
    # the value is frozen: a later change is not seen (the documented behaviour), and no new warning
    weights[1] = 10.0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", qd.QuadrantsWarning)
        a = x.copy()
        weighted(a)
        np.testing.assert_allclose(a, x * 2.0 - 1.0, rtol=1e-6)
        compiles = weighted.compile_count
        qd.init()  # drops compiled kernels: the next call compiles again, without a second warning
        a = x.copy()
        weighted(a)
        assert weighted.compile_count == compiles + 1
        np.testing.assert_allclose(a, x * 10.0 - 1.0, rtol=1e-6)  # recompiled: sees the list as it is now


def test_global_list_in_static_is_silent(rng):
    import warnings

    sizes = [1.0, 2.0, 3.0]

    @qd.kernel
    def total_of(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            s = 0.0
            for v in qd.static(sizes):
                s += v
            a[i] = a[i] + s + qd.static(sizes[0])

    x = rng.standard_normal(8).astype(np.float32)
    a = x.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", qd.QuadrantsWarning)
        total_of(a)
    np.testing.assert_allclose(a, x + 7.0, rtol=1e-6)


def test_global_list_at_run_time_index(rng):
    table = [1.0, 4.0, 9.0]

    @qd.kernel
    def lookup(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = table[i % 3]

    a = np.zeros(6, np.float32)
    with pytest.raises(qd.QuadrantsTypeError) as info:
        lookup(a)
    msg = str(info.value)
    assert "lookup" in msg and "'table'" in msg and "a[i] = table[i % 3]" in msg
    assert "tuple" in msg and "qd.static(table)" in msg and "field" in msg
    assert "reflected list" not in msg
    np.testing.assert_array_equal(a, 0)

    as_tuple = tuple(table)

    @qd.kernel
    def lookup_tuple(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = as_tuple[i % 3]

    lookup_tuple(a)
    np.testing.assert_array_equal(a, np.array(table * 2, np.float32))


def test_float_index(rng):
    f = qd.field(qd.f32, shape=8)

    @qd.kernel
    def half_index(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i / 2] = 1.0

    @qd.kernel
    def half_index_field():
        for i in range(8):
            f[i / 2] = 1.0

    for call in (lambda: half_index(np.zeros(8, np.float32)), half_index_field):
        with pytest.raises(qd.QuadrantsTypeError) as info:
            call()
        msg = str(info.value)
        assert "half_index" in msg and "indices must be integers" in msg and "[i / 2] = 1.0" in msg


def test_numba_typing_error_is_ours_without_numba_internals():
    f = qd.field(qd.f32, shape=8)

    @qd.kernel
    def bad_attribute():
        for i in range(8):
            f[i] = f.no_such_attribute

    with pytest.raises(qd.QuadrantsTypeError) as info:
        bad_attribute()
    msg = str(info.value)
    assert "bad_attribute" in msg and "no_such_attribute" in msg and "f[i] = f.no_such_attribute" in msg
    for internal in ("Failed in nopython mode", "During:", "$qd_launch", "<source elided>"):
        assert internal not in msg


def test_vector_into_scalar_field_is_located():
    f = qd.field(qd.f32, shape=4)

    @qd.kernel
    def too_wide():
        for i in range(4):
            f[i] = qd.Vector([1.0, 2.0])

    with pytest.raises(qd.QuadrantsTypeError) as info:
        too_wide()
    msg = str(info.value)
    assert "too_wide" in msg and "2 components" in msg and "f[i] = qd.Vector([1.0, 2.0])" in msg
