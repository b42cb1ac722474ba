"""Quadrants' return rules: a value annotation is kept on every path, no return inside a
non-static if/for/while (a real_func may), no value without an annotation, the returned value
converted to the annotation (a value of another shape is an error), annotations a kernel cannot
return, and integer arguments that do not fit their type."""

import numpy as np
import pytest

import qd_numba as qd

vec2 = qd.types.vector(2, qd.f32)


@qd.kernel
def to_int(x: qd.f32) -> qd.i32:
    return x * 3


@qd.kernel
def to_float(n: qd.i32) -> qd.f64:
    return n // 3


@qd.kernel
def to_vec(x: qd.f32, y: qd.f32) -> vec2:
    return qd.Vector([x * 2, y - 1])


def test_returned_scalar_converted_to_annotation(rng):
    for x in rng.uniform(-20, 20, 5):
        r = to_int(float(x))
        assert type(r) is int
        assert r == int(np.float32(x) * np.float32(3))
    for n in rng.integers(-100, 100, 5):
        r = to_float(int(n))
        assert isinstance(r, float) and r == float(int(n) // 3)


def test_returned_vector(rng):
    x, y = rng.uniform(-5, 5, 2)
    np.testing.assert_allclose(to_vec(float(x), float(y)).to_numpy(), [2 * x, y - 1], rtol=1e-6)


@qd.kernel
def branches(x: qd.f32) -> qd.f32:
    r = -x
    if x > 0:
        r = x
    return r


@qd.kernel
def static_loop_return(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    for k in qd.static(range(3)):
        if qd.static(k == 2):
            return a[k]
    return 0.0


@qd.kernel
def loop_then_return(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    s = 0.0
    if a.shape[0] > 0:          # a loop under an if runs serially: break is allowed
        for i in range(a.shape[0]):
            if a[i] > 100:
                break
            s += a[i]
    return s


def test_allowed_returns(rng):
    a = rng.uniform(-5, 5, 7).astype(np.float32)
    for x in rng.uniform(-5, 5, 4):
        assert branches(float(x)) == pytest.approx(abs(x), rel=1e-6)
    assert static_loop_return(a) == pytest.approx(a[2])
    assert loop_then_return(a) == pytest.approx(a.sum(), rel=1e-5)


def _raises(exc, kernel, args, *fragments):
    with pytest.raises(exc) as info:
        kernel(*args)
    text = str(info.value)
    for fragment in (f"kernel '{kernel.name}'", *fragments):
        assert fragment in text, text


@qd.kernel
def no_annotation(x: qd.f32):
    return x * 2


@qd.kernel
def vector_for_scalar(x: qd.f32) -> qd.f32:
    return qd.Vector([x, x])


@qd.kernel
def not_every_path(x: qd.f32) -> qd.f32:
    if qd.static(False):
        return x


@qd.kernel
def bare_return(x: qd.f32) -> qd.f32:
    return


@qd.kernel
def return_in_loop(n: qd.i32) -> qd.i32:
    for i in range(n):
        if i > 2:
            return i
    return 0


@qd.kernel
def return_in_parallel_loop(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    for i in a:
        return a[i]
    return 0.0


def test_return_errors():
    a = np.ones(3, np.float32)
    _raises(qd.QuadrantsSyntaxError, no_annotation, (1.0,), "no return annotation", "return x * 2")
    _raises(qd.QuadrantsTypeError, vector_for_scalar, (1.0,), "returned value is a vector", "float32",
            "return qd.Vector([x, x])")
    _raises(qd.QuadrantsSyntaxError, not_every_path, (1.0,), "does not return a value on every path")
    _raises(qd.QuadrantsSyntaxError, bare_return, (1.0,), "'return' without a value", "    return\n")
    _raises(qd.QuadrantsSyntaxError, return_in_loop, (5,), "inside a non-static for loop", "return i")
    _raises(qd.QuadrantsSyntaxError, return_in_parallel_loop, (a,), "inside a non-static for loop", "return a[i]")


def test_unsupported_return_annotation():
    with pytest.raises(qd.QuadrantsSyntaxError, match=r"kernel 'returns_list': the return annotation .*list"):
        @qd.kernel
        def returns_list(x: qd.f32) -> list:
            return x


@qd.kernel
def takes_i32(x: qd.i32, y: qd.u8) -> qd.i64:
    return x + y


def test_int_argument_must_fit(rng):
    x, y = int(rng.integers(-1000, 1000)), int(rng.integers(0, 255))
    assert takes_i32(x, y) == x + y
    with pytest.raises(qd.QuadrantsTypeError, match=r"kernel 'takes_i32', argument 'x': 1099511627776 does not fit"):
        takes_i32(2**40, y)
    with pytest.raises(qd.QuadrantsTypeError, match=r"argument 'y': -1 does not fit in uint8"):
        takes_i32(x, -1)
    assert takes_i32(x, y) == x + y   # the fast path again


@qd.func
def half_path(x) -> qd.f32:
    if qd.static(False):
        return x


@qd.func
def static_pick(a: qd.template(), k: qd.template()) -> qd.f32:
    for j in qd.static(range(4)):
        if qd.static(j == k):
            return a[j]
    return 0.0


@qd.kernel
def calls_half_path(x: qd.f32) -> qd.f32:
    return half_path(x)


@qd.kernel
def calls_static_pick(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    return static_pick(a, 2) + static_pick(a, 3)


def test_annotated_func_rules(rng):
    _raises(qd.QuadrantsSyntaxError, calls_half_path, (1.0,), "qd.func 'half_path'",
            "does not return a value on every path")
    a = rng.uniform(-3, 3, 4).astype(np.float32)
    assert calls_static_pick(a) == pytest.approx(float(a[2] + a[3]), rel=1e-6)


@qd.func
def truncated(x) -> qd.i32:
    return x * 1.5


@qd.kernel
def func_conversion(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in a:
        out[i] = truncated(a[i]) + 0.25


def test_func_return_converted_to_annotation(rng):
    a = rng.uniform(-9, 9, 13).astype(np.float32)
    out = rng.uniform(-1, 1, 13).astype(np.float32)
    func_conversion(a, out)
    np.testing.assert_allclose(out, np.trunc(a * np.float32(1.5)) + 0.25, rtol=1e-6)


gx = qd.field(qd.f32, shape=(8,), needs_grad=True)
gloss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.func
def cube(v) -> qd.f32:
    return v * v * v


@qd.kernel
def cube_loss():
    for i in gx:
        gloss[None] += cube(gx[i])


def test_annotated_func_in_a_gradient_kernel(rng):
    x = rng.uniform(-2, 2, 8).astype(np.float32)
    gx.from_numpy(x)
    gloss[None] = 0.0
    gloss.grad[None] = 1.0
    gx.grad.fill(0.0)
    cube_loss()
    cube_loss.grad()
    assert gloss[None] == pytest.approx(float((x.astype(np.float64) ** 3).sum()), rel=1e-5)
    np.testing.assert_allclose(gx.grad.to_numpy(), 3 * x * x, rtol=1e-5)


# -- return inside non-static control flow (Quadrants: "Return inside non-static if/for is not supported") --

@qd.kernel
def return_in_if(x: qd.f32) -> qd.f32:
    if x > 0:
        return x
    return -x


@qd.kernel
def return_in_else(x: qd.f32) -> qd.f32:
    r = 0.0
    if x > 0:
        r = x
    else:
        return -x
    return r


@qd.kernel
def return_in_while(n: qd.i32) -> qd.i32:
    k = 0
    while k < n:
        k += 1
        return k
    return 0


@qd.func
def abs_by_branch(x):          # un-annotated: the rule is the same
    if x > 0:
        return x
    return -x


@qd.kernel
def calls_abs_by_branch(x: qd.f32) -> qd.f32:
    return abs_by_branch(x)


@qd.func
def static_branch_return(x, k: qd.template()):
    if qd.static(k > 0):
        return x * k
    return -x


@qd.kernel
def calls_static_branch(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in a:
        out[i] = static_branch_return(a[i], 3) + static_branch_return(a[i], 0)


@qd.real_func
def real_abs(x: qd.f32) -> qd.f32:
    if x > 0:
        return x
    for _ in range(3):
        if x > -1:
            return -x
    return -x


@qd.kernel
def calls_real_abs(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in a:
        out[i] = real_abs(a[i])


def test_return_inside_non_static_control_flow_is_an_error():
    message = "Return inside non-static if/for is not supported"
    _raises(qd.QuadrantsSyntaxError, return_in_if, (1.0,), message, "'return' inside an if", "line 237",
            "    return x\n")
    _raises(qd.QuadrantsSyntaxError, return_in_else, (1.0,), message, "line 247", "return -x")
    _raises(qd.QuadrantsSyntaxError, return_in_while, (3,), message, "inside a while loop", "return k")
    _raises(qd.QuadrantsSyntaxError, calls_abs_by_branch, (1.0,), message, "qd.func 'abs_by_branch'",
            "line 263", "return x")
    assert issubclass(qd.QuadrantsSyntaxError, SyntaxError)


def test_static_if_and_real_func_may_return_early(rng):
    a = rng.uniform(-3, 3, 17).astype(np.float32)
    out = np.zeros_like(a)
    calls_static_branch(a, out)
    np.testing.assert_allclose(out, 3 * a - a, rtol=1e-6)
    calls_real_abs(a, out)
    np.testing.assert_allclose(out, np.abs(a), rtol=1e-6)


def test_the_rule_reads_the_source_without_searching_every_module(monkeypatch):
    """The source comes from linecache, not ``inspect.findsource`` (whose ``getmodule`` of a code
    object resolves the path of every loaded module the first time): the rule's module sees an
    ``inspect`` offering only ``getblock``."""
    import inspect
    import types

    from qd_numba.passes import return_rules

    monkeypatch.setattr(return_rules, "inspect", types.SimpleNamespace(getblock=inspect.getblock))
    return_rules._CONTROL_FLOW.clear()
    _raises(qd.QuadrantsSyntaxError, return_in_while, (3,), "Return inside non-static if/for is not supported",
            "inside a while loop", "return k")
