"""Compile work grows linearly with the number of tasks, and compiles run without GC pauses.

Kernels of K = 4, 8, 16, 32 top-level loops (each a few float ops on its own pair of fields) are
compiled while counting the Python and builtin function calls (cProfile's call counts: the same
on every run, unlike timings) made inside each untyped pass and each compile stage (the
profiler's stage names). The log-log slope of calls against K must stay <= 1.2 per pass/stage.
Calls do not see work inside one builtin call (a set union of K elements is one call), so
passes/liveness.py, which removed such work, is also checked against Numba's live map here.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import math
import threading

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import profiler
from qd_numba.passes import pipeline
from qd_numba.passes.base import IRTools
from qd_numba.passes.liveness import Liveness
from qd_numba.targets.cuda.compile import numba_cuda_importable
from qd_numba.targets.untyped import gc_paused, untyped_compile

KS = (4, 8, 16, 32)
MAX_SLOPE = 1.2
N = 64


def k_loop_kernel(k: int):
    """A kernel of ``k`` top-level loops, loop j: ``b_j[i] = a_j[i] * 2 + 1``; and its fields."""
    fields = {}
    src = ["def k_loops():"]
    for j in range(k):
        fields[f"a{j}"] = qd.field(qd.f32, shape=(N,))
        fields[f"b{j}"] = qd.field(qd.f32, shape=(N,))
        src += [f"    for i in range({N}):", f"        b{j}[i] = a{j}[i] * 2.0 + 1.0"]
    ns = dict(fields)
    exec(compile("\n".join(src) + "\n", f"<k_loops {k}>", "exec"), ns)
    return qd.kernel(ns["k_loops"]), fields


class CallCounter:
    """Calls made inside each label (a pass or a stage), nested labels excluded from outer ones."""

    def __init__(self):
        self.stack: list[cProfile.Profile] = []
        self.calls: dict[str, int] = {}

    @contextlib.contextmanager
    def label(self, name):
        if self.stack:
            self.stack[-1].disable()
        counting = cProfile.Profile()
        self.stack.append(counting)
        counting.enable()
        try:
            yield
        finally:
            counting.disable()
            self.stack.pop()
            self.calls[name] = self.calls.get(name, 0) + sum(entry.callcount for entry in counting.getstats())
            if self.stack:
                self.stack[-1].enable()


@contextlib.contextmanager
def counting():
    """A CallCounter that counts every untyped pass and every compile stage while it is open."""
    counter = CallCounter()
    run_pass, stage = pipeline._run_pass, profiler.stage

    def counted_pass(state, p):
        with counter.label(f"pass {p.name}"):
            return run_pass(state, p)

    @contextlib.contextmanager
    def counted_stage(name, **kw):
        with counter.label(name), stage(name, **kw):
            yield

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "_run_pass", counted_pass)
        mp.setattr(profiler, "stage", counted_stage)
        yield counter


def slope(counts: dict[int, int]) -> float:
    """Least-squares slope of log(calls) against log(K)."""
    xs = [math.log(k) for k in counts]
    ys = [math.log(c) for c in counts.values()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def growth(compile_one) -> dict[str, dict[int, int]]:
    """label -> K -> calls, compiling a fresh K-loop kernel with ``compile_one(kernel)``."""
    compile_one(k_loop_kernel(1)[0])     # one-time set-up (imports, registries) is not growth
    per_label: dict[str, dict[int, int]] = {}
    with counting() as counter:
        for k in KS:
            counter.calls = {}
            compile_one(k_loop_kernel(k)[0])
            for name, calls in counter.calls.items():
                per_label.setdefault(name, {})[k] = calls
    return per_label


def check_linear(per_label, labels):
    assert set(labels) <= set(per_label), sorted(per_label)
    slopes = {name: slope(per_label[name]) for name in labels}
    superlinear = {name: (round(s, 2), per_label[name]) for name, s in slopes.items() if s > MAX_SLOPE}
    assert not superlinear, superlinear


def test_untyped_passes_and_cpu_task_split_grow_linearly():
    from qd_numba.targets import cpu

    def compile_one(kernel):
        state = untyped_compile(kernel, IRTools.for_cpu(), {}, {})
        with profiler.stage("task split"):
            cpu.build_driver(state, False)

    per_label = growth(compile_one)
    passes = {f"pass {p.name}" for stage in pipeline.UNTYPED_PIPELINE for p in stage.passes}
    check_linear(per_label, ["frontend", "untyped passes", "task split", *sorted(passes)])


@pytest.mark.slow
def test_cpu_codegen_grows_linearly():
    def compile_one(kernel):
        kernel()

    qd.init(arch=qd.cpu, cuda_compile_check=False)
    try:
        per_label = growth(compile_one)
    finally:
        qd.init(arch=qd.cpu)
    check_linear(per_label, ["task split", "typing + lowering"])


needs_numba_cuda = pytest.mark.skipif(not numba_cuda_importable(), reason="needs numba-cuda")


@pytest.fixture(scope="module")
def cuda_growth():
    from qd_numba.targets.cuda.plan import compile_check

    qd.init(arch=qd.cpu, compile_threads=1)   # NVVM/nvJitLink on this thread, where calls are counted
    try:
        return growth(lambda kernel: compile_check(kernel, {}, {}))
    finally:
        qd.init(arch=qd.cpu)


@needs_numba_cuda
def test_cuda_codegen_grows_linearly(cuda_growth):
    check_linear(cuda_growth, ["typing + lowering", "NVVM", "nvJitLink"])


@needs_numba_cuda
def test_cuda_task_split_grows_linearly(cuda_growth):
    check_linear(cuda_growth, ["task split"])


def test_k_loop_kernel_computes(rng):
    kernel, fields = k_loop_kernel(5)
    inputs = {j: rng.uniform(-1, 1, N).astype(np.float32) for j in range(5)}
    for j, x in inputs.items():
        fields[f"a{j}"].from_numpy(x)
    kernel()
    for j, x in inputs.items():
        np.testing.assert_allclose(fields[f"b{j}"].to_numpy(), x * np.float32(2) + np.float32(1), rtol=1e-6)


# -- passes/liveness.py against Numba's compute_live_map ---------------------------------------------------

cond_field = qd.field(qd.f32, shape=(16,))


@qd.kernel
def control_flow(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32) -> qd.f32:
    s = 0.0
    if n > 3:
        t = a[0]                       # defined on one path only
    else:
        t = 1.0
    for i in range(a.shape[0]):
        a[i] = a[i] * t
    k = 0
    while k < n:                       # a serial loop with continue and break
        k += 1
        if k == 2:
            continue
        if a[k % a.shape[0]] > 10.0:
            break
        s += a[k % a.shape[0]]
    for i in cond_field:
        cond_field[i] = s + i
    u = s
    if n > 5:
        u = s * 2.0
        for j in range(3):             # a loop under an if: serial
            u += j
    return u + t


@qd.kernel
def straight(x: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        x[i] += 1.0
    m = x[0]
    for i in range(x.shape[0]):
        x[i] *= m


def _reachable(blocks, label):
    from qd_numba.passes.ir_builder import successors

    seen, todo = set(), [label]
    while todo:
        lbl = todo.pop()
        if lbl not in seen and lbl in blocks:
            seen.add(lbl)
            todo.extend(successors(IRTools.for_cpu().ir, blocks[lbl]))
    return seen


@pytest.mark.parametrize("kernel", [control_flow, straight, k_loop_kernel(6)[0]], ids=["control_flow", "straight",
                                                                                       "k_loops"])
def test_liveness_matches_numba(kernel):
    """For every block and the names used in blocks reachable from it (what callers ask about),
    Liveness answers Numba's compute_live_map, on the IR Offload and PlanTasks see."""
    from numba.core import types

    tools = IRTools.for_cpu()
    param_types = {"a": types.float32[::1], "n": types.int32, "x": types.float32[::1]}
    runtime = {p.name: param_types[p.name] for p in kernel.params}
    state = untyped_compile(kernel, tools, runtime, {})
    blocks = state.func_ir.blocks
    analysis = tools.analysis
    usedefs = analysis.compute_use_defs(blocks)
    numba_live = analysis.compute_live_map(analysis.compute_cfg_from_blocks(blocks), blocks, usedefs.usemap,
                                           usedefs.defmap)
    liveness = Liveness(analysis, tools.ir, blocks)
    assert liveness.pinned   # the arguments and hidden field arguments
    checked = 0
    for label in blocks:
        used = set().union(*(usedefs.usemap[lbl] for lbl in _reachable(blocks, label)))
        assert liveness.live_at(label, used) == numba_live[label] & used, label
        checked += len(numba_live[label] & used)
    assert checked > 0


# -- no GC during a compile ------------------------------------------------------------------------------


def test_no_automatic_gc_while_compiling(monkeypatch, rng):
    seen = []
    run_pass = pipeline._run_pass

    def recording_pass(state, p):
        seen.append(gc.isenabled())
        return run_pass(state, p)

    monkeypatch.setattr(pipeline, "_run_pass", recording_pass)
    kernel, fields = k_loop_kernel(2)
    x = rng.uniform(-1, 1, N).astype(np.float32)
    fields["a1"].from_numpy(x)
    assert gc.isenabled()
    kernel()
    assert seen and not any(seen)      # CPU compile and its CUDA compile check
    assert gc.isenabled()
    np.testing.assert_allclose(fields["b1"].to_numpy(), x * np.float32(2) + np.float32(1), rtol=1e-6)


def test_gc_paused_nests_and_keeps_a_disabled_collector_disabled():
    assert gc.isenabled()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()       # the outer compile still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()       # the application turned it off: it stays off
    finally:
        gc.enable()


def test_gc_paused_across_threads():
    inside, release = threading.Event(), threading.Event()

    def compile_in_thread():
        with gc_paused():
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=compile_in_thread)
    worker.start()
    inside.wait(10)
    with gc_paused():
        pass
    assert not gc.isenabled()           # the other thread's compile still runs
    release.set()
    worker.join(10)
    assert gc.isenabled()


# -- process start ---------------------------------------------------------------------------------------


def _fresh_process(code: str, *args: str) -> str:
    """Run ``code`` in a fresh interpreter without the suite's compile-check and arch variables;
    its stdout (a failure shows its stderr)."""
    import os
    import subprocess
    import sys

    checks = ("QD_CUDA_COMPILE_CHECK", "QD_AMDGPU_COMPILE_CHECK", "QD_ARCH")
    env = {k: v for k, v in os.environ.items() if k not in checks}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_a_cpu_process_never_imports_numba_cuda(rng):
    """``import qd_numba`` and a CPU kernel's compile and call do not import numba-cuda (~300 ms
    of imports, ~400 ms of typing registries at its first kernel): only arch=cuda and the CUDA
    compile check do."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "import qd_numba as qd\n"
        "assert 'numba.cuda' not in sys.modules, 'import'\n"
        "qd.init(arch=qd.cpu)\n"
        "x = qd.field(qd.f32, shape=(8,))\n"
        "@qd.kernel\n"
        "def double(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):\n"
        "    for i in range(8):\n"
        "        x[i] = a[i] * 2.0\n"
        "a = np.array(sys.argv[1:], dtype=np.float32)\n"
        "double(a)\n"
        "assert np.allclose(x.to_numpy(), a * 2), 'result'\n"
        "assert 'numba.cuda' not in sys.modules, 'first kernel'\n"
    )
    values = [repr(float(v)) for v in rng.uniform(-1, 1, 8)]
    _fresh_process(code, *values)


def test_cuda_code_generation_never_imports_scipy_linalg():
    """numba-cuda's ``np.arraymath`` probes for scipy's BLAS at import (``scipy.linalg``: 374 ms of
    a first CUDA kernel on the H100 host) for a path device code cannot take. A fresh process that
    compiles a kernel for CUDA (the compile check: typing, lowering, NVVM, nvJitLink) does not
    import it, numba-cuda sees no BLAS, and the probe is numba-cuda's own again afterwards."""
    pytest.importorskip("scipy.linalg")
    code = (
        "import sys\n"
        "import qd_numba as qd\n"
        "from qd_numba.targets.cuda.plan import compile_check\n"
        "qd.init(arch=qd.cpu, offline_cache=False)\n"
        "x = qd.field(qd.f32, shape=(8,))\n"
        "@qd.kernel\n"
        "def double():\n"
        "    for i in x:\n"
        "        x[i] = x[i] * 2.0\n"
        "compile_check(double, {}, {})\n"
        "arraymath, linalg = sys.modules['numba.cuda.np.arraymath'], sys.modules['numba.cuda.np.linalg']\n"
        "print('scipy.linalg' in sys.modules, arraymath._HAVE_BLAS, linalg.ensure_blas.__name__)\n"
    )
    assert _fresh_process(code).split()[-3:] == ["False", "False", "ensure_blas"]


def _count_compiles(monkeypatch, name: str) -> list:
    """(compiler, argument types) of every Numba compile (CPU and, with numba-cuda importable,
    device code: arch=cuda and the CUDA compile check) of a function whose qualified name
    contains ``name``, appended as they start."""
    from numba.core import compiler

    counted = []
    compilers = [compiler]
    if numba_cuda_importable():
        from numba.cuda.core import compiler as cuda_compiler

        compilers.append(cuda_compiler)

    def counting(real, which):
        def compile_extra(self, func):
            if name in getattr(func, "__qualname__", ""):
                counted.append((which, tuple(self.state.args)))
            return real(self, func)
        return compile_extra

    for module in compilers:
        monkeypatch.setattr(module.CompilerBase, "compile_extra",
                            counting(module.CompilerBase.compile_extra, module.__name__))
    return counted


def test_atomic_updates_compile_their_implementation_once(monkeypatch, rng):
    """Every ``x[i] += v`` goes through one overload (lowering/subscripts.py ``atomic_update``)
    whose op is a string constant. Numba offers an overload the unliteral op first: an
    implementation compiled for that fails (the op must be known), is never cached, and was
    compiled again at every typing of every call site (144 failed compiles in one FEM kernel).
    Counted: the implementation's compiles for a kernel of many update sites."""
    counted = _count_compiles(monkeypatch, "atomic_update")
    total = qd.field(qd.f32, shape=())
    hist = qd.field(qd.i32, shape=(8,))
    x = qd.field(qd.f32, shape=(N,))

    @qd.kernel
    def scatter():
        for i in x:
            for j in qd.static(range(6)):       # 6 sites per statement below, unrolled
                hist[(i + j) % 8] += 1
                total[None] += x[i] * (j + 1)

    data = rng.uniform(-1, 1, N).astype(np.float32)
    x.from_numpy(data)
    scatter()
    np.testing.assert_array_equal(hist.to_numpy(), np.bincount((np.arange(N)[:, None] + np.arange(6)).ravel() % 8,
                                                               minlength=8))
    np.testing.assert_allclose(total[None], float(np.sum(data) * 21), rtol=1e-4, atol=1e-4)
    assert counted and len(counted) == len(set(counted)), counted    # each signature once


def test_scalar_field_access_compiles_no_function(monkeypatch, rng):
    """``f[i]`` and ``f[i] = v`` on scalar fields are typed by a template and lowered in place
    (lowering/field.py): no implementation is compiled as a function of its own, which every
    task would call and link. Vector fields keep their overloads (counted, so the count can
    fail)."""
    counted = _count_compiles(monkeypatch, "_field_")
    a = qd.field(qd.f32, shape=(N,))
    g = qd.field(qd.f64, shape=(8, N // 8))
    h = qd.field(qd.f16, shape=(N,))
    s = qd.field(qd.i32, shape=())
    v = qd.Vector.field(2, qd.f32, shape=(N,))
    data = rng.uniform(-1, 1, N).astype(np.float32)
    a.from_numpy(data)

    @qd.kernel
    def scalars():
        for i in a:
            g[i % 8, i // 8] = a[i] * 2.0
            h[i] = a[i]
        s[None] = 7

    @qd.kernel
    def vectors():
        for i in a:
            v[i] = qd.Vector([a[i], 1.0])

    scalars()
    np.testing.assert_array_equal(g.to_numpy(), (data.astype(np.float64) * 2.0).reshape(N // 8, 8).T)
    np.testing.assert_array_equal(h.to_numpy(), data.astype(np.float16))
    assert s[None] == 7 and counted == []
    vectors()
    np.testing.assert_array_equal(v.to_numpy()[:, 0], data)
    assert counted, "the vector field's overload compiled nothing: the counter is not counting"
