"""Reductions (passes/reductions.py): uniform-address atomics and kernel-scope locals as
per-thread/per-chunk partials with one combine (a warp shuffle reduction on CUDA).

References are numpy on random data: float sums in f64 with a tolerance, integer sums and
min/max exact. Sizes that are not multiples of 32 give loop tails (partial warps on CUDA).
The ``cuda`` tests run the same kernels on a GPU.
"""

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config as qd_config
from qd_numba.dtypes import to_numpy
from qd_numba.targets.cuda.compile import numba_cuda_importable

SIZES = (1, 31, 1037, 70_001)
DTYPES = (qd.f32, qd.f64, qd.i32, qd.i64)


def _data(rng, dtype, n):
    if dtype in (qd.f32, qd.f64):
        return rng.uniform(-1, 1, n).astype(to_numpy(dtype))
    return rng.integers(-1000, 1000, n).astype(to_numpy(dtype))


def _check_sum(got, want_f64, dtype, n):
    if dtype in (qd.f32, qd.f64):
        tol = (1e-5 if dtype == qd.f32 else 1e-12) * max(n, 1)
        assert abs(float(got) - want_f64) <= tol, (got, want_f64)
    else:
        assert int(got) == int(want_f64)


# -- kernels: one per element type, built once --------------------------------------------------

def _uniform_kernels(dtype):
    total = qd.field(dtype, shape=())
    hist = qd.field(dtype, shape=(4, 3))
    lo = qd.field(dtype, shape=())
    hi = qd.field(dtype, shape=())

    @qd.kernel
    def accumulate(a: qd.types.ndarray(dtype=dtype, ndim=1), k: qd.i32):
        for i in range(a.shape[0]):
            total[None] += a[i]                 # 0-d field
            hist[k, 1] -= a[i]                  # an index from an argument and a constant
            if a[i] > 0:                        # under an if: only some lanes update
                hist[k + 1, 2] += a[i]
            qd.atomic_min(lo[None], a[i])
            qd.atomic_max(hi[None], a[i])

    return accumulate, total, hist, lo, hi


_KERNELS = {}


def _kernels(dtype):
    """The uniform-address kernels of ``dtype`` and their fields, made once per qd.init (a field
    belongs to the qd.init it was first used under)."""
    runtime, kernels = _KERNELS.get(dtype, (None, None))
    if runtime is not qd_config.current:
        kernels = _uniform_kernels(dtype)
        _KERNELS[dtype] = (qd_config.current, kernels)
    return kernels


def _run_uniform(rng, dtype, n):
    accumulate, total, hist, lo, hi = _kernels(dtype)
    a = _data(rng, dtype, n)
    t0 = _data(rng, dtype, 1)[0]
    h0 = _data(rng, dtype, 12).reshape(4, 3)
    total[None] = t0
    hist.from_numpy(h0)
    lo[None], hi[None] = 0, 0
    k = int(rng.integers(0, 3))
    accumulate(a, k)
    a64 = a.astype(np.float64)
    _check_sum(total[None], float(t0) + a64.sum(), dtype, n)
    _check_sum(hist.to_numpy()[k, 1], float(h0[k, 1]) - a64.sum(), dtype, n)
    _check_sum(hist.to_numpy()[k + 1, 2], float(h0[k + 1, 2]) + a64[a64 > 0].sum(), dtype, n)
    untouched = np.ones((4, 3), bool)
    untouched[k, 1] = untouched[k + 1, 2] = False
    np.testing.assert_array_equal(hist.to_numpy()[untouched], h0[untouched])
    assert lo[None] == min(0, a.min()) and hi[None] == max(0, a.max())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uniform_atomics(rng, dtype):
    for n in SIZES:
        _run_uniform(rng, dtype, n)


@qd.kernel
def into_ndarray(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        out[1] += a[i]
        qd.atomic_max(out[2], a[i])


def test_uniform_atomics_on_ndarrays(rng):
    for n in SIZES:
        a = rng.uniform(-1, 1, n)
        out = rng.uniform(-1, 1, 4)
        want = out.copy()
        want[1] += a.sum()
        want[2] = max(want[2], a.max())
        into_ndarray(a, out)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12 * n)


def test_anchor_forward(rng):
    n_inner = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=())

    @qd.kernel
    def forward(x: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        for i in range(x.shape[0]):
            v = x[i]
            for _ in range(n_inner[None]):
                v = qd.sin(v) * 1.01
            loss[None] += v

    x = rng.uniform(-1, 1, 4099)
    n_inner[None] = 32
    loss[None] = 0.0
    forward(x)
    v = x.copy()
    for _ in range(32):
        v = np.sin(v) * 1.01
    assert np.isclose(loss[None], v.sum(), rtol=1e-12, atol=1e-9)


# -- what is and is not reduced ---------------------------------------------------------------------

counter = qd.field(qd.i32, shape=())
bins = qd.field(qd.i32, shape=(8,))
acc = qd.field(qd.f32, shape=())


@qd.kernel
def compact(v: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(v.shape[0]):
        if v[i] > 0:
            out[qd.atomic_add(counter[None], 1)] = v[i]     # the old value is used: not reduced


@qd.kernel
def histogram(v: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(v.shape[0]):
        bins[v[i] % 8] += 1                                  # the address depends on the loop


@qd.kernel
def read_back(v: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(v.shape[0]):
        acc[None] += v[i]
        out[i] = acc[None]                                   # the loop also reads acc: not reduced


@qd.kernel
def sum_acc(v: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(v.shape[0]):
        acc[None] += v[i]


def test_used_old_value_is_real(rng):
    v = rng.uniform(-1, 1, 3001).astype(np.float32)
    out = np.zeros_like(v)
    counter[None] = 0
    compact(v, out)
    k = int(np.count_nonzero(v > 0))
    assert counter[None] == k
    np.testing.assert_array_equal(np.sort(out[:k]), np.sort(v[v > 0]))


def test_varying_address_and_other_accesses(rng):
    v = rng.integers(0, 1000, 5000).astype(np.int32)
    b0 = rng.integers(-5, 5, 8).astype(np.int32)
    bins.from_numpy(b0)
    histogram(v)
    np.testing.assert_array_equal(bins.to_numpy(), b0 + np.bincount(v % 8, minlength=8))
    w = rng.uniform(0, 1, 777).astype(np.float32)
    out = np.zeros_like(w)
    acc[None] = 0.0
    read_back(w, out)
    assert np.isclose(acc[None], w.astype(np.float64).sum(), rtol=1e-5)
    assert np.all(out > 0) and np.all(out <= acc[None] * (1 + 1e-6))


def _range_task_ptx(kernel, param_types):
    from qd_numba.targets.cuda.plan import compile_check

    return [c.ptx for unit, _, c in compile_check(kernel, param_types, {}) if unit.kind == "range_for"]


@pytest.mark.skipif(not numba_cuda_importable(), reason="needs numba-cuda (CUDA compile check)")
def test_warp_reduction_in_cuda_code():
    from numba.core import types

    f32, i32 = types.Array(types.float32, 1, "C"), types.Array(types.int32, 1, "C")
    (reduced,) = _range_task_ptx(sum_acc, {"v": f32})
    assert reduced.count("shfl.sync.bfly") == 5 and reduced.count("activemask") == 1
    # all five updates of accumulate (0-d, argument index, under an if, min, max): 5 shuffles each
    (five,) = _range_task_ptx(_kernels(qd.f32)[0], {"a": f32, "k": types.int32})
    assert five.count("shfl.sync.bfly") == 25
    f64 = types.Array(types.float64, 1, "C")
    (nd,) = _range_task_ptx(into_ndarray, {"a": f64, "out": f64})
    assert nd.count("shfl.sync.bfly") == 2 * 10
    locals_ptx = _range_task_ptx(local_stats, {"a": f64, "out": f64})
    assert [p.count("shfl.sync.bfly") for p in locals_ptx] == [4 * 10, 0]   # 4 locals, 64-bit: 2 per step
    for kernel, params in ((compact, {"v": f32, "out": f32}), (histogram, {"v": i32}),
                           (read_back, {"v": f32, "out": f32})):
        (ptx,) = _range_task_ptx(kernel, params)
        assert "shfl.sync" not in ptx, kernel.name
    qd.init(warp_reduce=False)
    try:
        (plain,) = _range_task_ptx(sum_acc, {"v": f32})
        assert "shfl.sync" not in plain
    finally:
        qd.init()


def test_knob_off_gives_the_same_results(rng):
    """Differential: the same kernels with the optimisation off (qd.init(warp_reduce=False))."""
    results = []
    for warp_reduce in (True, False):
        qd.init(warp_reduce=warp_reduce)
        try:
            for dtype in (qd.f64, qd.i32):
                accumulate, total, hist, lo, hi = _uniform_kernels(dtype)
                a = _data(np.random.default_rng(7), dtype, 2049)
                total[None], lo[None], hi[None] = 1, 0, 0
                hist.fill(0)
                accumulate(a, 1)
                results.append((float(total[None]), hist.to_numpy().astype(np.float64), lo[None], hi[None]))
        finally:
            qd.init()
    on, off = results[:2], results[2:]
    for (t1, h1, l1, u1), (t2, h2, l2, u2) in zip(on, off):
        assert np.isclose(t1, t2, rtol=1e-12) and np.allclose(h1, h2, rtol=1e-12) and l1 == l2 and u1 == u2


# -- kernel-scope locals --------------------------------------------------------------------------------

init = qd.field(qd.f64, shape=())


@qd.kernel
def local_stats(a: qd.types.ndarray(dtype=qd.f64, ndim=1), out: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    s = init[None]
    d = 0.0
    m = -1e300
    lo = 1e300
    for i in range(a.shape[0]):
        s += a[i]
        if a[i] < 0:
            d -= a[i]
        qd.atomic_max(m, a[i])
        qd.atomic_min(lo, a[i])
    for i in range(a.shape[0]):
        out[i] = a[i] - s                  # a later task reads the reduced value
    return s + 2.0 * d + 4.0 * m + 8.0 * lo


@qd.kernel
def local_count(v: qd.types.ndarray(dtype=qd.i32, ndim=1), t: qd.i32) -> qd.i32:
    c = 0
    for i in range(v.shape[0]):
        if v[i] > t:
            c += 1
    return c


@qd.kernel
def local_f32(v: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    s = qd.f32(0.5)
    for i in v:
        s += v[i]
    return s


def test_kernel_scope_locals(rng):
    for n in (1, 33, 5000):
        a = rng.uniform(-1, 1, n)
        out = np.zeros(n)
        init[None] = float(rng.uniform(-1, 1))
        s = init[None] + a.sum()
        d = -a[a < 0].sum()
        want = s + 2 * d + 4 * a.max() + 8 * a.min()
        assert np.isclose(local_stats(a, out), want, rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(out, a - s, rtol=1e-12, atol=1e-10)
        v = rng.integers(-100, 100, n).astype(np.int32)
        t = int(rng.integers(-50, 50))
        assert local_count(v, t) == np.count_nonzero(v > t)
        w = rng.uniform(0, 1, n).astype(np.float32)
        assert np.isclose(local_f32(w), 0.5 + w.astype(np.float64).sum(), rtol=1e-5)


@qd.kernel
def plain_assignment(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    s = 0.0
    for i in range(a.shape[0]):
        s = a[i]
    return s


@qd.kernel
def non_atomic_update(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    s = 0.0
    for i in range(a.shape[0]):
        s = s + a[i]
    return s


@qd.kernel
def mixed_ops(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i]
        qd.atomic_max(s, a[i])
    return s


@qd.kernel
def old_value_used(a: qd.types.ndarray(dtype=qd.i32, ndim=1)) -> qd.i32:
    s = 0
    for i in range(a.shape[0]):
        a[i] = qd.atomic_add(s, 1)
    return s


@pytest.mark.parametrize("kernel, line", [(plain_assignment, "s = a[i]"), (non_atomic_update, "s = s + a[i]"),
                                          (mixed_ops, "s += a[i]"), (old_value_used, "a[i] = qd.atomic_add(s, 1)")],
                         ids=["plain", "non_atomic", "mixed", "old_value"])
def test_other_updates_of_kernel_scope_locals_stay_errors(kernel, line):
    dtype = np.int32 if kernel is old_value_used else np.float64
    with pytest.raises(qd.QuadrantsSyntaxError, match="local variable 's' is assigned inside a parallel") as e:
        kernel(np.ones(8, dtype))
    assert line in str(e.value)


@qd.kernel
def large_matrix_local(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    s = qd.Matrix([[0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0],
                   [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    for i in range(a.shape[0]):
        s += a[i]
    return s[0, 0]


def test_large_matrix_kernel_scope_local_is_a_clear_error():
    # vector and matrix locals of up to 16 elements reduce (tests/test_compat_loops.py)
    with pytest.raises(qd.QuadrantsTypeError, match=r"parallel reduction into a matrix\(5, 5"):
        large_matrix_local(np.ones(8))


def _fused_kernel():
    """A kernel of two fusable loops, a kernel-scope reduction and a field reduction, with fields
    of the qd.init in force."""
    fused_out = qd.field(qd.f64, shape=(5000,))
    fused_total = qd.field(qd.f64, shape=())

    @qd.kernel(fuse=True)
    def fused_loops(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
        s = 0.0
        for i in range(a.shape[0]):
            fused_out[i] = a[i] * 2.0
        for i in range(a.shape[0]):
            s += a[i]
            fused_total[None] += fused_out[i]
        return s

    return fused_loops, fused_total


def test_reductions_in_fused_loops_and_debug_mode(rng):
    for debug in (False, True):
        qd.init(debug=debug)
        try:
            fused_loops, fused_total = _fused_kernel()
            a = rng.uniform(-1, 1, 5000)
            fused_total[None] = 0.0
            assert np.isclose(fused_loops(a), a.sum(), rtol=1e-12, atol=1e-10)
            assert np.isclose(fused_total[None], 2 * a.sum(), rtol=1e-12, atol=1e-10)
            tasks = fused_loops.tasks(a)
            assert [t.kind for t in tasks] == ["serial", "range_for", "serial"] and len(tasks[1].fused_from) == 2
            _run_uniform(rng, qd.f32, 1037)
        finally:
            qd.init()


# -- on a GPU ------------------------------------------------------------------------------------------

@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_uniform_atomics(rng, on_cuda, dtype):
    for n in SIZES + (65_536, 2 ** 20 + 3):
        _run_uniform(rng, dtype, n)


@pytest.mark.cuda
def test_gpu_debug_mode_and_knob(rng, on_cuda):
    for options in ({"debug": True}, {"warp_reduce": False}):
        qd.init(arch=qd.cuda, **options)
        for dtype in (qd.f32, qd.i64):
            for n in (31, 4097):
                _run_uniform(rng, dtype, n)


@pytest.mark.cuda
def test_gpu_kernel_scope_locals_and_anchor(rng, on_cuda):
    test_kernel_scope_locals(rng)
    test_used_old_value_is_real(rng)
    test_varying_address_and_other_accesses(rng)
    test_uniform_atomics_on_ndarrays(rng)
    test_anchor_forward(rng)


def _ir_text(state):
    import io

    out = io.StringIO()
    state.func_ir.dump(file=out)
    return out.getvalue()


def test_pass_reports_changes_and_is_idempotent():
    from numba.core import types

    from qd_numba.passes.base import IRTools
    from qd_numba.passes.reductions import ReduceAtomics
    from qd_numba.targets.untyped import untyped_compile

    f64, i32 = types.Array(types.float64, 1, "C"), types.Array(types.int32, 1, "C")
    for kernel, params, reduced in ((local_stats, {"a": f64, "out": f64}, True), (histogram, {"v": i32}, False)):
        state = untyped_compile(kernel, IRTools.for_cpu(), params, {})
        text = _ir_text(state)
        assert ("reduce_combine" in text) == reduced
        assert ReduceAtomics().run(state) is False      # nothing left to reduce: the IR stays as it was
        assert _ir_text(state) == text
