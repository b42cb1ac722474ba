"""``assert`` in kernels: with ``qd.init(debug=True)`` a failed assert raises
``QuadrantsAssertionError`` with its message, the kernel and the source line; without debug
the assert is compiled out. Both inside parallel loops and in serial kernel code.

PYTEST_DONT_REWRITE: pytest's assert rewriting would also rewrite the kernels' asserts."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import qd_numba as qd


@pytest.fixture
def debug(arch):
    qd.init(debug=True)
    yield
    qd.init()


@pytest.fixture
def release():
    qd.init()
    yield


def _line_of(kernel_or_func, needle):
    """(file, line number) of the first source line of ``kernel_or_func`` containing ``needle``."""
    fn = getattr(kernel_or_func, "fn", kernel_or_func)
    lines, first = inspect.getsourcelines(fn)
    k = next(k for k, line in enumerate(lines) if needle in line)
    return inspect.getsourcefile(fn), first + k


@qd.kernel
def positive_plus_one(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        assert a[i] >= 0.0, "a must be non-negative"
        out[i] = a[i] + 1.0


def test_failed_assert_in_parallel_loop_raises_with_message_and_line(debug, rng):
    a = rng.uniform(0.5, 2, 50)
    a[int(rng.integers(0, 50))] = -float(rng.uniform(0.5, 2))
    out = np.zeros(50)
    with pytest.raises(qd.QuadrantsAssertionError) as info:
        positive_plus_one(a, out)
    text = str(info.value)
    path, line = _line_of(positive_plus_one, "assert a[i]")
    assert "a must be non-negative" in text and "positive_plus_one" in text
    assert f'File "{path}", line {line}' in text
    assert 'assert a[i] >= 0.0, "a must be non-negative"' in text
    assert isinstance(info.value, AssertionError)  # catchable as the builtin too


def test_passing_assert_in_debug_mode_computes_normally(debug, rng):
    a = rng.uniform(0.5, 2, 40)
    out = rng.uniform(-1, 1, 40)
    positive_plus_one(a, out)
    np.testing.assert_allclose(out, a + 1, rtol=1e-12)


def test_assert_is_compiled_out_without_debug(release, rng):
    a = rng.uniform(-2, 2, 40)  # fails the assert: nothing is checked
    out = rng.uniform(-1, 1, 40)
    positive_plus_one(a, out)
    np.testing.assert_allclose(out, a + 1, rtol=1e-12)
    assert [t.kind for t in positive_plus_one.tasks(a, out)] == ["range_for"]


@qd.kernel
def serial_assert(a: qd.types.ndarray(dtype=qd.f64, ndim=1), n: qd.i32):
    assert n <= a.shape[0]
    for i in range(n):
        a[i] = a[i] * 2.0


def test_failed_assert_in_serial_code(debug, rng):
    a = rng.uniform(-1, 1, 6)
    before = a.copy()
    with pytest.raises(qd.QuadrantsAssertionError) as info:
        serial_assert(a, 7)
    path, line = _line_of(serial_assert, "assert n")
    # without a message: the condition's source, as Quadrants
    assert "n <= a.shape[0]" in str(info.value) and f'File "{path}", line {line}' in str(info.value)
    np.testing.assert_array_equal(a, before)  # it failed before the loop ran
    serial_assert(a, 6)
    np.testing.assert_allclose(a, before * 2, rtol=1e-12)


def test_serial_assert_compiled_out_leaves_no_serial_task(release, rng):
    a = rng.uniform(-1, 1, 6)
    assert [t.kind for t in serial_assert.tasks(a, 3)] == ["range_for"]
    serial_assert(a[:4], 4)


@qd.kernel
def formatted(a: qd.types.ndarray(dtype=qd.f64, ndim=1), limit: qd.f64):
    for i in range(a.shape[0]):
        assert a[i] < limit, f"a[{i}] = {a[i]} is not below {limit}"


def test_fstring_message_shows_the_values(debug, rng, arch):
    a = rng.uniform(-1, 1, 30)
    k = int(rng.integers(0, 30))
    a[k] = 5.0 + float(rng.uniform(0, 1))
    with pytest.raises(qd.QuadrantsAssertionError) as info:
        formatted(a, 3.0)
    if arch == "cpu":
        assert f"a[{k}] = {a[k]} is not below 3.0" in str(info.value)
    else:  # CUDA exceptions carry no values: the expressions stand in
        assert "a[{i}] = {a[i]} is not below {limit}" in str(info.value)
    formatted(a, 7.0)


@qd.func
def checked_sqrt(x):
    assert x >= 0.0, "sqrt of a negative number"
    return qd.sqrt(x)


@qd.kernel
def roots(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        out[i] = checked_sqrt(a[i])


def test_assert_in_func_names_the_kernel_and_the_func_line(debug, rng):
    a = rng.uniform(0, 4, 20)
    out = np.zeros(20)
    roots(a, out)
    np.testing.assert_allclose(out, np.sqrt(a), rtol=1e-12)
    a[3] = -1.0
    with pytest.raises(qd.QuadrantsAssertionError) as info:
        roots(a, out)
    path, line = _line_of(checked_sqrt.fn, "assert x")
    assert "roots" in str(info.value) and "sqrt of a negative number" in str(info.value)
    assert f'File "{path}", line {line}' in str(info.value)


@qd.kernel
def compound(a: qd.types.ndarray(dtype=qd.i32, ndim=1), lo: qd.i32, hi: qd.i32):
    for i in range(a.shape[0]):
        assert lo <= a[i] and a[i] < hi, "out of range"
        assert not (a[i] == 13), "unlucky"
        for j in range(2):
            assert a[i] * j < 2 * hi or j == 0, "nested"
        a[i] += 1


@pytest.mark.parametrize("value, needle", [(-7, "out of range"), (12, "out of range"), (13, "unlucky")])
def test_compound_and_negated_conditions(debug, rng, value, needle):
    a = rng.integers(0, 10, 25).astype(np.int32)
    ref = a + 1
    compound(a, 0, 20)
    np.testing.assert_array_equal(a, ref)
    a[int(rng.integers(0, 25))] = value
    with pytest.raises(qd.QuadrantsAssertionError, match=needle):
        compound(a, 0, 12 if value == 12 else 20)


@qd.kernel
def if_then_assert_false(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        if a[i] < 0.0:
            assert False, f"negative at {i}"  # noqa: B011  (what is tested)
        a[i] += 1.0


def test_assert_false_under_an_if(debug, rng):
    a = rng.uniform(0, 1, 12)
    ref = a + 1
    if_then_assert_false(a)
    np.testing.assert_allclose(a, ref, rtol=1e-12)
    a[5] = -1.0
    with pytest.raises(qd.QuadrantsAssertionError, match="negative at"):
        if_then_assert_false(a)


@qd.kernel
def fails_after_loop(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        a[i] += 1.0
    assert False, "always"  # noqa: B011  (what is tested)


def test_unconditional_assert_after_a_loop_is_not_taken_for_the_loop_exit(debug, rng):
    a = rng.uniform(0, 1, 12)
    ref = a + 1
    with pytest.raises(qd.QuadrantsError, match="always"):
        fails_after_loop(a)
    np.testing.assert_allclose(a, ref, rtol=1e-12)  # the loop ran, in parallel, before


def test_message_must_be_a_string():
    @qd.kernel
    def bad(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(a.shape[0]):
            assert a[i] > 0, 42

    with pytest.raises(qd.QuadrantsSyntaxError, match="constant string or an f-string"):
        bad(np.ones(3))


def test_assert_rewritten_by_pytest_gets_a_hint():
    """Kernels in a test module whose asserts pytest rewrote: the error says what to do."""
    import ast

    from _pytest.assertion.rewrite import rewrite_asserts

    src = ("def rewritten(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):\n"
           "    for i in range(a.shape[0]):\n"
           "        assert a[i] > 0\n")
    tree = ast.parse(src)
    rewrite_asserts(tree, src.encode())
    ns = {"qd": qd}
    exec(compile(tree, "<rewritten>", "exec"), ns)
    with pytest.raises(qd.QuadrantsSyntaxError, match="PYTEST_DONT_REWRITE"):
        qd.kernel(ns["rewritten"])(np.ones(3))


@pytest.mark.cuda
def test_cuda_failed_assert_raises_with_message_and_line(rng):
    qd.init(arch=qd.cuda, debug=True)
    try:
        a = rng.uniform(0.5, 2, 5000)
        k = int(rng.integers(0, 5000))
        a[k] = -1.0
        out = np.zeros(5000)
        with pytest.raises(qd.QuadrantsAssertionError) as info:
            positive_plus_one(a, out)
        path, line = _line_of(positive_plus_one, "assert a[i]")
        assert "a must be non-negative" in str(info.value) and f'File "{path}", line {line}' in str(info.value)
        a[k] = 1.0
        positive_plus_one(a, out)  # the error word was cleared: the next call runs normally
        np.testing.assert_allclose(out, a + 1, rtol=1e-12)
        with pytest.raises(qd.QuadrantsAssertionError, match="n <= a.shape"):
            serial_assert(a, 5001)
    finally:
        qd.init()


# -- compile time: qd.static_print, qd.static_assert --------------------------------------------------------

SHAPED = qd.field(qd.f32, shape=(4, 3))


@qd.kernel
def printing(a: qd.types.ndarray(dtype=qd.f64, ndim=1), scale: qd.template()):
    qd.static_print("shape", SHAPED.shape, "scale", scale, sep="|")
    for i in range(a.shape[0]):
        for k in qd.static(range(2)):
            qd.static_print("unrolled", k, i)
            a[i] += scale * k


def test_static_print_prints_once_per_compile(capsys, rng):
    a = rng.uniform(-1, 1, 8)
    ref = a + 2.0
    printing(a, 2.0)
    printing(a, 2.0)  # the same instance: no compile, no print
    np.testing.assert_allclose(a, ref + 2.0, rtol=1e-12)
    assert capsys.readouterr().out == "shape|(4, 3)|scale|2.0\nunrolled 0 <runtime i>\nunrolled 1 <runtime i>\n"
    printing(a, 3.0)  # a new template value: a new compile
    assert capsys.readouterr().out.startswith("shape|(4, 3)|scale|3.0\n")


@qd.func
def row_sum(i, n: qd.template()):
    qd.static_assert(n <= SHAPED.shape[1], "n exceeds the row length")
    s = 0.0
    for j in qd.static(range(n)):
        s += SHAPED[i, j]
    return s


@qd.kernel
def row_sums(out: qd.types.ndarray(dtype=qd.f64, ndim=1), n: qd.template()):
    qd.static_assert(len(SHAPED.shape) == 2)
    for i in range(SHAPED.shape[0]):
        if qd.static(n > 100):
            qd.static_assert(False, "never compiled")
        out[i] = row_sum(i, n)


def test_static_assert_passes_and_the_kernel_runs(rng):
    d = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    SHAPED.from_numpy(d)
    out = np.zeros(4)
    row_sums(out, 2)
    np.testing.assert_allclose(out, d[:, :2].astype(np.float64).sum(1), rtol=1e-6)


def test_static_assert_failure_names_kernel_message_and_line():
    with pytest.raises(qd.QuadrantsCompilationError) as info:
        row_sums(np.zeros(4), 5)
    path, line = _line_of(row_sum.fn, "qd.static_assert")
    text = str(info.value)
    assert "row_sums" in text and "static assertion failed: n exceeds the row length" in text
    assert f'File "{path}", line {line}' in text


def test_static_assert_of_a_runtime_value_is_an_error():
    @qd.kernel
    def runtime_cond(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        qd.static_assert(a.shape[0] == 3)
        for i in range(a.shape[0]):
            a[i] = 1.0

    with pytest.raises(qd.QuadrantsCompilationError, match="known at compile time") as info:
        runtime_cond(np.zeros(3))
    assert isinstance(info.value, qd.QuadrantsSyntaxError)


def test_static_print_and_assert_in_python_scope(capsys):
    qd.static_print("x", 1)
    assert capsys.readouterr().out == "x 1\n"
    qd.static_assert(2 > 1)
    with pytest.raises(qd.QuadrantsCompilationError, match="static assertion failed: no"):
        qd.static_assert(1 > 2, "no")
