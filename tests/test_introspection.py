"""Introspection: kernel.tasks(), Task names/uids, IR dumps, compile counting."""

import numpy as np
import pytest

import qd_numba as qd

RNG = np.random.default_rng(99)


@pytest.fixture(autouse=True)
def _reset_config():
    qd.init()
    yield
    qd.init()


def make_three_tasks():
    @qd.kernel
    def three(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(a.shape[0]):
            a[i] = a[i] * 2.0
        a[0] = a[0] + 1.0
        for i, j in qd.ndrange(b.shape[0], b.shape[1]):
            b[i, j] = b[i, j] + i * 10.0 + j

    return three


def args():
    return RNG.standard_normal(50).astype(np.float32), RNG.standard_normal((6, 7)).astype(np.float32)


def test_tasks_kinds_and_ndim():
    k = make_three_tasks()
    tasks = k.tasks(*args())
    assert all(isinstance(t, qd.Task) for t in tasks)
    assert [t.kind for t in tasks] == ["range_for", "serial", "range_for"]
    assert [t.ndim for t in tasks] == [1, 0, 2]
    assert [t.index for t in tasks] == [0, 1, 2]
    assert len({t.name for t in tasks}) == 3 and len({t.uid for t in tasks}) == 3
    # qualified, stable names: '<module>.<qualname>.t<index>_<kind>'
    assert [t.name for t in tasks] == [f"{k.qualname}.t0_range_for", f"{k.qualname}.t1_serial",
                                       f"{k.qualname}.t2_range_for"]
    assert k.qualname == f"{__name__}.make_three_tasks.<locals>.three"
    assert all(t.describe() for t in tasks)


def test_tasks_numerics_match_numpy():
    k = make_three_tasks()
    a, b = args()
    ra, rb = a * 2, b.copy()
    ra[0] += 1
    rb += np.arange(6)[:, None] * 10.0 + np.arange(7)[None, :]
    k(a, b)
    np.testing.assert_allclose(a, ra, rtol=1e-6)
    np.testing.assert_allclose(b, rb, rtol=1e-6)


def test_task_ids_stable_across_identical_kernels():
    k1, k2 = make_three_tasks(), make_three_tasks()
    assert k1 is not k2 and k1.qualname == k2.qualname
    t1, t2 = k1.tasks(*args()), k2.tasks(*args())
    assert [t.name for t in t1] == [t.name for t in t2]
    assert [t.uid for t in t1] == [t.uid for t in t2]
    assert all(len(t.uid) == 16 and int(t.uid, 16) >= 0 for t in t1)


def test_same_short_name_in_two_scopes_gives_different_tasks():
    def scope_a():
        @qd.kernel
        def step(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                a[i] = a[i] + 1.0
        return step

    def scope_b():
        @qd.kernel
        def step(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                a[i] = a[i] * 3.0
        return step

    ka, kb = scope_a(), scope_b()
    x = RNG.standard_normal(20).astype(np.float32)
    ta, tb = ka.tasks(x.copy()), kb.tasks(x.copy())
    assert ta[0].name != tb[0].name and ta[0].uid != tb[0].uid
    assert ta[0].name.endswith("scope_a.<locals>.step.t0_range_for")
    ya, yb = x.copy(), x.copy()
    ka(ya)
    kb(yb)
    np.testing.assert_allclose(ya, x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(yb, x * 3.0, rtol=1e-6)


def test_task_uid_differs_between_kernels():
    @qd.kernel
    def other(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = 0.0

    t_other = other.tasks(np.zeros(3, np.float32))
    t_three = make_three_tasks().tasks(*args())
    assert t_other[0].uid != t_three[0].uid


def test_tasks_does_not_run_kernel_and_shares_instance():
    k = make_three_tasks()
    a, b = args()
    a0, b0 = a.copy(), b.copy()
    k.tasks(a, b)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    assert k.compile_count == 1
    k(a, b)
    assert k.compile_count == 1


def test_serial_only_kernel():
    @qd.kernel
    def serial_only(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        a[0] = 7

    tasks = serial_only.tasks(np.zeros(2, np.int32))
    assert [t.kind for t in tasks] == ["serial"]


def test_repeated_call_does_not_recompile():
    @qd.kernel
    def saxpy(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1),
              s: qd.f32):
        for i in range(x.shape[0]):
            y[i] = s * x[i] + y[i]

    x = RNG.standard_normal(1000).astype(np.float32)
    y = RNG.standard_normal(1000).astype(np.float32)
    ref = y.copy()
    for s in (1.0, 2.0, 0.5):
        saxpy(x, y, s)
        ref = np.float32(s) * x + ref
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert saxpy.compile_count == 1
    # a new array of the same type does not recompile either
    saxpy(x.copy(), y.copy(), 1.0)
    assert saxpy.compile_count == 1
    # a different dtype does
    saxpy_f64 = x.astype(np.float64)
    with pytest.raises(qd.QuadrantsTypeError):
        saxpy(saxpy_f64, y, 1.0)
    assert saxpy.compile_count == 1


def test_generic_ndarray_compiles_per_dtype():
    @qd.kernel
    def double(a: qd.types.ndarray()):
        for i in range(a.shape[0]):
            a[i] = a[i] * 2

    a32 = np.arange(5, dtype=np.float32)
    a64 = np.arange(5, dtype=np.float64)
    double(a32)
    double(a64)
    double(a32)
    np.testing.assert_array_equal(a32, np.arange(5) * 4)
    np.testing.assert_array_equal(a64, np.arange(5) * 2)
    assert double.compile_count == 2


def test_template_arg_compiles_per_value():
    @qd.kernel
    def add_n(a: qd.types.ndarray(dtype=qd.i32, ndim=1), n: qd.template()):
        for i in range(a.shape[0]):
            a[i] += n

    a = np.zeros(4, np.int32)
    add_n(a, 1)
    add_n(a, 1)
    add_n(a, 2)
    np.testing.assert_array_equal(a, 4)
    assert add_n.compile_count == 2


def _run_small_kernel():
    @qd.kernel
    def dumped(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = 1.0

    a = np.zeros(3, np.float32)
    dumped(a)
    np.testing.assert_array_equal(a, 1)


def test_dump_ir_env(monkeypatch, capfd):
    monkeypatch.setenv("QD_DUMP_IR", "1")
    qd.init()
    _run_small_kernel()
    err = capfd.readouterr().err
    assert "dumped" in err
    assert "after offload" in err and "label 0" in err


def test_print_ir_option(capfd):
    qd.init(print_ir=True)
    _run_small_kernel()
    err = capfd.readouterr().err
    assert "dumped" in err and "offload" in err


def test_no_dump_by_default(monkeypatch, capfd):
    monkeypatch.delenv("QD_DUMP_IR", raising=False)
    qd.init()
    _run_small_kernel()
    captured = capfd.readouterr()
    assert "offload" not in captured.err and "offload" not in captured.out
