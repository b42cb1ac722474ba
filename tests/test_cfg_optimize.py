"""Per-task CFG optimisation (passes/cfg_optimize.py): store-to-load forwarding, redundant loads and
dead stores on global data — the loads and stores each task keeps, and the same results with the
pass on and off (specific shapes, then random programs checked against a Python reference)."""

from __future__ import annotations

import importlib.util
import random

import numba
import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config
from qd_numba.frontend.keys import CODE_CONFIG

N = 16


@pytest.fixture
def cfg_off(arch):
    """Run the test's kernels with the pass off; the module's configuration again afterwards."""
    qd.init(arch=arch, cfg_optimization=False)
    yield
    qd.init(arch=arch)


def counts(task):
    """(loads, stores, atomics) of global data a task makes."""
    whats = [a.what for a in task.accesses]
    loads = whats.count("load") + whats.count("partial load")   # (a serial task's indices are not analysed)
    return loads, whats.count("store"), whats.count("atomic")


@pytest.fixture
def fabc():
    """Three f32 fields of N elements for one test: unused until the test runs, they belong to the
    qd.init in force at their first use."""
    return tuple(qd.field(qd.f32, shape=N, name=name) for name in ("fa", "fb", "fc"))


def range_tasks(kernel, *args):
    return [t for t in kernel.tasks(*args) if t.kind == "range_for"]


# -- shapes, one task each -----------------------------------------------------------------------

@numba.njit
def opaque(k):
    return k + 1


@qd.func
def plus_one(v):
    return v + 1.0


def _make_shapes():
    """The shapes kernel and its fields (fa, fb, fc), made under the qd.init in force: a field
    belongs to the qd.init it is first used under."""
    fa = qd.field(qd.f32, shape=N, name="fa")
    fb = qd.field(qd.f32, shape=N, name="fb")
    fc = qd.field(qd.f32, shape=N, name="fc")


    @qd.kernel
    def shapes(n: qd.i32):
        for i in range(N):                 # 0: store -> load forwarded; the f64 value is stored as f32
            fa[i] = fb[i] * 0.1
            fc[i] = fa[i] + 1.0
        for i in range(N):                 # 1: redundant loads merged
            fc[i] = fa[i] * fa[i] + fa[i]
        for i in range(N):                 # 2: a store overwritten before any read is dead
            fa[i] = 7.0
            fa[i] = fb[i] + 2.0
        for i in range(N):                 # 3: a store before `continue` is read after the task
            fa[i] = 3.0
            if fb[i] > 0.5:
                continue
            fa[i] = fb[i]
        for i in range(N):                 # 4: a store on one branch only: the load after the if stays
            if fb[i] > 0.5:
                fa[i] = 1.0
            fc[i] = fa[i]
        for i in range(N):                 # 5: a store before the if, no store in it: forwarded after
            fa[i] = fb[i] + 4.0
            if fb[i] > 0.5:
                fc[i] = 0.0
            else:
                fc[i] = 1.0
            fb[i] = fa[i]
        for i in range(N):                 # 6: an inner serial loop: the loop-carried load stays
            fa[i] = 0.0
            for _ in range(n):
                fa[i] = fa[i] + fb[i]
            fc[i] = fa[i]
        for i in range(N):                 # 7: atomics are never forwarded through, and keep the store
            fa[i] = 1.0
            qd.atomic_add(fa[i], fb[i])
            fc[i] = fa[i]
        for i in range(N):                 # 8: an opaque call is a barrier; a qd.func is inlined
            fa[i] = 5.0
            k = opaque(i)
            fc[i] = fa[i] + k
            fb[i] = plus_one(fc[i])
        for i in range(N):                 # 9: one index computed twice: one address
            fa[i] = fb[(i + 1) % N]
            fc[i] = fb[(i + 1) % N] + fa[i]
        for i in range(N):                 # 10: inner loop with break: stores before the break are kept
            fa[i] = -1.0
            for j in range(n):
                fa[i] = j * 1.0
                if j == 2:
                    break
                fa[i] = j * 10.0
            fc[i] = fa[i]

    return shapes, (fa, fb, fc)


def shapes_reference(a, b, c, n):
    b32 = np.float32
    a[:] = (b * 0.1).astype(np.float32)
    c[:] = a + b32(1.0)
    c[:] = a * a + a
    a[:] = b + b32(2.0)
    a[:] = np.where(b > 0.5, b32(3.0), b)
    a[:] = np.where(b > 0.5, b32(1.0), a)
    c[:] = a
    a[:] = b + b32(4.0)
    c[:] = np.where(b > 0.5, b32(0.0), b32(1.0))
    b[:] = a
    a[:] = 0.0
    for _ in range(n):
        a[:] = a + b
    c[:] = a
    a[:] = b32(1.0) + b
    c[:] = a
    c[:] = b32(5.0) + np.arange(N, dtype=np.float32) + 1
    b[:] = c + b32(1.0)
    a[:] = np.roll(b, -1)
    c[:] = np.roll(b, -1) + a
    last = min(n - 1, 2)
    a[:] = -1.0 if n == 0 else float(last) if last == 2 else last * 10.0
    c[:] = a


def _run_shapes(rng, n):
    shapes, fields = _make_shapes()
    init = [rng.random(N).astype(np.float32) for _ in range(3)]
    for f, v in zip(fields, init):
        f.from_numpy(v)
    shapes(n)
    ref = [v.copy() for v in init]
    shapes_reference(*ref, n)
    for f, r in zip(fields, ref):
        np.testing.assert_allclose(f.to_numpy(), r, rtol=1e-6)
    return [counts(t) for t in range_tasks(shapes, n)]


def test_shapes_keep_the_loads_and_stores_they_must(rng):
    got = _run_shapes(rng, 5)
    assert got[0] == (1, 2, 0)       # fb; fa's load forwarded
    assert got[1] == (1, 1, 0)       # three loads of fa, one kept
    assert got[2] == (1, 1, 0)       # fa = 7 removed
    assert got[3] == (1, 2, 0)       # both stores: the first one is the result of the `continue` path
    assert got[4] == (2, 2, 0)
    assert got[5][0] == 1            # fb only: fa forwarded over the if/else
    assert got[6][0] == 3            # fa (the loop's), fb, fa after the loop
    assert got[7] == (2, 2, 1)       # fb for the atomic, fa after it; the store of 1.0 kept
    assert got[8][:2] == (1, 3)      # fa after the barrier call; fc's load forwarded into plus_one
    assert got[9][0] == 1            # fb[(i + 1) % N] twice: one load; fa forwarded
    assert got[10][1] == 4           # every store is read on some path (break, end of the loop)


def test_shapes_with_the_pass_off(rng, cfg_off):
    got = _run_shapes(rng, 2)
    assert got[0] == (2, 2, 0) and got[1] == (3, 1, 0) and got[2] == (1, 2, 0)
    assert got[9][0] == 3


def test_ndarray_arguments_of_one_dtype_may_alias(rng, fabc):
    fa, _, _ = fabc
    @qd.kernel
    def alias(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1),
              z: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(x.shape[0]):
            x[i] = 1.0
            y[i] = 2.0
            z[i] = 3
            fa[i] = x[i] + z[i]

    # one qd.ndarray passed twice is one buffer on every target (numpy arguments are copied to
    # the device one by one on CUDA, so they alias only on the CPU)
    x = qd.ndarray(qd.f32, shape=(N,))
    x.from_numpy(rng.random(N).astype(np.float32))
    z = rng.integers(0, 9, N).astype(np.int32)
    alias(x, x, z)
    np.testing.assert_array_equal(fa.to_numpy(), np.full(N, 5.0, np.float32))
    (task,) = range_tasks(alias, x, x, z)
    assert counts(task) == (1, 4, 0)     # x[i] reloaded after y's store; z[i] forwarded
    y = rng.random(N).astype(np.float32)
    alias(x, y, z)
    np.testing.assert_array_equal(fa.to_numpy(), np.full(N, 4.0, np.float32))


def test_a_view_of_global_data_stops_the_optimisation_of_its_resource(rng, fabc):
    _, fb, _ = fabc
    @qd.kernel
    def view(a: qd.types.ndarray(dtype=qd.f32, ndim=2), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            row = a[i]
            a[i, 0] = 1.0
            row[0] = 5.0           # a store through the view: a[i, 0] is 5 now
            b[i] = a[i, 0] + fb[i] + fb[i]

    a = rng.random((N, 3)).astype(np.float32)
    b = np.zeros(N, np.float32)
    fb_values = rng.random(N).astype(np.float32)
    fb.from_numpy(fb_values)
    view(a, b)
    np.testing.assert_allclose(b, 5.0 + 2 * fb_values, rtol=1e-6)
    (task,) = range_tasks(view, a, b)
    assert counts(task)[0] == 3              # the view, a[i, 0] (kept), fb[i] once


def test_serial_task_and_0d_fields(rng):
    counter = qd.field(qd.i32, shape=(), name="counter")
    ints = qd.field(qd.i32, shape=N, name="ints")

    @qd.kernel
    def serial(n: qd.i32) -> qd.i32:
        counter[None] = 0
        counter[None] = ints[0] + 1
        if n > 0:
            for j in range(n):
                counter[None] = counter[None] + ints[j]
                if j > 3:
                    break
        ints[1] = counter[None]
        return counter[None]

    data = rng.integers(0, 9, N).astype(np.int32)
    ints.from_numpy(data)
    n = 6
    expected = data[0] + 1 + int(np.sum(data[:5]))
    assert serial(n) == expected
    assert counter[None] == expected and ints[1] == expected
    (task,) = serial.tasks(n)
    loads, stores, _ = counts(task)
    assert stores == 3          # counter = 0 is dead
    assert loads == 4           # ints[0], counter and ints[j] in the loop, counter after it (twice: merged)


def test_f16_and_vector_fields(rng, fabc):
    fa, fb, fc = fabc
    half = qd.field(qd.f16, shape=N, name="half")
    vec = qd.Vector.field(3, qd.f32, shape=N, name="vec")

    @qd.kernel
    def fields():
        for i in range(N):
            half[i] = fb[i] * 3.0
            fa[i] = half[i]                  # not forwarded: the store rounds to f16
            fc[i] = vec[i][0] + vec[i][1]    # one load of vec[i]

    b = rng.random(N).astype(np.float32)
    v = rng.random((N, 3)).astype(np.float32)
    fb.from_numpy(b)
    vec.from_numpy(v)
    fields()
    np.testing.assert_array_equal(fa.to_numpy(), (b * np.float32(3.0)).astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(fc.to_numpy(), v[:, 0] + v[:, 1], rtol=1e-6)
    (task,) = range_tasks(fields)
    assert counts(task)[0] == 3          # fb, half, vec


def test_debug_forwards_but_keeps_every_store(rng, fabc, arch):
    fa, fb, fc = fabc
    qd.init(arch=arch, debug=True)
    try:
        @qd.kernel
        def dbg():
            for i in range(N):
                fa[i] = 7.0
                fa[i] = fb[i] + 1.0
                fc[i] = fa[i]

        b = rng.random(N).astype(np.float32)
        fb.from_numpy(b)
        dbg()
        np.testing.assert_allclose(fc.to_numpy(), b + 1, rtol=1e-6)
        (task,) = range_tasks(dbg)
        assert counts(task) == (1, 3, 0)
    finally:
        qd.init(arch=arch)


def test_knobs_are_read_from_the_environment_and_change_the_code_key(monkeypatch):
    monkeypatch.setenv("QD_CFG_OPTIMIZATION", "0")
    monkeypatch.setenv("QD_CFG_OPTIMIZATION_PER_TASK", "off")
    cfg = config.config_from_env()
    assert cfg.cfg_optimization is False and cfg.cfg_optimization_per_task is False
    monkeypatch.delenv("QD_CFG_OPTIMIZATION")
    monkeypatch.delenv("QD_CFG_OPTIMIZATION_PER_TASK")
    cfg = config.config_from_env(cfg_optimization_per_task=False)
    assert cfg.cfg_optimization is True and cfg.cfg_optimization_per_task is False
    assert {"cfg_optimization", "cfg_optimization_per_task"} <= CODE_CONFIG


def test_per_task_off_disables_the_pass(rng, arch):
    qd.init(arch=arch, cfg_optimization_per_task=False)
    try:
        got = _run_shapes(rng, 3)
    finally:
        qd.init(arch=arch)
    assert got[0][0] == 2 and got[2][1] == 2


# -- differential fuzzer: random programs, pass on and off, and a Python reference --------------------

INTS = ("A", "B", "x", "y")          # i32 fields A, B; i32 ndarrays x, y (x and y may be one array)
SIZE = N + 2


class _Program:
    """A random kernel: serial snippets and range-for loops over i32/f32 fields, 0-d S and two
    ndarrays; its kernel source and a Python rendering that runs the same steps on numpy arrays."""

    def __init__(self, rnd: random.Random, loops: int):
        self.rnd = rnd
        self.kernel_lines, self.py_lines = [], []
        for _ in range(loops):
            self._serial(1)
            self._emit(1, "for i in range(N):", "for i in range(N):")
            self._body(2, in_loop=True)
        self._serial(1)

    def _emit(self, depth, kernel, py=None):
        self.kernel_lines.append("    " * depth + kernel)
        self.py_lines.append("    " * depth + (kernel if py is None else py))

    # expressions: (kernel text, python text, is_float)
    def _index(self, in_loop, inner):
        choices = ["0", "1"] + (["i", "i + 1", "k"] * 2 if in_loop else []) + (["j"] * 2 if inner else [])
        return self.rnd.choice(choices)

    def _load(self, in_loop, inner):
        name = self.rnd.choice(INTS + ("F", "S"))
        if name == "S":
            return "S[None]", "S[()]", False
        idx = self._index(in_loop, inner)
        return f"{name}[{idx}]", f"{name}[{idx}]", name == "F"

    def _expr(self, in_loop, inner, depth=0):
        r = self.rnd.random()
        if r < 0.45 or depth > 1:
            return self._load(in_loop, inner)
        if r < 0.6:
            c = str(self.rnd.randint(-3, 3))
            return c, c, False
        if r < 0.7:
            t = self.rnd.choice(("t0", "t1", "t2"))
            return t, t, t in self.float_locals
        a, b = self._expr(in_loop, inner, depth + 1), self._expr(in_loop, inner, depth + 1)
        if r < 0.8 and a[2]:
            return f"({a[0]} * 0.5)", f"({a[1]} * 0.5)", True
        op = self.rnd.choice("+-")
        return f"({a[0]} {op} {b[0]})", f"({a[1]} {op} {b[1]})", a[2] or b[2]

    def _int_expr(self, in_loop, inner):
        for _ in range(20):
            e = self._expr(in_loop, inner)
            if not e[2]:
                return e
        return "1", "1", False

    def _serial(self, depth):
        self.float_locals = set()
        self._emit(depth, "t0 = 0", "t0 = 0")
        self._emit(depth, "t1 = 0", "t1 = 0")
        self._emit(depth, "t2 = 0", "t2 = 0")
        self._emit(depth, "if n > 0:", "if n > 0:")
        self._emit(depth + 1, "k = 0", "k = 0")
        for _ in range(self.rnd.randint(1, 3)):
            self._statement(depth + 1, in_loop=False, inner=False, depth_left=2)

    def _body(self, depth, in_loop):
        self.float_locals = set()
        self._emit(depth, "t0 = 0", "t0 = 0")
        self._emit(depth, "t1 = 0", "t1 = 0")
        self._emit(depth, "t2 = 0", "t2 = 0")
        self._emit(depth, "k = i", "k = i")
        for _ in range(self.rnd.randint(3, 7)):
            self._statement(depth, in_loop=True, inner=False, depth_left=2)

    def _statement(self, depth, in_loop, inner, depth_left):
        r = self.rnd.random()
        if r < 0.35:
            name = self.rnd.choice(INTS + ("F", "S"))
            value = self._expr(in_loop, inner) if name == "F" or self.rnd.random() < 0.3 else \
                self._int_expr(in_loop, inner)
            target = ("S[None]", "S[()]") if name == "S" else (f"{name}[{self._index(in_loop, inner)}]",) * 2
            self._emit(depth, f"{target[0]} = {value[0]}", f"{target[1]} = {value[1]}")
        elif r < 0.45:
            name = self.rnd.choice(("A", "B", "x", "S"))
            value = self._expr(in_loop, inner)
            target = ("S[None]", "S[()]") if name == "S" else (f"{name}[{self._index(in_loop, inner)}]",) * 2
            if self.rnd.random() < 0.5 and "t2" not in value[0]:
                # (t = qd.atomic_add(G[I], t) is wrong before this pass: not what this test is about)
                self._emit(depth, f"t2 = qd.atomic_add({target[0]}, {value[0]})",
                           f"t2 = atomic_add({target[1].split('[')[0]}, {_py_index(target[1])}, {value[1]})")
            else:   # the atomic converts the value to the element's integer type first
                self._emit(depth, f"{target[0]} += {value[0]}", f"{target[1]} += int({value[1]})")
        elif r < 0.6:
            t = self.rnd.choice(("t0", "t1"))
            value = self._expr(in_loop, inner)
            self._emit(depth, f"{t} = {value[0]}", f"{t} = {value[1]}")
            (self.float_locals.add if value[2] else self.float_locals.discard)(t)
        elif r < 0.67 and in_loop:
            k = self.rnd.choice(("i", "i + 1", "0"))
            self._emit(depth, f"k = {k}", f"k = {k}")
        elif r < 0.82 and depth_left:
            cond = self._expr(in_loop, inner)
            c = self.rnd.randint(-2, 2)
            saved = set(self.float_locals)
            self._emit(depth, f"if {cond[0]} > {c}:", f"if {cond[1]} > {c}:")
            self._block(depth + 1, in_loop, inner, depth_left - 1)
            if self.rnd.random() < 0.5:
                self._emit(depth, "else:")
                self._block(depth + 1, in_loop, inner, depth_left - 1)
            self.float_locals |= saved
        elif r < 0.92 and depth_left and not inner:
            self._emit(depth, "for j in range(3):")
            self._block(depth + 1, in_loop, True, depth_left - 1)
        elif (inner or in_loop) and depth_left < 2:
            cond = self._expr(in_loop, inner)
            c = self.rnd.randint(-2, 2)
            self._emit(depth, f"if {cond[0]} > {c}:", f"if {cond[1]} > {c}:")
            self._emit(depth + 1, self.rnd.choice(("continue", "break")) if inner else "continue")
        else:
            self._statement(depth, in_loop, inner, 0)

    def _block(self, depth, in_loop, inner, depth_left):
        for _ in range(self.rnd.randint(1, 3)):
            self._statement(depth, in_loop, inner, depth_left)

    def kernel_source(self) -> str:
        head = ["import qd_numba as qd", f"N = {N}",
                f"A = qd.field(qd.i32, shape={SIZE})", f"B = qd.field(qd.i32, shape={SIZE})",
                f"F = qd.field(qd.f32, shape={SIZE})", "S = qd.field(qd.i32, shape=())", "",
                "@qd.kernel",
                "def program(x: qd.types.ndarray(dtype=qd.i32, ndim=1), "
                "y: qd.types.ndarray(dtype=qd.i32, ndim=1), n: qd.i32):"]
        return "\n".join(head + self.kernel_lines) + "\n"

    def python_source(self) -> str:
        head = [f"N = {N}", "", "def atomic_add(g, idx, v):", "    old = g[idx]", "    g[idx] += int(v)",
                "    return old", "", "def program(A, B, F, S, x, y, n):"]
        return "\n".join(head + self.py_lines) + "\n"


def _py_index(target):
    inside = target.split("[", 1)[1].rsplit("]", 1)[0]
    return "()" if inside == "()" else inside


def _load_module(path, source, name):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _differential(tmp_path, arch, seed, programs, loops):
    rnd = random.Random(seed)
    data_rng = np.random.default_rng(seed)
    for p in range(programs):
        prog = _Program(rnd, loops)
        init = {name: data_rng.integers(-4, 5, SIZE).astype(np.int32) for name in ("A", "B", "x", "y")}
        init["F"] = (data_rng.integers(-8, 9, SIZE) / 4).astype(np.float32)
        init["S"] = np.array(data_rng.integers(-4, 5), np.int32)
        same = p % 2 == 1          # every other program: x and y are one array
        reference = {k: v.copy() for k, v in init.items()}
        if same:
            reference["y"] = reference["x"]
        py = _load_module(tmp_path / f"ref_{seed}_{p}.py", prog.python_source(), f"ref_{seed}_{p}")
        with np.errstate(all="ignore"):
            py.program(reference["A"], reference["B"], reference["F"], reference["S"], reference["x"],
                       reference["y"], 1)
        results = []
        for on in (True, False):
            qd.init(arch=arch, cfg_optimization=on, cpu_max_num_threads=1)
            mod = _load_module(tmp_path / f"prog_{seed}_{p}_{on}.py", prog.kernel_source(), f"prog_{seed}_{p}_{on}")
            for name in ("A", "B", "F"):
                getattr(mod, name).from_numpy(init[name])
            mod.S[None] = int(init["S"])
            x = init["x"].copy()
            y = x if same else init["y"].copy()
            mod.program(x, y, 1)
            results.append({"A": mod.A.to_numpy(), "B": mod.B.to_numpy(), "F": mod.F.to_numpy(),
                            "S": np.array(mod.S[None], np.int32), "x": x, "y": y})
        for name in ("A", "B", "F", "S", "x", "y"):
            for got in results:
                np.testing.assert_array_equal(got[name], reference[name], err_msg=f"{name}\n{prog.kernel_source()}")


@pytest.fixture
def serial_cpu(arch):
    if arch != "cpu":
        pytest.skip("the reference runs the threads in order: a race between threads differs on a GPU")
    yield
    qd.init(arch=arch)


@pytest.mark.no_cuda_compile_check
def test_random_programs_pass_on_and_off_agree(tmp_path, serial_cpu):
    _differential(tmp_path, "cpu", seed=3, programs=2, loops=3)


@pytest.mark.slow
@pytest.mark.no_cuda_compile_check
@pytest.mark.parametrize("seed", range(10, 20))
def test_random_programs_pass_on_and_off_agree_full(tmp_path, serial_cpu, seed):
    _differential(tmp_path, "cpu", seed=seed, programs=3, loops=6)
