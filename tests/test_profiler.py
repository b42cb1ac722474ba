"""qd.profiler: the kernel profiler (per kernel and per task), compile records, the Chrome
trace, and log output (qd_numba/profiler.py, docs/guide/profiling.md).

The kernel-profiler tests run on the suite's arch (``pytest --arch=cuda`` times tasks with CUDA
events); the GPU-only checks are marked ``cuda``. References are numpy on random data.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config, profiler

N_CALLS = 7


@qd.kernel
def two_loops(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1), a: qd.f32):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]
    for i in range(x.shape[0]):
        x[i] = x[i] * 0.5


def _run_two_loops(rng, calls=N_CALLS):
    """Call ``two_loops`` ``calls`` times on random data and check the result against numpy."""
    x = rng.uniform(-1, 1, 4096).astype(np.float32)
    y = rng.uniform(-1, 1, 4096).astype(np.float32)
    x_ref, y_ref = x.astype(np.float64), y.astype(np.float64)
    for _ in range(calls):
        two_loops(x, y, 1.5)
        y_ref = 1.5 * x_ref + y_ref
        x_ref = x_ref * 0.5
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x, x_ref, rtol=1e-6)
    return x, y


@pytest.fixture
def profiling():
    """The kernel profiler on (a fresh qd.init: no records, kernels recompiled), off afterwards."""
    qd.init(kernel_profiler=True)
    yield
    qd.init()


def _check_stats(result, calls):
    assert result.counter == calls
    assert 0 < result.min <= result.avg <= result.max
    assert result.total == pytest.approx(result.avg * calls)


# -- the kernel profiler ------------------------------------------------------------------------------


def test_profiled_kernel_counts_every_call_and_task(rng, profiling):
    x, y = _run_two_loops(rng)
    _check_stats(qd.profiler.query_kernel_profiler_info("two_loops"), N_CALLS)
    _check_stats(qd.profiler.query_kernel_profiler_info(two_loops.qualname), N_CALLS)
    tasks = two_loops.tasks(x, y, 1.5)
    assert [t.kind for t in tasks] == ["range_for", "range_for"]
    for task in tasks:
        _check_stats(qd.profiler.query_kernel_profiler_info(task.name), N_CALLS)
    assert qd.profiler.get_kernel_profiler_total_time() == pytest.approx(
        qd.profiler.query_kernel_profiler_info("two_loops").total / 1000)


def test_tasks_lie_inside_their_kernel_call(rng, profiling):
    x, y = _run_two_loops(rng, calls=3)
    records = qd.profiler.kernel_profiler.records()
    calls = [r for r in records if r.kind == "kernel"]
    assert len(calls) == 3
    names = [t.name for t in two_loops.tasks(x, y, 1.5)]
    for call in calls:
        inside = [r for r in records if r.kind == "task"
                  and call.start_ns <= r.start_ns and r.start_ns + r.duration_ns <= call.start_ns + call.duration_ns]
        assert sorted(r.name for r in inside) == sorted(names)
        assert sum(r.duration_ns for r in inside) <= call.duration_ns


def test_clear_drops_every_record(rng, profiling):
    _run_two_loops(rng, calls=2)
    assert qd.profiler.query_kernel_profiler_info("two_loops").counter == 2
    qd.profiler.clear_kernel_profiler_info()
    assert qd.profiler.query_kernel_profiler_info("two_loops").counter == 0
    assert qd.profiler.get_kernel_profiler_total_time() == 0.0
    _run_two_loops(rng, calls=1)
    assert qd.profiler.query_kernel_profiler_info("two_loops").counter == 1


def test_query_of_an_unknown_name_is_empty(rng, profiling):
    _run_two_loops(rng, calls=1)
    assert qd.profiler.query_kernel_profiler_info("no_such_kernel") == profiler.KernelProfilerQueryResult()


def test_print_count_and_trace(rng, profiling, capsys):
    x, y = _run_two_loops(rng, calls=3)
    qd.profiler.print_kernel_profiler_info()
    out = capsys.readouterr().out
    assert "Kernel Profiler(count)" in out
    kernel_row = next(line for line in out.splitlines() if line.endswith(f"] {two_loops.qualname}"))
    assert "     3x |" in kernel_row and "100.00%" in kernel_row
    for task in two_loops.tasks(x, y, 1.5):
        assert f"task {task.name}" in out
    qd.profiler.print_kernel_profiler_info("trace")
    out = capsys.readouterr().out
    assert out.count(f"] {two_loops.qualname}\n") == 3
    assert "Number of records:  9" in out
    with pytest.raises(ValueError, match="'count' or 'trace'"):
        qd.profiler.print_kernel_profiler_info("detailed")


def test_chrome_trace_has_the_calls_tasks_and_compiles(rng, profiling, tmp_path):
    x, y = _run_two_loops(rng, calls=4)
    path = tmp_path / "trace.json"
    qd.profiler.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    calls = [e for e in events if e.get("cat") == "kernel" and e["name"] == two_loops.qualname]
    assert len(calls) == 4 and all(e["ph"] == "X" and e["dur"] > 0 for e in calls)
    for task in two_loops.tasks(x, y, 1.5):
        assert len([e for e in events if e.get("cat") == "task" and e["name"] == task.name]) == 4
    compiles = [e for e in events if e.get("cat") == "compile" and e["name"] == two_loops.qualname]
    assert compiles and all(e["dur"] > 0 and "target" in e["args"] for e in compiles)


def test_profiler_off_records_nothing_and_keeps_the_plain_entry(rng, arch, caplog):
    qd.init()
    x, y = _run_two_loops(rng, calls=2)
    assert profiler.kernel_profiler.records() == []
    assert profiler.kernel_profiler.statistics() == {}
    with caplog.at_level(logging.WARNING, logger="qd_numba"):
        assert qd.profiler.query_kernel_profiler_info("two_loops") is None
    assert "kernel_profiler=True" in caplog.text
    if arch == "cpu":
        inst = two_loops.last_instance
        assert inst.entry is inst.cres.entry_point   # the compiled entry point itself, no wrapper
        qd.init(kernel_profiler=True)
        two_loops(x, y, 1.5)
        inst = two_loops.last_instance
        assert inst.entry is not inst.cres.entry_point
        qd.init()
    else:
        assert two_loops.backend().plan_for((x, y, 1.5)).timer is None


def test_serialized_loop_and_empty_loop(rng, profiling):
    """A serialised loop is timed like a parallel one; a loop with no iterations is not a launch."""

    @qd.kernel
    def scan(a: qd.types.ndarray(dtype=qd.f64, ndim=1), n: qd.i32):
        qd.loop_config(serialize=True)
        for i in range(1, a.shape[0]):
            a[i] += a[i - 1]
        for i in range(n):
            a[i] *= 2.0

    a = rng.uniform(0, 1, 500)
    ref = np.cumsum(a)
    scan(a, 0)
    np.testing.assert_allclose(a, ref, rtol=1e-12)
    scan_task, double_task = scan.tasks(a, 0)
    assert qd.profiler.query_kernel_profiler_info(scan_task.name).counter == 1
    assert qd.profiler.query_kernel_profiler_info(double_task.name).counter == 0
    scan(a, 3)
    assert qd.profiler.query_kernel_profiler_info(double_task.name).counter == 1
    assert qd.profiler.query_kernel_profiler_info("scan").counter == 2


# -- compile records -------------------------------------------------------------------------------


def test_each_compile_is_recorded_with_its_stages(rng):
    @qd.kernel
    def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
        for i in range(a.shape[0]):
            a[i] *= s

    a = rng.uniform(-1, 1, 100).astype(np.float32)
    ref = a * np.float32(3.0)
    scale(a, 3.0)
    scale(a, 1.0)   # same types: no compile
    np.testing.assert_allclose(a, ref, rtol=1e-6)
    target = "cpu" if config.current.arch == "cpu" else "cuda"
    info = qd.profiler.query_compile_info(scale.qualname, target)   # records are per process
    assert info.counter == 1
    (record,) = info.records
    expected = ["frontend", "untyped passes", "task split", "typing + lowering"]
    expected += ["LLVM"] if target == "cpu" else ["NVVM", "nvJitLink", "module load"]
    assert set(expected) <= set(record.stages)
    assert all(seconds >= 0 for seconds in record.stages.values())
    assert record.stages["typing + lowering"] > 0
    assert sum(record.stages.values()) == pytest.approx(record.seconds, rel=0.01, abs=0.002)
    if target == "cpu" and config.current.cuda_compile_check:
        (check,) = qd.profiler.query_compile_info(scale.qualname, "cuda (compile check)").records
        assert check.stages["NVVM"] > 0 and check.stages["nvJitLink"] > 0
        assert record.stages["cuda (compile check)"] == pytest.approx(check.seconds)
    ref[::2] *= np.float32(2.0)
    scale(a[::2], 2.0)                  # a strided array: new argument types on the CPU, a second compile
    np.testing.assert_allclose(a, ref, rtol=1e-6)
    # (CUDA stages a numpy argument in a contiguous device copy: the same argument types)
    assert qd.profiler.query_compile_info(scale.qualname, target).counter == (2 if target == "cpu" else 1)


def test_failed_compile_leaves_no_record():
    @qd.kernel
    def broken(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = undefined_name  # noqa: F821

    with pytest.raises(qd.QuadrantsError):
        broken(np.ones(4, np.float32))
    assert qd.profiler.query_compile_info(broken.qualname).counter == 0


def test_print_compile_info(rng, capsys):
    @qd.kernel
    def negate(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = -a[i]

    a = rng.uniform(-1, 1, 10).astype(np.float32)
    ref = -a
    negate(a)
    np.testing.assert_array_equal(a, ref)
    qd.profiler.print_compile_info()
    out = capsys.readouterr().out
    assert f"] {negate.qualname} (" in out and "typing + lowering" in out
    assert qd.profiler.print_scoped_profiler_info is qd.profiler.print_compile_info


# -- log output --------------------------------------------------------------------------------------


def _compile_fresh(rng):
    @qd.kernel
    def add_one(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] += 1.0

    a = rng.uniform(-1, 1, 16).astype(np.float32)
    ref = a + np.float32(1.0)
    add_one(a)
    np.testing.assert_allclose(a, ref)
    return add_one


def test_info_level_logs_every_compile(rng, caplog):
    qd.init(log_level=qd.INFO)
    try:
        assert qd.is_logging_effective(qd.INFO) and not qd.is_logging_effective(qd.DEBUG)
        kernel = _compile_fresh(rng)
    finally:
        qd.init()
    infos = [r for r in caplog.records if r.name == "qd_numba" and r.levelno == logging.INFO]
    assert any(f"kernel '{kernel.qualname}'" in r.getMessage() and "typing + lowering" in r.getMessage()
               for r in infos)


def test_default_level_logs_no_compile(rng, caplog):
    qd.init()
    _compile_fresh(rng)
    assert not [r for r in caplog.records if r.name == "qd_numba" and r.levelno < logging.WARNING]


def test_log_level_from_the_environment(monkeypatch):
    monkeypatch.setenv("QD_LOG_LEVEL", "Debug")
    try:
        qd.init()
        assert logging.getLogger("qd_numba").level == logging.DEBUG
        assert qd.is_logging_effective(qd.DEBUG) and not qd.is_logging_effective(qd.TRACE)
        qd.init(log_level=qd.ERROR)   # the option wins over the variable
        assert not qd.is_logging_effective(qd.WARN)
        monkeypatch.setenv("QD_LOG_LEVEL", "loud")
        with pytest.raises(ValueError, match="QD_LOG_LEVEL|'loud'"):
            qd.init()
    finally:
        monkeypatch.delenv("QD_LOG_LEVEL")
        qd.init()
    assert logging.getLogger("qd_numba").level == logging.NOTSET   # back to logging's configuration
    with pytest.raises(ValueError, match="'verbose'"):
        qd.init(log_level="verbose")
    qd.init()


def test_slow_compile_warns_once_per_process(rng, caplog, monkeypatch):
    monkeypatch.setattr(profiler, "SLOW_COMPILE_SECONDS", 0.0)
    monkeypatch.setattr(profiler, "_warned_slow_compile", False)
    first = _compile_fresh(rng)
    _compile_fresh(rng)
    warnings = [r for r in caplog.records if r.name == "qd_numba" and "to compile" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert f"kernel '{first.qualname}' took" in message and "QD_LOG_LEVEL=info" in message


def test_slow_compile_warning_is_silenced_above_warn(rng, caplog, monkeypatch):
    monkeypatch.setattr(profiler, "SLOW_COMPILE_SECONDS", 0.0)
    monkeypatch.setattr(profiler, "_warned_slow_compile", False)
    qd.init(log_level=qd.ERROR)
    try:
        _compile_fresh(rng)
    finally:
        qd.init()
    assert not [r for r in caplog.records if r.name == "qd_numba"]


# -- CUDA events ----------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_event_timing(rng, monkeypatch):
    """Every task of a CUDA kernel (the serial one too) is timed by events; reading is lazy, and
    forced when many calls are pending."""
    monkeypatch.setattr(profiler, "MAX_PENDING_GPU_CALLS", 4)
    qd.init(arch=qd.cuda, kernel_profiler=True)
    try:
        total = qd.field(qd.f64, shape=())

        @qd.kernel
        def sum_squares(a: qd.types.ndarray(dtype=qd.f64, ndim=1), n: qd.i32):
            total[None] = 0.0
            for i in range(n):
                total[None] += a[i] * a[i]

        a = rng.uniform(-1, 1, 100_000)
        for _ in range(6):
            sum_squares(a, a.shape[0])
        assert profiler.kernel_profiler.pending_gpu_calls == 2   # the fourth call read the first four
        assert total[None] == pytest.approx(float(np.sum(a * a)), rel=1e-9)
        sum_squares(a, 0)                                          # the loop does not launch
        tasks = sum_squares.tasks(a, 0)
        assert [t.kind for t in tasks] == ["serial", "range_for"]
        _check_stats(qd.profiler.query_kernel_profiler_info("sum_squares"), 7)
        _check_stats(qd.profiler.query_kernel_profiler_info(tasks[0].name), 7)
        _check_stats(qd.profiler.query_kernel_profiler_info(tasks[1].name), 6)
        assert profiler.kernel_profiler.pending_gpu_calls == 0
        calls = [r for r in qd.profiler.kernel_profiler.records() if r.kind == "kernel"]
        loops = [r for r in qd.profiler.kernel_profiler.records() if r.name == tasks[1].name]
        assert all(r.device == "cuda" for r in calls) and len(loops) == 6
        for call, loop in zip(calls, loops):
            assert call.start_ns <= loop.start_ns and loop.duration_ns <= call.duration_ns
    finally:
        qd.init(arch=qd.cuda)
