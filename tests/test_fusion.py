"""Fusion of adjacent range-for tasks (passes/fuse_tasks.py, docs/fusion.md).

Every pattern runs three ways on random data: fused (``@qd.kernel(fuse=True)``), unfused
(``fuse=False``) and a numpy reference; the task count shows whether fusion happened.
The differential fuzzer at the end generates random kernels (hypothesis): a few in the default
run, ``QD_FUSION_FUZZ_EXAMPLES`` (150) under ``-m slow``; set ``QD_FUSION_FUZZ_EXAMPLES=20000``
for a long run.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qd_numba as qd
from qd_numba import config

I32 = qd.types.ndarray(dtype=qd.i32, ndim=1)
F32 = qd.types.ndarray(dtype=qd.f32, ndim=1)
N = 64          # loop bounds; arrays are padded so that shifted indices stay in range
SIZE = 3 * N + 8


@pytest.fixture(autouse=True)
def _reset_config():
    qd.init()
    yield
    qd.init()


def ints(rng, *shape):
    return rng.integers(-1000, 1000, size=shape or (SIZE,), dtype=np.int32)


def run_both(make, args, expected_tasks_fused, expected_tasks_unfused):
    """Run the fused and unfused kernel on copies of ``args``; check the task counts and that
    both leave identical arrays. Returns the arrays of the fused run."""
    outs = []
    for fuse, expected in ((False, expected_tasks_unfused), (True, expected_tasks_fused)):
        k = make(fuse)
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        tasks = k.tasks(*copies)
        assert len(tasks) == expected, [t.describe() for t in tasks]
        k(*copies)
        outs.append([c for c in copies if isinstance(c, np.ndarray)])
    for unfused, fused in zip(*outs):
        np.testing.assert_array_equal(fused, unfused)
    return outs[1]


# -- rule 1: disjoint resources -------------------------------------------------------------------

def test_disjoint_ndarrays_fuse(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, c: I32, d: I32, n: qd.i32):
            for i in range(n):
                a[i] = c[i] * 2
            for i in range(n):
                b[i * 3 + 1] = d[i // 2] + 7      # any index: b and d are not touched by loop 1
        return k

    a, b, c, d = (ints(rng) for _ in range(4))
    ra, rb = a.copy(), b.copy()
    i = np.arange(N)
    ra[i] = c[i] * 2
    rb[i * 3 + 1] = d[i // 2] + 7
    fa, fb, _, _ = run_both(make, (a, b, c, d, N), 1, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


def test_shared_read_only_input_fuses(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, c: I32, n: qd.i32):
            for i in range(n):
                a[i] = c[i // 3] + c[0]
            for i in range(n):
                b[i] = c[i % 5] - c[i]
        return k

    a, b, c = (ints(rng) for _ in range(3))
    i = np.arange(N)
    ra, rb = a.copy(), b.copy()
    ra[i] = c[i // 3] + c[0]
    rb[i] = c[i % 5] - c[i]
    fa, fb, _ = run_both(make, (a, b, c, N), 1, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


def test_disjoint_fields_fuse(rng):
    x = qd.field(qd.f32, shape=(N,))
    y = qd.field(qd.f32, shape=(N,))

    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: F32):
            for i in range(N):
                x[i] = a[i] * 2.0
            for i in range(N):
                y[i] = a[i] + 1.0
        return k

    a = rng.standard_normal(N).astype(np.float32)
    for fuse, expected in ((False, 2), (True, 1)):
        x.fill(0), y.fill(0)
        k = make(fuse)
        assert len(k.tasks(a)) == expected
        k(a)
        np.testing.assert_array_equal(x.to_numpy(), a * np.float32(2))
        np.testing.assert_array_equal(y.to_numpy(), a + np.float32(1))


# -- rule 2: same-thread read-after-write -----------------------------------------------------------

ACCEPTED = {
    "i": lambda i: i,
    "i + 1": lambda i: i + 1,
    "(i + 5) - 1": lambda i: (i + 5) - 1,
    "2 + i": lambda i: 2 + i,
    "i * 3": lambda i: i * 3,
    "i << 1": lambda i: i << 1,
    "i ^ 5": lambda i: i ^ 5,
    "-i + 70": lambda i: -i + 70,
    "~i + 70": lambda i: ~i + 70,
    "100 - i": lambda i: 100 - i,
    "(i + 2) * 2": lambda i: (i + 2) * 2,
}


def _same_index_kernel(expr, fuse):
    src = f"""
@qd.kernel(fuse=fuse)
def k(a: I32, b: I32, c: I32, n: qd.i32):
    for i in range(n):
        a[{expr}] = c[i] * 2
    for i in range(n):
        b[i] = a[{expr}] + 1
"""
    ns = {"qd": qd, "I32": I32, "fuse": fuse}
    exec(compile(src, f"<fusion test {expr}>", "exec"), ns)
    return ns["k"]


@pytest.mark.parametrize("expr", sorted(ACCEPTED))
def test_same_thread_raw_injective_indices_fuse(rng, expr):
    a, b, c = (ints(rng) for _ in range(3))
    i = np.arange(N)
    idx = ACCEPTED[expr](i)
    ra, rb = a.copy(), b.copy()
    ra[idx] = c[i] * 2
    rb[i] = ra[idx] + 1
    fa, fb, _ = run_both(lambda fuse: _same_index_kernel(expr, fuse), (a, b, c, N), 1, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


REJECTED = {
    "i // 2": lambda i: i // 2,
    "i % 7": lambda i: i % 7,
    "(i + 1) // 2": lambda i: (i + 1) // 2,
    "min(i, 40)": lambda i: np.minimum(i, 40),
    "max(i, 3)": lambda i: np.maximum(i, 3),
    "i & 12": lambda i: i & 12,
    "i | 1": lambda i: i | 1,
    "i >> 1": lambda i: i >> 1,
    "0": lambda i: np.zeros_like(i),
    "int(i * 1.0)": lambda i: i,            # a value cast
    "c[i] % 50 + 60": None,                 # an indirect index
    "(i > 3) * 1 + i": lambda i: (i > 3) * 1 + i,   # a comparison
}


@pytest.mark.parametrize("expr", sorted(REJECTED))
def test_non_injective_indices_do_not_fuse(rng, expr):
    # loop 1 writes a[i]; loop 2 reads a[expr]: another thread's element for these expressions
    src = f"""
@qd.kernel(fuse=fuse)
def k(a: I32, b: I32, c: I32, n: qd.i32):
    for i in range(n):
        a[i] = c[i] * 2
    for i in range(n):
        b[i] = a[{expr}] + 1
"""

    def make(fuse):
        ns = {"qd": qd, "I32": I32, "fuse": fuse}
        exec(compile(src, f"<fusion test {expr}>", "exec"), ns)
        return ns["k"]

    a, b, c = (ints(rng) for _ in range(3))
    i = np.arange(N)
    ra, rb = a.copy(), b.copy()
    ra[i] = c[i] * 2
    idx = REJECTED[expr](i) if REJECTED[expr] is not None else c[i] % 50 + 60
    rb[i] = ra[idx] + 1
    fa, fb, _ = run_both(make, (a, b, c, N), 2, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


def test_cross_iteration_read_does_not_fuse(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, n: qd.i32):
            for i in range(n):
                a[i + 1] = a[i + 1] * 3
            for i in range(n):
                b[i] = a[i]            # a[i] was written by thread i - 1
        return k

    a, b = ints(rng), ints(rng)
    ra, rb = a.copy(), b.copy()
    i = np.arange(N)
    ra[i + 1] = a[i + 1] * 3
    rb[i] = ra[i]
    fa, fb = run_both(make, (a, b, N), 2, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


def test_atomics_at_the_same_injective_index_fuse(rng):
    x = qd.field(qd.i32, shape=(N,))

    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32):
            for i in range(N):
                x[i] += a[i]
            for i in range(N):
                qd.atomic_add(x[i], b[i])
            for i in range(N):
                b[i] = x[i] * 2
        return k

    a, b = ints(rng, N), ints(rng, N)
    for fuse, expected in ((False, 3), (True, 1)):
        x.from_numpy(np.arange(N, dtype=np.int32))
        bb = b.copy()
        k = make(fuse)
        assert len(k.tasks(a, bb)) == expected
        k(a, bb)
        np.testing.assert_array_equal(x.to_numpy(), np.arange(N) + a + b)
        np.testing.assert_array_equal(bb, (np.arange(N) + a + b) * 2)


def test_atomic_reduction_at_a_constant_index_does_not_fuse(rng):
    s = qd.field(qd.i32, shape=())

    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32):
            for i in range(N):
                s[None] += a[i]
            for i in range(N):
                b[i] = s[None]
        return k

    a, b = ints(rng, N), ints(rng, N)
    for fuse in (False, True):
        s[None] = 0
        bb = b.copy()
        k = make(fuse)
        assert len(k.tasks(a, bb)) == 2
        k(a, bb)
        assert s[None] == a.sum()
        np.testing.assert_array_equal(bb, np.full(N, a.sum()))


def test_field_read_after_write_2d_and_grouped(rng):
    x = qd.field(qd.i32, shape=(8, 6))
    y = qd.field(qd.i32, shape=(8, 6))

    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: qd.types.ndarray(dtype=qd.i32, ndim=2)):
            for i, j in qd.ndrange(8, 6):
                x[i, j] = a[i, j] * 3
            for i, j in x:
                y[i, j] = x[i, j] + i
            for g in qd.grouped(y):
                x[g] = y[g] - x[g]
        return k

    a = rng.integers(-100, 100, size=(8, 6), dtype=np.int32)
    ref_y = a * 3 + np.arange(8)[:, None]
    for fuse, expected in ((False, 3), (True, 1)):
        x.fill(0), y.fill(0)
        k = make(fuse)
        assert len(k.tasks(a)) == expected
        k(a)
        np.testing.assert_array_equal(y.to_numpy(), ref_y)
        np.testing.assert_array_equal(x.to_numpy(), ref_y - a * 3)


def test_2d_transposed_or_partial_index_does_not_fuse(rng):
    def make(fuse, second):
        src = f"""
@qd.kernel(fuse=fuse)
def k(a: qd.types.ndarray(dtype=qd.i32, ndim=2), b: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i, j in qd.ndrange(6, 6):
        a[i, j] = a[i, j] + 1
    for i, j in qd.ndrange(6, 6):
        b[i, j] = {second}
"""
        ns = {"qd": qd, "fuse": fuse}
        exec(compile(src, "<fusion 2d>", "exec"), ns)
        return ns["k"]

    for second, ref in (("a[j, i]", lambda a1: a1.T), ("a[i, 0]", lambda a1: np.repeat(a1[:, :1], 6, 1)),
                        ("a[i, j]", lambda a1: a1)):
        a, b = rng.integers(-9, 9, size=(6, 6), dtype=np.int32), np.zeros((6, 6), np.int32)
        fused = 1 if second == "a[i, j]" else 2
        _, fb = run_both(lambda fuse, s=second: make(fuse, s), (a, b), fused, 2)
        np.testing.assert_array_equal(fb, ref(a + 1))


def test_chain_fuses_greedily_and_reports_sources(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, c: I32, n: qd.i32):
            for i in range(n):
                a[i] = c[i] + 1
            for i in range(n):
                b[i] = a[i] * 2
            for i in range(n):
                c[i] = a[i] + b[i]
            for i in range(n):
                a[i] = c[i + 1]          # reads another thread's c: starts a new task
            for i in range(n):
                b[i] = a[i] - 1
        return k

    a, b, c = (ints(rng) for _ in range(3))
    i = np.arange(N)
    ra, rb, rc = a.copy(), b.copy(), c.copy()
    ra[i] = c[i] + 1
    rb[i] = ra[i] * 2
    rc[i] = ra[i] + rb[i]
    ra[i] = rc[i + 1]
    rb[i] = ra[i] - 1
    fa, fb, fc = run_both(make, (a, b, c, N), 2, 5)
    for got, ref in ((fa, ra), (fb, rb), (fc, rc)):
        np.testing.assert_array_equal(got, ref)
    tasks = make(True).tasks(a, b, c, N)
    assert [len(t.fused_from) for t in tasks] == [3, 2]
    assert "fused from 3 loops" in tasks[0].describe()
    lines = [int(loc.rsplit(":", 1)[1]) for loc in tasks[0].fused_from + tasks[1].fused_from]
    assert lines == sorted(lines) and len(set(lines)) == 5


# -- bounds ----------------------------------------------------------------------------------------------

def test_bounds_identity(rng):
    def make(fuse, second):
        src = f"""
@qd.kernel(fuse=fuse)
def k(a: I32, b: I32, n: qd.i32, m: qd.i32):
    for i in range(n):
        a[i] = a[i] + 1
    for i in {second}:
        b[i] = b[i] * 2
"""
        ns = {"qd": qd, "I32": I32, "fuse": fuse}
        exec(compile(src, "<fusion bounds>", "exec"), ns)
        return ns["k"]

    cases = [("range(n)", 1), ("range(0, n)", 1), ("range(m)", 2), ("range(n + 0)", 2), ("range(1, n)", 2),
             ("range(n - 1)", 2), ("qd.ndrange(n)", 1)]
    for second, fused in cases:
        a, b = ints(rng), ints(rng)
        lo = 1 if second == "range(1, n)" else 0
        hi = N - 1 if second == "range(n - 1)" else N
        ra, rb = a.copy(), b.copy()
        ra[:N] += 1
        rb[lo:hi] *= 2
        fa, fb = run_both(lambda fuse, s=second: make(fuse, s), (a, b, N, N), fused, 2)
        np.testing.assert_array_equal(fa, ra)
        np.testing.assert_array_equal(fb, rb)


def test_constant_and_shape_bounds(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, c: I32):
            for i in range(16):
                a[i] = a[i] + 1
            for i in range(0, 16):
                b[i] = b[i] + 2
            for i in range(a.shape[0]):
                c[i] = c[i] + 3
            for i in a:
                a[i] = a[i] * 2
            for i in range(b.shape[0]):      # same length, another argument: not provably equal
                b[i] = b[i] * 2
        return k

    a, b, c = (ints(rng) for _ in range(3))
    ra, rb, rc = a.copy(), b.copy(), c.copy()
    ra[:16] += 1
    rb[:16] += 2
    rc += 3
    ra *= 2
    rb *= 2
    fa, fb, fc = run_both(make, (a, b, c), 3, 5)
    for got, ref in ((fa, ra), (fb, rb), (fc, rc)):
        np.testing.assert_array_equal(got, ref)


def test_value_from_earlier_serial_task_is_the_same_bound(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, c: I32):
            m = c[0] % 20 + 20
            for i in range(m):
                a[i] = a[i] + 1
            for i in range(m):
                b[i] = b[i] - a[i]
        return k

    a, b, c = (ints(rng) for _ in range(3))
    m = c[0] % 20 + 20
    ra, rb = a.copy(), b.copy()
    ra[:m] += 1
    rb[:m] -= ra[:m]
    fa, fb, _ = run_both(make, (a, b, c), 2, 3)   # serial task + one fused task
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


# -- what blocks fusion -------------------------------------------------------------------------------

def test_serial_task_between_blocks_fusion(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, n: qd.i32):
            for i in range(n):
                a[i] = a[i] + 1
            b[0] = a[3]
            for i in range(n):
                b[i + 1] = b[i + 1] + a[i]
        return k

    a, b = ints(rng), ints(rng)
    ra, rb = a.copy(), b.copy()
    ra[:N] += 1
    rb[0] = ra[3]
    rb[1:N + 1] += ra[:N]
    fa, fb = run_both(make, (a, b, N), 3, 3)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


def test_serialized_loop_does_not_fuse(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, n: qd.i32):
            qd.loop_config(serialize=True)
            for i in range(n):
                a[i] = a[i] * 2
            for i in range(n):
                b[i] = b[i] + 1
        return k

    a, b = ints(rng), ints(rng)
    ra, rb = a.copy(), b.copy()
    ra[:N] *= 2
    rb[:N] += 1
    fa, fb = run_both(make, (a, b, N), 2, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


def test_graph_kernel_never_fuses(rng):
    @qd.kernel(graph=True, fuse=True)
    def k(a: I32, b: I32):
        for i in range(N):
            a[i] = a[i] + 1
        for i in range(N):
            b[i] = b[i] + 2

    a, b = ints(rng), ints(rng)
    ra, rb = a.copy(), b.copy()
    assert len(k.tasks(a, b)) == 2
    k(a, b)
    ra[:N] += 1
    rb[:N] += 2
    np.testing.assert_array_equal(a, ra)
    np.testing.assert_array_equal(b, rb)


def test_locals_are_private_to_each_loop(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: F32, c: I32, n: qd.i32):
            t = 5
            for i in range(n):
                v = a[i] * 2             # an int local
                a[i] = v + t
            for i in range(n):
                v = b[i] * 0.5           # a float local of the same name
                b[i] = v
            for i in range(n):
                t = c[i]                 # rebinds t, which loop 1 reads: must not share a thread
                c[i] = t + 1
        return k

    a, c = ints(rng), ints(rng)
    b = rng.standard_normal(SIZE).astype(np.float32)
    ra, rb, rc = a.copy(), b.copy(), c.copy()
    ra[:N] = a[:N] * 2 + 5
    rb[:N] = b[:N] * np.float32(0.5)
    rc[:N] += 1
    fa, fb, fc = run_both(make, (a, b, c, N), 2, 3)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)
    np.testing.assert_array_equal(fc, rc)


def test_pure_code_between_loops_is_hoisted(rng):
    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, n: qd.i32):
            for i in range(n):
                a[i] = a[i] + 1
            m = n * 2 + 1
            for i in range(n):
                b[i] = a[i] * m
        return k

    a, b = ints(rng), ints(rng)
    ra, rb = a.copy(), b.copy()
    ra[:N] += 1
    rb[:N] = ra[:N] * (2 * N + 1)
    fa, fb = run_both(make, (a, b, N), 1, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


def test_unknown_use_of_an_array_blocks_fusion(rng):
    import numba

    @numba.njit
    def bump(arr, i):
        arr[i + 1] += 1

    def make(fuse):
        @qd.kernel(fuse=fuse)
        def k(a: I32, b: I32, n: qd.i32):
            for i in range(n):
                b[i] = a[i]
            for i in range(n):
                bump(a, 2 * i)           # writes a[2i + 1]: another thread's element
        return k

    a, b = ints(rng), ints(rng)
    ra, rb = a.copy(), b.copy()
    rb[:N] = a[:N]
    ra[2 * np.arange(N) + 1] += 1
    fa, fb = run_both(make, (a, b, N), 2, 2)
    np.testing.assert_array_equal(fa, ra)
    np.testing.assert_array_equal(fb, rb)


# -- knobs ------------------------------------------------------------------------------------------------

def _two_loops(**decorator):
    @qd.kernel(**decorator)
    def k(a: I32, b: I32):
        for i in range(N):
            a[i] = a[i] + 1
        for i in range(N):
            b[i] = a[i] * 2
    return k


def test_env_variables(monkeypatch):
    monkeypatch.delenv("QD_AGGRESSIVE_KERNEL_FUSION", raising=False)
    assert config.config_from_env().aggressive_kernel_fusion is False
    for value in ("1", "on", "TRUE", "Yes"):
        monkeypatch.setenv("QD_AGGRESSIVE_KERNEL_FUSION", value)
        assert config.config_from_env().aggressive_kernel_fusion is True
    monkeypatch.setenv("QD_AGGRESSIVE_KERNEL_FUSION", "maybe")
    with pytest.raises(ValueError):
        config.config_from_env()
    monkeypatch.setenv("QD_AGGRESSIVE_KERNEL_FUSION", "1")
    monkeypatch.setenv("QD_AGGRESSIVE_KERNEL_FUSION_RAW", "0")
    monkeypatch.setenv("QD_AGGRESSIVE_KERNEL_FUSION_DIAG", "1")
    monkeypatch.setenv("QD_KERNEL_FUSION_BUDGET", "77")
    cfg = config.config_from_env()
    assert (cfg.aggressive_kernel_fusion_raw, cfg.aggressive_kernel_fusion_diag, cfg.kernel_fusion_budget) == \
        (False, True, 77)
    qd.init()   # reads the environment
    a, b = ints(np.random.default_rng(1)), ints(np.random.default_rng(2))
    assert len(_two_loops().tasks(a, b)) == 2    # shared written 'a' and the RAW rule is off
    monkeypatch.setenv("QD_AGGRESSIVE_KERNEL_FUSION_RAW", "1")
    qd.init()
    assert len(_two_loops().tasks(a, b)) == 1


def test_init_option_and_decorator_override(rng, monkeypatch):
    monkeypatch.setenv("QD_AGGRESSIVE_KERNEL_FUSION", "0")
    a, b = ints(rng), ints(rng)
    qd.init()
    assert len(_two_loops().tasks(a, b)) == 2
    assert len(_two_loops(fuse=True).tasks(a, b)) == 1
    qd.init(aggressive_kernel_fusion=True)
    assert len(_two_loops().tasks(a, b)) == 1
    assert len(_two_loops(fuse=False).tasks(a, b)) == 2
    qd.init(aggressive_kernel_fusion=True, aggressive_kernel_fusion_raw=False)
    assert len(_two_loops().tasks(a, b)) == 2
    ra, rb = a.copy(), b.copy()
    ra[:N] += 1
    rb[:N] = ra[:N] * 2
    k = _two_loops()
    k(a, b)
    np.testing.assert_array_equal(a, ra)
    np.testing.assert_array_equal(b, rb)


def test_budget_blocks_large_merges(rng):
    a, b = ints(rng), ints(rng)
    qd.init(aggressive_kernel_fusion=True, kernel_fusion_budget=10)
    assert len(_two_loops().tasks(a, b)) == 2
    qd.init(aggressive_kernel_fusion=True, kernel_fusion_budget=10_000)
    assert len(_two_loops().tasks(a, b)) == 1


def test_diagnostics_name_fusions_and_reasons(rng, capfd):
    qd.init(aggressive_kernel_fusion=True, aggressive_kernel_fusion_diag=True)

    @qd.kernel
    def k(a: I32, b: I32, n: qd.i32, m: qd.i32):
        for i in range(n):
            a[i] = a[i] + 1
        for i in range(n):
            b[i] = a[i] * 2
        for i in range(n):
            b[i] = a[i // 2]
        for i in range(m):
            a[i] = 0

    a, b = ints(rng), ints(rng)
    assert len(k.tasks(a, b, N, N)) == 3
    err = capfd.readouterr().err
    assert "kernel 'k': 4 range-for tasks -> 3" in err
    assert "fused   0 with 1 (same-thread read-after-write on 'a'" in err
    assert "'a'[i // 2]" in err or "i // 2" in err or "not injective" in err
    assert "launch bounds differ" in err


# -- differential fuzzer ------------------------------------------------------------------------------

FUZZ_ARRAYS = ("A", "B", "C", "D")
FUZZ_INJECTIVE = ("i", "i + 1", "(i + 3) - 1", "i * 2", "i * 3", "i << 1", "i ^ 5", "-i + 20", "~i + 20", "20 - i",
                  "(i + 2) * 2")
FUZZ_OTHER = ("i // 2", "i % 4", "min(i, 5)", "max(i, 3)", "i & 3", "i | 1", "i >> 1", "0", "3",
              "(i + 1) // 2", "R[i] % 16", "int(i * 1.0)")
FUZZ_BOUNDS = ("range(n)", "range(n)", "range(16)", "range(m)", "range(0, n)", "range(1, n)")
# every index stays within [0, 48) for 0 <= i < 16 (Quadrants does not define negative indices)


@st.composite
def fuzz_kernels(draw):
    lines = []
    for _ in range(draw(st.integers(2, 6))):
        lines.append(f"    for i in {draw(st.sampled_from(FUZZ_BOUNDS))}:")
        dsts = draw(st.lists(st.sampled_from(FUZZ_ARRAYS), min_size=1, max_size=2, unique=True))
        sources = [s for s in FUZZ_ARRAYS if s not in dsts]
        for dst in dsts:
            terms = []
            for _ in range(draw(st.integers(1, 2))):
                src = draw(st.sampled_from(sources + ["R"]))
                terms.append(f"{src}[{draw(st.sampled_from(FUZZ_INJECTIVE + FUZZ_OTHER))}]")
            rhs = " + ".join(terms) + f" + {draw(st.integers(-5, 5))}"
            kind = draw(st.sampled_from(("store", "update", "atomic")))
            if kind == "atomic":   # atomics may target any address without racing
                lines.append(f"        {dst}[{draw(st.sampled_from(FUZZ_INJECTIVE + FUZZ_OTHER[:-2]))}] += {rhs}")
            else:                  # plain stores use an injective index: no race inside the loop
                w = draw(st.sampled_from(FUZZ_INJECTIVE))
                own = f"{dst}[{w}] * 3 + " if kind == "update" else ""
                lines.append(f"        {dst}[{w}] = {own}{rhs}")
    return "\n".join(lines)


def _build(body, fuse):
    src = ("def k(A: I64, B: I64, C: I64, D: I64, R: I64, n: qd.i32, m: qd.i32):\n" + body + "\n")
    ns = {"qd": qd, "I64": qd.types.ndarray(dtype=qd.i64, ndim=1)}
    exec(compile(src, "<fusion fuzz>", "exec"), ns)
    return qd.kernel(fuse=fuse)(ns["k"]), ns["k"]


def _fuzz_args(seed, n, m):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-1000, 1000, size=48, dtype=np.int64) for _ in range(4)]
    arrays.append(rng.integers(0, 48, size=48, dtype=np.int64))
    return arrays, n, m


FUZZ_EXAMPLES = int(os.environ.get("QD_FUSION_FUZZ_EXAMPLES", "150"))
FUZZ_SMOKE_EXAMPLES = 6
# Each example compiles one random kernel (~1 s on a CI core), then runs it on several inputs. The
# default test run has a smoke-sized fuzz of each property; the full-size one is marked slow
# (python -m pytest -m slow), with QD_FUSION_FUZZ_EXAMPLES examples.
FUZZ_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))


def _check_fused_equals_sequential_reference(body, seed, m_equal):
    fused, python = _build(body, True)
    for n in (16, 1 + seed % 15, 0):
        m = n if m_equal else (n + 3) % 17
        arrays, _, _ = _fuzz_args(seed + n, n, m)
        got = [a.copy() for a in arrays]
        ref = [a.copy() for a in arrays]
        fused(*got, n, m)
        python(*ref, n, m)
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g, r, err_msg=body)


def _check_fused_equals_unfused_bit_for_bit(body, seed):
    fused, _ = _build(body, True)
    unfused, _ = _build(body, False)
    for n in (16, 1 + seed % 15):
        arrays, _, m = _fuzz_args(seed + n, n, n)
        got = [a.copy() for a in arrays]
        ref = [a.copy() for a in arrays]
        fused(*got, n, m)
        unfused(*ref, n, m)
        assert len(fused.tasks(*got, n, m)) <= len(unfused.tasks(*ref, n, m))
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g, r, err_msg=body)


@pytest.mark.slow
@pytest.mark.no_cuda_compile_check  # hundreds of random kernels: their CUDA path is covered elsewhere
@settings(max_examples=FUZZ_EXAMPLES, **FUZZ_SETTINGS)
@given(body=fuzz_kernels(), seed=st.integers(0, 2**32 - 1), m_equal=st.booleans())
def test_fuzz_fused_equals_sequential_reference(body, seed, m_equal):
    """The fused kernel leaves exactly what the kernel run as plain sequential Python does:
    loop after loop, iteration after iteration — the semantics fusion must preserve."""
    _check_fused_equals_sequential_reference(body, seed, m_equal)


@pytest.mark.no_cuda_compile_check
@settings(max_examples=FUZZ_SMOKE_EXAMPLES, **FUZZ_SETTINGS)
@given(body=fuzz_kernels(), seed=st.integers(0, 2**32 - 1), m_equal=st.booleans())
def test_fuzz_fused_equals_sequential_reference_smoke(body, seed, m_equal):
    _check_fused_equals_sequential_reference(body, seed, m_equal)


@pytest.mark.slow
@pytest.mark.no_cuda_compile_check
@settings(max_examples=max(FUZZ_EXAMPLES // 5, 5), **FUZZ_SETTINGS)
@given(body=fuzz_kernels(), seed=st.integers(0, 2**32 - 1))
def test_fuzz_fused_equals_unfused_bit_for_bit(body, seed):
    _check_fused_equals_unfused_bit_for_bit(body, seed)


@pytest.mark.no_cuda_compile_check
@settings(max_examples=max(FUZZ_SMOKE_EXAMPLES // 2, 2), **FUZZ_SETTINGS)
@given(body=fuzz_kernels(), seed=st.integers(0, 2**32 - 1))
def test_fuzz_fused_equals_unfused_bit_for_bit_smoke(body, seed):
    _check_fused_equals_unfused_bit_for_bit(body, seed)
