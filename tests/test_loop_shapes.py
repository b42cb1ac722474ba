"""Loop recognition does not depend on the bytecode layout of a loop: long bodies (CPython puts
an EXTENDED_ARG before the loop's FOR_ITER once its exit is far away), nested loops, every kind
of top-level iterable. Each kernel must become parallel range-for tasks and match numpy."""

import dis

import numpy as np
import pytest

import qd_numba as qd

LENGTHS = (1, 10, 40, 100, 300, 500)
F = qd.field(qd.f64, shape=(37,))


def _coefficients(n):
    """Per statement k: s = s * c[k] + d[k] (exact binary fractions, no growth)."""
    k = np.arange(n)
    return 1.0 - (k % 7) / 64.0, (k % 5) / 8.0 - 0.25


def _chain_source(n, indent):
    """``n`` statements updating ``s``; a new name per statement (reassigning one name n times
    costs Numba's SSA reconstruction O(n^2), which is not what these tests are about)."""
    c, d = _coefficients(n)
    lines = [f"{indent}s{k + 1} = s{k} * {float(c[k])!r} + {float(d[k])!r}\n" for k in range(n)]
    return f"{indent}s0 = s\n" + "".join(lines) + f"{indent}s = s{n}\n"


def _chain_reference(x, n, repeat=1):
    c, d = _coefficients(n)
    for _ in range(repeat):
        for k in range(n):
            x = x * c[k] + d[k]
    return x


def _make_kernel(src, name):
    ns = {"qd": qd, "F": F, "__name__": __name__}
    exec(compile(src, f"<test_loop_shapes {name}>", "exec"), ns)
    return qd.kernel(ns[name])


_HEADERS = {
    "range": ("for i in range(a.shape[0]):", "a[i]"),
    "ndrange": ("for i, j in qd.ndrange(b.shape[0], b.shape[1]):", "b[i, j]"),
    "grouped": ("for I in qd.grouped(b):", "b[I]"),
    "ndarray": ("for i, j in b:", "b[i, j]"),
    "field": ("for i in F:", "F[i]"),
}
_SIG = ("(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=2)):\n")


def _long_body_kernel(form, n):
    header, elem = _HEADERS[form]
    src = (f"def long_{form}{_SIG}"
           f"    {header}\n"
           f"        s = {elem}\n"
           f"{_chain_source(n, ' ' * 8)}"
           f"        {elem} = s\n")
    return _make_kernel(src, f"long_{form}")


def _check_long_body(form, n, rng):
    kernel = _long_body_kernel(form, n)
    if n >= 100:  # the case this file is about, on every Python version
        assert any(ins.opname == "EXTENDED_ARG" for ins in dis.get_instructions(kernel.fn))
    a, b = rng.uniform(-2, 2, 29), rng.uniform(-2, 2, (5, 7))
    fd = rng.uniform(-2, 2, F.shape)
    F.from_numpy(fd)
    tasks = kernel.tasks(a, b)
    assert [t.kind for t in tasks] == ["range_for"]
    assert tasks[0].ndim == (1 if form in ("range", "field") else 2)
    ref_a, ref_b, ref_f = a.copy(), b.copy(), fd.copy()
    if form == "range":
        ref_a = _chain_reference(a, n)
    elif form == "field":
        ref_f = _chain_reference(fd, n)
    else:
        ref_b = _chain_reference(b, n)
    kernel(a, b)
    np.testing.assert_allclose(a, ref_a, rtol=1e-12)
    np.testing.assert_allclose(b, ref_b, rtol=1e-12)
    np.testing.assert_allclose(F.to_numpy(), ref_f, rtol=1e-12)


# Numba compiles a body of hundreds of statements in seconds, numba-cuda in more: the longest
# bodies skip the CUDA compile (the 100-statement ones cover the CUDA path)
_LONG = pytest.mark.no_cuda_compile_check


@pytest.mark.parametrize("n", [n if n < 300 else pytest.param(n, marks=_LONG) for n in LENGTHS])
def test_range_loop_with_long_body_is_one_parallel_task(n, rng):
    _check_long_body("range", n, rng)


@pytest.mark.parametrize("n", (10, 40, 100, pytest.param(300, marks=_LONG)))
@pytest.mark.parametrize("form", sorted(set(_HEADERS) - {"range"}))
def test_every_iterable_with_long_body_is_one_parallel_task(form, n, rng):
    _check_long_body(form, n, rng)


@pytest.mark.parametrize("n", (3, 60))
@pytest.mark.parametrize("depth", (1, 2, 3, 4))
def test_nested_loops_inside_long_top_level_loop(depth, n, rng):
    """Serial loops nested ``depth`` deep in the task, the innermost with ``n`` statements (60:
    every loop header of the nest needs an EXTENDED_ARG)."""
    src = f"def nested{_SIG}    for i in range(a.shape[0]):\n        s = a[i]\n"
    indent = " " * 8
    for level in range(depth):
        src += f"{indent}for j{level} in range(b.shape[{level % 2}] - {3 + level}):\n"
        indent += "    "
    src += _chain_source(n, indent) + "        a[i] = s\n"
    kernel = _make_kernel(src, "nested")
    a, b = rng.uniform(-2, 2, 23), np.zeros((5, 6))
    assert [t.kind for t in kernel.tasks(a, b)] == ["range_for"]
    trips = int(np.prod([b.shape[level % 2] - (3 + level) for level in range(depth)]))
    ref = _chain_reference(a, n, repeat=trips)
    kernel(a, b)
    np.testing.assert_allclose(a, ref, rtol=1e-12)


def test_long_loops_with_serial_code_between(rng):
    src = (f"def three{_SIG}"
           f"    for i in range(a.shape[0]):\n        s = a[i]\n{_chain_source(45, ' ' * 8)}        a[i] = s\n"
           f"    b[0, 0] = a[0] + a[1]\n"
           f"    for i, j in qd.ndrange(b.shape[0], b.shape[1]):\n        s = b[i, j]\n"
           f"{_chain_source(70, ' ' * 8)}        b[i, j] = s\n")
    kernel = _make_kernel(src, "three")
    a, b = rng.uniform(-2, 2, 31), rng.uniform(-2, 2, (4, 9))
    assert [t.kind for t in kernel.tasks(a, b)] == ["range_for", "serial", "range_for"]
    ref_a = _chain_reference(a, 45)
    ref_b = b.copy()
    ref_b[0, 0] = ref_a[0] + ref_a[1]
    ref_b = _chain_reference(ref_b, 70)
    kernel(a, b)
    np.testing.assert_allclose(a, ref_a, rtol=1e-12)
    np.testing.assert_allclose(b, ref_b, rtol=1e-12)


def test_static_loop_with_long_body_is_unrolled(rng):
    src = (f"def unrolled{_SIG}"
           f"    for i in range(a.shape[0]):\n        s = a[i]\n"
           f"        for k in qd.static(range(3)):\n{_chain_source(50, ' ' * 12)}"
           f"            b[k, i] = s\n        a[i] = s\n")
    kernel = _make_kernel(src, "unrolled")
    a, b = rng.uniform(-2, 2, 11), rng.uniform(-2, 2, (3, 11))
    assert [t.kind for t in kernel.tasks(a, b)] == ["range_for"]
    refs = [_chain_reference(a, 50, repeat=k + 1) for k in range(3)]
    kernel(a, b)
    np.testing.assert_allclose(a, refs[2], rtol=1e-12)
    np.testing.assert_allclose(b, np.stack(refs), rtol=1e-12)


# -- one name, several top-level loops ------------------------------------------------------------

@qd.kernel
def reuse_in_nested(a: qd.types.ndarray(dtype=qd.f64, ndim=1), c: qd.f64):
    for i in range(a.shape[0]):
        a[i] = a[i] * c
    for i in range(a.shape[0]):
        for d in range(2):
            a[i] += c + d


def test_loop_variable_reused_in_a_nested_loop(rng):
    a = rng.uniform(-2, 2, 17)
    c = float(rng.uniform(0.5, 2))
    ref = a * c + 2 * c + 1
    reuse_in_nested(a, c)
    np.testing.assert_allclose(a, ref, rtol=1e-12)
    assert [t.kind for t in reuse_in_nested.tasks(a, c)] == ["range_for", "range_for"]


@qd.kernel
def reuse_three_times(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        t = a[i] + 1.0
        a[i] = t * t
    for i in F:
        t = F[i] * 0.5
        for _k in range(3):
            t += i * 0.25
        F[i] = t
    for i in range(b.shape[0]):
        t = b[i]
        for _k in range(i % 4):
            t = t * 2.0 - a[i % a.shape[0]]
        b[i] = t


def test_loop_variable_and_local_reused_in_three_loops(rng):
    a, b, fd = rng.uniform(-2, 2, 9), rng.uniform(-2, 2, 21), rng.uniform(-2, 2, F.shape)
    F.from_numpy(fd)
    ref_a = (a + 1) ** 2
    ref_f = fd * 0.5 + np.arange(F.shape[0]) * 0.75
    ref_b = b.copy()
    for i in range(b.shape[0]):
        for _ in range(i % 4):
            ref_b[i] = ref_b[i] * 2 - ref_a[i % a.shape[0]]
    reuse_three_times(a, b)
    np.testing.assert_allclose(a, ref_a, rtol=1e-12)
    np.testing.assert_allclose(F.to_numpy(), ref_f, rtol=1e-12)
    np.testing.assert_allclose(b, ref_b, rtol=1e-12)
    assert [t.kind for t in reuse_three_times.tasks(a, b)] == ["range_for"] * 3


@qd.kernel
def reuse_outer_name_as_inner(a: qd.types.ndarray(dtype=qd.f64, ndim=2), s: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for j in range(s.shape[0]):
        s[j] = s[j] + j
    for i in range(a.shape[0]):
        acc = 0.0
        for j in range(a.shape[1]):
            for _half in range(2):
                acc += a[i, j] * (j + 1) * 0.5
        for i2 in range(2):
            for j in range(i2 + 1):
                acc += j
        s[i] += acc


def test_inner_loop_reuses_the_name_of_another_top_level_loop(rng):
    a, s = rng.uniform(-2, 2, (6, 5)), rng.uniform(-2, 2, 8)
    ref = s + np.arange(8)
    ref[:6] += a @ np.arange(1, 6) + 1
    reuse_outer_name_as_inner(a, s)
    np.testing.assert_allclose(s, ref, rtol=1e-12)


@qd.kernel
def reuse_ndrange_targets(a: qd.types.ndarray(dtype=qd.f64, ndim=2)):
    for i, j in qd.ndrange(a.shape[0], a.shape[1]):
        a[i, j] = a[i, j] + i - j
    for i, j in qd.ndrange(a.shape[0], a.shape[1]):
        for _k in range(j):
            a[i, j] += i * 0.5
    for i, j in a:
        a[i, j] *= 2.0


def test_ndrange_targets_reused(rng):
    a = rng.uniform(-2, 2, (5, 7))
    ii, jj = np.meshgrid(np.arange(5), np.arange(7), indexing="ij")
    ref = (a + ii - jj + jj * ii * 0.5) * 2
    reuse_ndrange_targets(a)
    np.testing.assert_allclose(a, ref, rtol=1e-12)
    assert [t.kind for t in reuse_ndrange_targets.tasks(a)] == ["range_for"] * 3
