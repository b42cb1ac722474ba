"""How a kernel splits into CUDA task kernels (no GPU needed): which tasks launch, which values
are recomputed or passed through temporaries, the host-side iteration counts, and the kernels
GPU targets reject. The numbers are checked against independent Python/numpy references."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba.targets.cuda.compile import numba_cuda_importable

pytestmark = pytest.mark.skipif(not numba_cuda_importable(), reason="needs numba-cuda")


def _split(kernel, param_types, templates=None):
    from qd_numba.targets.cuda import plan as qc
    from qd_numba.targets.cuda import tasks as cuda_tasks

    state = qc.compile_state(kernel, param_types, templates or {})
    slots = {}
    plan_ir, compiled, temp_types = qc.compile_tasks(kernel, state, (9, 0),
                                                     lambda f: slots.setdefault(id(f), len(slots)))
    return state, plan_ir, compiled, temp_types, cuda_tasks


xs = qd.field(qd.f32, shape=(64,))
total = qd.field(qd.f32, shape=())


@qd.kernel
def scaled_sum(k: qd.f32) -> qd.f32:
    total[None] = 0.0
    s = xs[0] * k
    for i in xs:
        total[None] += xs[i] * s
    return total[None] + 1.0


def test_value_from_serial_code_goes_through_a_temporary(rng):
    _, plan_ir, compiled, temp_types, _ = _split(scaled_sum, {"k": types.float32})
    units = [u for u, _, _ in compiled]
    assert [u.kind for u in units] == ["serial", "range_for", "serial"]
    assert set(units[0].stores) == {"s"} and set(units[1].loads) == {"s"}
    assert units[0].stores["s"] == units[1].loads["s"]
    assert units[2].returns and plan_ir.ret_slot is not None
    assert temp_types["s"] == types.float32        # f32 field element * f32 argument
    for _, _, c in compiled:
        assert c.cubin[:4] == b"\x7fELF" and c.entry_name in c.ptx
        assert [s.arg_name for s in c.param_layout[:2]] == ["qd_ctx", "qd_tmp"]
    # the same kernel on the CPU, against numpy
    d = rng.uniform(0, 1, 64).astype(np.float32)
    xs.from_numpy(d)
    got = scaled_sum(3.0)
    ref = float(np.sum(d.astype(np.float64) * np.float64(d[0] * np.float32(3.0))) + 1.0)
    assert got == pytest.approx(ref, rel=1e-5)


@qd.kernel
def pure_bounds(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    n = a.shape[0] - 1
    for i in range(n):
        b[i] = a[i + 1] - a[i]


def test_pure_values_are_recomputed_not_stored(rng):
    _, plan_ir, compiled, _, _ = _split(pure_bounds, {"a": types.float64[::1], "b": types.float64[::1]})
    units = [u for u, _, _ in compiled]
    assert [u.kind for u in units] == ["range_for"]
    assert not units[0].loads and plan_ir.temp_slots == 0
    a = rng.uniform(-1, 1, 40)
    b = np.zeros(40)
    pure_bounds(a, b)
    np.testing.assert_allclose(b[:-1], np.diff(a), rtol=1e-12)


vecs = qd.Vector.field(3, qd.f32, shape=(5, 7))


@qd.kernel
def many_spaces(a: qd.types.ndarray(dtype=qd.f32, ndim=2), lo: qd.i32, step: qd.i32,
                v: qd.types.ndarray(dtype=qd.types.vector(2, qd.f32), ndim=1)):
    for i in range(lo, a.shape[0], step):
        a[i, 0] = 1.0
    for i, j in qd.ndrange((1, a.shape[0]), a.shape[1] - 1):
        a[i, j] += 1.0
    for i in v:
        v[i][0] = 2.0
    for idx in qd.grouped(vecs):
        vecs[idx][1] = 3.0


def test_host_iteration_counts_match_python(rng):
    param_types = {"a": types.float32[:, ::1], "lo": types.int32, "step": types.int32,
                   "v": None}
    from qd_numba.frontend.args import ndarray_type as _ndarray_type

    v = np.zeros((11, 2), np.float32)
    param_types["v"] = _ndarray_type("v", many_spaces.params[3].annotation, v, False)
    state, plan_ir, compiled, _, cuda_tasks = _split(many_spaces, param_types)
    units = [u for u, _, _ in compiled]
    ndims = {name: getattr(ty, "ndim", None) for name, ty in param_types.items()}
    src, env = cuda_tasks.totals_source(state, units, ndims)
    ns = dict(env)
    exec(compile(src, "<totals>", "exec"), ns)
    for _ in range(5):
        rows, cols = int(rng.integers(1, 30)), int(rng.integers(1, 9))
        lo, step = int(rng.integers(-3, 10)), int(rng.integers(1, 4))
        a = np.zeros((rows, cols), np.float32)
        n_v = int(rng.integers(0, 20))
        v = np.zeros((n_v, 2), np.float32)
        got = ns["totals"]((a, lo, step, v))
        ref = (len(range(lo, rows, step)), max(0, rows - 1) * max(0, cols - 1), n_v, 5 * 7)
        assert got == ref
        # and the CPU run touches exactly those iterations
        # the launcher passes all kernel arguments (templates included) with their positions
        src2, env2 = cuda_tasks.totals_source(state, units, ndims, [1, 2, 3, 5])
        ns2 = dict(env2)
        exec(compile(src2, "<totals>", "exec"), ns2)
        assert ns2["totals"](("template", a, lo, step, "template", v)) == ref
        many_spaces(a, lo, step, v)
        assert (a[:, 0] >= 1).sum() >= len([i for i in range(lo, rows, step) if 0 <= i < rows]) - 0
        assert np.all(v[:, 0] == 2.0)


@qd.kernel
def conditional_loop(a: qd.types.ndarray(dtype=qd.f64, ndim=1), c: qd.f64):
    if c > 0:
        for i in range(a.shape[0]):
            a[i] = a[i] * c


@qd.kernel
def loop_in_while(a: qd.types.ndarray(dtype=qd.f64, ndim=1), rounds: qd.i32):
    r = 0
    while r < rounds:
        for i in range(a.shape[0]):
            a[i] = a[i] * 0.5 + 1.0
        r += 1
    for i in range(a.shape[0]):
        a[i] = a[i] + 3.0


def test_loops_under_runtime_control_flow_stay_serial_on_gpu(rng):
    # a loop under a runtime if, or inside a top-level while, is not at the outermost scope:
    # it runs inside its serial task (one GPU thread), as in Quadrants; the CPU parallelises it
    _, plan_ir, compiled, _, _ = _split(conditional_loop, {"a": types.float64[::1], "c": types.float64})
    assert [u.kind for u in plan_ir.units] == ["serial"]
    assert all(c.cubin for _, _, c in compiled)
    _, plan_ir, compiled, _, _ = _split(loop_in_while, {"a": types.float64[::1], "rounds": types.int32})
    assert [u.kind for u in plan_ir.units] == ["serial", "range_for"]  # the last loop is unconditional
    a = rng.uniform(-1, 1, 9)
    ref = a * 2.0
    conditional_loop(a, 2.0)
    np.testing.assert_allclose(a, ref, rtol=1e-12)
    conditional_loop(a, -1.0)
    np.testing.assert_allclose(a, ref, rtol=1e-12)
    b = rng.uniform(-1, 1, 12)
    ref = b.copy()
    for _ in range(3):
        ref = ref * 0.5 + 1.0
    loop_in_while(b, 3)
    np.testing.assert_allclose(b, ref + 3.0, rtol=1e-12)


def test_every_range_for_task_takes_ctx_and_tmp_first():
    _, _, compiled, _, _ = _split(pure_bounds, {"a": types.float64[::1], "b": types.float64[::1]})
    (_, tk, c), = compiled
    assert tk.params == ["a", "b"]
    names = [s.arg_name for s in c.param_layout]
    assert names[:2] == ["qd_ctx", "qd_tmp"] and names.count("a") == 7 and names.count("b") == 7


# -- the grid-stride loop (lowering/device.py GridRange) -------------------------------------------------

ys = qd.field(qd.f32, shape=(64,))


@qd.kernel
def scale_into(k: qd.f32):
    for i in xs:
        ys[i] = xs[i] * k


@qd.kernel
def skip_and_window():
    for i in xs:
        if xs[i] < 0.0:
            continue
        s = 0.0
        for j in range(4):
            s += xs[(i + j) % 64]
        ys[i] = s


@qd.kernel
def field_sum():
    for i in xs:
        total[None] += xs[i]


def _f32_loads(ptx):
    return len(re.findall(r"\bld(?:\.global)?(?:\.nc)?\.f32\b", ptx))


def test_grid_stride_loops_have_no_trip_count_and_stay_rolled():
    """A task's grid-stride loop computes no trip count (no 64-bit division per thread) and is not
    unrolled; a constant loop in its body still is; a reduction keeps Numba's range, whose trip
    count lets NVVM unroll it (several loads in flight per thread)."""
    (_, _, plain), = _split(scale_into, {"k": types.float32})[2]
    assert "div." not in plain.ptx and _f32_loads(plain.ptx) == 1
    (_, _, window), = _split(skip_and_window, {})[2]
    assert "div." not in window.ptx
    assert _f32_loads(window.ptx) == 5          # xs[i] once, the 4-step window unrolled
    (_, _, summed), = _split(field_sum, {})[2]
    assert "div." in summed.ptx and _f32_loads(summed.ptx) >= 4


def test_every_back_edge_of_the_grid_loop_is_marked():
    """``continue`` makes a second latch: both carry the loop id, the inner loop's latch none."""
    from llvmlite import ir as llir

    from qd_numba.lowering import device

    mod = llir.Module()
    fn = llir.Function(mod, llir.FunctionType(llir.VoidType(), [llir.IntType(1)] * 2), "f")
    entry, head, body, inner, tail, done = (fn.append_basic_block(n) for n in
                                            ("entry", "head", "body", "inner", "tail", "done"))
    b = llir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(fn.args[0], body, done)
    b.position_at_end(body)
    b.cbranch(fn.args[1], head, inner)          # continue
    b.position_at_end(inner)
    b.cbranch(fn.args[1], inner, tail)          # an inner loop
    b.position_at_end(tail)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    fn._qd_grid_headers = [head]
    assert device.keep_grid_loops_rolled(fn) == 2
    marked = [blk.name for blk in fn.blocks if "llvm.loop" in blk.terminator.metadata]
    assert marked == ["body", "tail"]
    text = str(mod)
    loop_id = re.search(r"!llvm.loop (!\d+)", text).group(1)
    assert re.search(rf"{loop_id} = !{{ {loop_id}, (!\d+) }}", text)       # refers to itself
    assert '!"llvm.loop.unroll.disable"' in text
    assert device.keep_grid_loops_rolled(fn) == 0     # the headers are consumed


@pytest.mark.cuda
def test_grid_stride_loops_compute_numpys_values(rng):
    """Loops far longer than the saturating grid (each thread iterates), shorter than a block,
    empty, with ``continue`` and a reduction, against numpy on the GPU."""
    @qd.kernel
    def shaped(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
        for i in range(n):
            if a[i] < -0.5:
                continue
            b[i] = a[i] * 2.0 + 1.0

    @qd.kernel
    def summed(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32) -> qd.f32:
        s = 0.0
        for i in range(n):
            s += a[i]
        return s

    size = 3_000_001
    a = rng.uniform(-1, 1, size).astype(np.float32)
    for n in (0, 1, 97, int(rng.integers(1000, 5000)), size):
        b = rng.uniform(-1, 1, size).astype(np.float32)
        want = b.copy()
        keep = a[:n] >= -0.5
        want[:n][keep] = a[:n][keep] * 2.0 + 1.0
        shaped(a, b, n)
        np.testing.assert_array_equal(b, want)
        assert summed(a, n) == pytest.approx(float(np.sum(a[:n], dtype=np.float64)), rel=1e-4, abs=1e-3)
