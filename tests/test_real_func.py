"""@qd.real_func: called (not inlined), typed parameters and return, recursion, argument and
return conversion; errors. Every kernel also compiles to a CUDA cubin (conftest), where the
real function is a numba-cuda device function."""

import numpy as np
import pytest

import qd_numba as qd

vec3 = qd.types.vector(3, qd.f32)


@qd.real_func
def fib(n: qd.i32) -> qd.i32:
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


@qd.real_func
def heap_sum(node: qd.i32, size: qd.i32) -> qd.i32:
    """Sum of the node indices of the subtree at ``node`` of an implicit binary heap of ``size``."""
    if node >= size:
        return 0
    return node + heap_sum(2 * node + 1, size) + heap_sum(2 * node + 2, size)


@qd.real_func
def scaled_norm2(v: vec3, k: qd.f32) -> qd.f32:
    return k * (v[0] * v[0] + v[1] * v[1] + v[2] * v[2])


@qd.real_func
def truncate(x: qd.i32) -> qd.f32:
    return x * 0.5


@qd.real_func
def even(n: qd.i32) -> qd.i32:
    if n == 0:
        return 1
    return 1 - even(n - 1)


@qd.func
def via_func(n):
    return fib(n) + 1


@qd.kernel
def recursive(a: qd.types.ndarray(dtype=qd.i32, ndim=1), out: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i in a:
        out[i, 0] = fib(a[i])
        out[i, 1] = heap_sum(0, a[i] * 3)
        out[i, 2] = via_func(a[i])
        out[i, 3] = even(a[i])


def _fib(n):
    x, y = 0, 1
    for _ in range(n):
        x, y = y, x + y
    return x


def test_recursion_in_a_parallel_loop(rng):
    a = rng.integers(0, 16, 23).astype(np.int32)
    out = rng.integers(-5, 5, (23, 4)).astype(np.int32)
    recursive(a, out)
    ref = np.array([[_fib(n), sum(range(3 * n)), _fib(n) + 1, 1 - n % 2] for n in a], np.int32)
    np.testing.assert_array_equal(out, ref)


@qd.kernel
def serial_call(n: qd.i32) -> qd.i32:
    return fib(n) + heap_sum(0, n)


def test_call_in_serial_code_and_return(rng):
    for n in rng.integers(1, 18, 4):
        assert serial_call(int(n)) == _fib(int(n)) + sum(range(int(n)))


@qd.kernel
def vector_and_casts(v: qd.types.ndarray(dtype=qd.f32, ndim=2), x: qd.types.ndarray(dtype=qd.f32, ndim=1),
                     out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
    for i in x:
        out[i, 0] = scaled_norm2(vec3(v[i, 0], v[i, 1], v[i, 2]), x[i])
        out[i, 1] = truncate(x[i])      # x[i] converted to the i32 parameter, as Quadrants casts


def test_vector_parameter_and_argument_conversion(rng):
    v = rng.uniform(-2, 2, (17, 3)).astype(np.float32)
    x = rng.uniform(-9, 9, 17).astype(np.float32)
    out = rng.uniform(-1, 1, (17, 2)).astype(np.float32)
    vector_and_casts(v, x, out)
    np.testing.assert_allclose(out[:, 0], x * (v * v).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], np.trunc(x) * 0.5, rtol=1e-6)


@qd.real_func
def int_mean(a: qd.i32, b: qd.i32) -> qd.i32:
    return (a + b) / 2


@qd.kernel
def mean_kernel(a: qd.types.ndarray(dtype=qd.i32, ndim=1), out: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in a:
        out[i] = int_mean(a[i], 7)


def test_return_value_converted_to_annotation(rng):
    a = rng.integers(-50, 50, 19).astype(np.int32)
    out = np.zeros(19, np.int32) + 3
    mean_kernel(a, out)
    np.testing.assert_array_equal(out, np.trunc((a + 7) / 2).astype(np.int32))


def test_func_decorator_is_real_function():
    @qd.func(is_real_function=True)
    def twice(x: qd.f32) -> qd.f32:
        return x * 2

    assert isinstance(twice, qd.QdRealFunc)


def test_unannotated_parameter_is_error():
    with pytest.raises(qd.QuadrantsSyntaxError, match=r"real_func '.*bad'.*parameter 'x'"):
        @qd.real_func
        def bad(x) -> qd.f32:
            return x


def test_unsupported_return_annotation_is_error():
    with pytest.raises(qd.QuadrantsSyntaxError, match=r"real_func '.*bad_ret'.*return annotation"):
        @qd.real_func
        def bad_ret(x: qd.f32) -> list:
            return x


def test_called_from_python_is_error():
    with pytest.raises(qd.QuadrantsSyntaxError, match="'fib' can only be called from a kernel"):
        fib(3)


x_field = qd.field(qd.f32, shape=(4,), needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.real_func
def square(v: qd.f32) -> qd.f32:
    return v * v


@qd.kernel
def uses_real_func():
    for i in x_field:
        loss[None] += square(x_field[i])


def test_real_func_in_gradient_kernel_is_error():
    with pytest.raises(qd.QuadrantsSyntaxError, match=r"kernel 'uses_real_func.grad'.*'.*square'.*differentiated"):
        uses_real_func.grad()


@qd.real_func
def sum_down(n: qd.i32) -> qd.i64:
    if n <= 0:
        return 0
    return n + sum_down(n - 1)


@qd.kernel
def deep(a: qd.types.ndarray(dtype=qd.i32, ndim=1), out: qd.types.ndarray(dtype=qd.i64, ndim=1)):
    for i in a:
        out[i] = sum_down(a[i]) + fib(a[i] % 20)


@pytest.mark.cuda
def test_recursion_on_the_gpu_with_a_larger_stack(rng):
    """Recursion 2000 calls deep needs more than the default 1 KiB device stack per thread."""
    qd.init(arch=qd.cuda, cuda_stack_limit=256 * 1024)
    try:
        a = rng.integers(1000, 2000, 64).astype(np.int32)
        out = np.zeros(64, np.int64)
        deep(a, out)
        np.testing.assert_array_equal(out, a.astype(np.int64) * (a + 1) // 2 + [_fib(n % 20) for n in a])
        out2 = rng.integers(-5, 5, 23).astype(np.int32)
        a2 = rng.integers(0, 16, 23).astype(np.int32)
        recursive(a2, np.zeros((23, 4), np.int32))
        mean_kernel(a2, out2)
        np.testing.assert_array_equal(out2, np.trunc((a2 + 7) / 2).astype(np.int32))
    finally:
        qd.init()


table = qd.field(qd.f32, shape=(4,))


@qd.real_func
def reads_field(i: qd.i32) -> qd.f32:
    return table[i]


@qd.kernel
def uses_field_in_real_func(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in a:
        a[i] = reads_field(i)


def test_body_that_does_not_compile_is_our_error():
    with pytest.raises(qd.QuadrantsTypeError) as info:
        uses_field_in_real_func(np.zeros(4, np.float32))
    text = str(info.value)
    assert "kernel 'uses_field_in_real_func'" in text and "qd.real_func 'reads_field' does not compile" in text
    assert "'table'" in text


@qd.real_func
def is_even(n: qd.i32) -> qd.i32:
    if n == 0:
        return 1
    return is_odd(n - 1)


@qd.real_func
def is_odd(n: qd.i32) -> qd.i32:
    if n == 0:
        return 0
    return is_even(n - 1)


@qd.kernel
def parity(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in a:
        a[i] = is_even(a[i])


@pytest.mark.no_cuda_compile_check
def test_mutual_recursion_on_cpu(rng, arch):
    if arch == "cuda":
        pytest.skip("mutual recursion is a CPU feature (test_mutual_recursion_is_our_error_on_cuda)")
    a = rng.integers(0, 40, 21).astype(np.int32)
    ref = (a % 2 == 0).astype(np.int32)
    parity(a)
    np.testing.assert_array_equal(a, ref)


@qd.kernel
def parity_cuda(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in a:
        a[i] = is_odd(a[i])


def test_mutual_recursion_is_our_error_on_cuda(arch):
    from qd_numba import config

    if arch != "cuda" and not config.current.cuda_compile_check:
        pytest.skip("needs numba-cuda (the CUDA compile check) or a GPU")
    with pytest.raises(qd.QuadrantsSyntaxError, match="mutual recursion between real functions is not supported"):
        parity_cuda(np.arange(5, dtype=np.int32))
