"""The native launch loops (targets/cuda/runtime.Launchers), run here without a GPU: the driver's
cuLaunchKernel and cuEventRecord are replaced by ctypes stand-ins that record their calls."""

import contextlib
import ctypes
import os

import numpy as np
import pytest

from qd_numba import config
from qd_numba.errors import QuadrantsWarning
from qd_numba.targets.cuda import runtime
from qd_numba.targets.cuda.runtime import PACK_HEAD, PACK_TASK, Launchers

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_uint64] + [ctypes.c_uint32] * 7 + [ctypes.c_uint64] * 3))
RECORD = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64)


_STATE = {"launches": [], "records": [], "fail": {}}


@LAUNCH
def _launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    _STATE["launches"].append((fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
    return _STATE["fail"].get(fn, 0)


@RECORD
def _record(event, stream):
    _STATE["records"].append((event, stream))
    return 0


_LAUNCHERS = {}   # per way of building: launch loops for the module (engines live as long as the process)


@contextlib.contextmanager
def offline_cache_at(path):
    saved = config.current.offline_cache, config.current.offline_cache_file_path
    config.current.offline_cache, config.current.offline_cache_file_path = True, str(path)
    try:
        yield
    finally:
        config.current.offline_cache, config.current.offline_cache_file_path = saved


def stand_in_launchers():
    return Launchers(ctypes.cast(_launch, ctypes.c_void_p).value, ctypes.cast(_record, ctypes.c_void_p).value)


def cache_files(path):
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files if f.endswith(".qdc")]


@pytest.fixture(params=["built", "from the offline cache", "python (until the native loops exist)"])
def driver(request, tmp_path_factory):
    if request.param not in _LAUNCHERS:
        if request.param.startswith("python"):
            _LAUNCHERS[request.param] = runtime.PyLaunchers(ctypes.cast(_launch, ctypes.c_void_p).value,
                                                            ctypes.cast(_record, ctypes.c_void_p).value)
        elif request.param == "built":
            _LAUNCHERS["built"] = stand_in_launchers()
        else:   # the second process's path: the object code written by the first is loaded
            cache = tmp_path_factory.mktemp("launchers_cache")
            with offline_cache_at(cache):
                stand_in_launchers()
                assert len(cache_files(cache)) == 1
                _LAUNCHERS["from the offline cache"] = stand_in_launchers()
    _STATE["launches"].clear()
    _STATE["records"].clear()
    _STATE["fail"].clear()
    return {**_STATE, "launchers": _LAUNCHERS[request.param]}


def test_launcher_code_holds_no_process_address():
    """The IR the object code is made from reaches the driver and CPython through globals set
    at load time: nothing in it is an address of this process, so its object code can be cached."""
    text = runtime._launchers_ir()
    addresses = [ctypes.cast(_launch, ctypes.c_void_p).value, ctypes.cast(_record, ctypes.c_void_p).value,
                 ctypes.cast(ctypes.pythonapi.PyLong_AsVoidPtr, ctypes.c_void_p).value]
    assert not any(str(a) in text for a in addresses)
    assert "inttoptr (i64" not in text and all(name in text for name in runtime._EXTERNALS)


def test_a_damaged_launcher_entry_is_discarded_and_rebuilt(tmp_path, rng):
    with offline_cache_at(tmp_path):
        stand_in_launchers()
        (path,) = cache_files(tmp_path)
        data = bytearray(open(path, "rb").read())
        for k in rng.integers(len(data) // 2, len(data), 8):   # damage the object code's bytes
            data[k] ^= 0xFF
        open(path, "wb").write(bytes(data))
        with pytest.warns(QuadrantsWarning, match="discarding the unusable entry"):
            launchers = stand_in_launchers()
        assert len(cache_files(tmp_path)) == 1          # written again
    _STATE["launches"].clear()
    packed, tasks = packed_tasks(rng, 4, stream=5)
    assert launchers.launch_all(packed.ctypes.data) == -1
    assert _STATE["launches"] == [expected_call(t, 5) for t in tasks if t[1] > 0]


def packed_tasks(rng, n, stream):
    """A packed launch array of n tasks with random handles, grids (some empty) and blocks."""
    tasks = [(int(rng.integers(1, 1 << 40)), int(rng.choice([0, 1, 7, 4096])), int(rng.choice([32, 128, 256])),
              int(rng.integers(1, 1 << 40))) for _ in range(n)]
    packed = np.array([n, stream, *[w for t in tasks for w in t]], np.int64)
    assert len(packed) == PACK_HEAD + PACK_TASK * n
    return packed, tasks


def expected_call(task, stream):
    fn, grid, block, params = task
    return (fn, grid, 1, 1, block, 1, 1, 0, stream, params, 0)


def test_launch_all_launches_every_task_with_work_in_order(driver, rng):
    packed, tasks = packed_tasks(rng, 9, stream=12345)
    assert driver["launchers"].launch_all(packed.ctypes.data) == -1
    assert driver["launches"] == [expected_call(t, 12345) for t in tasks if t[1] > 0]


def test_launch_all_stops_at_the_first_failure(driver, rng):
    packed, tasks = packed_tasks(rng, 6, stream=7)
    working = [k for k, t in enumerate(tasks) if t[1] > 0]
    bad = working[len(working) // 2] if working else None
    if bad is None:
        pytest.skip("no task with work drawn")
    driver["fail"][tasks[bad][0]] = 719
    assert driver["launchers"].launch_all(packed.ctypes.data) == (bad << 32) | 719
    assert driver["launches"] == [expected_call(tasks[k], 7) for k in working if k <= bad]


def test_launch_task_launches_one_task(driver, rng):
    packed, tasks = packed_tasks(rng, 5, stream=3)
    for k, task in enumerate(tasks):
        driver["launches"].clear()
        assert driver["launchers"].launch_task(packed.ctypes.data, k) == -1
        assert driver["launches"] == ([expected_call(task, 3)] if task[1] > 0 else [])


def test_launch_timed_records_an_event_around_every_task(driver, rng):
    packed, tasks = packed_tasks(rng, 4, stream=99)
    events = rng.integers(1, 1 << 40, 2 * len(tasks)).astype(np.int64)
    assert driver["launchers"].launch_timed(packed.ctypes.data, events.ctypes.data) == -1
    assert driver["records"] == [(int(e), 99) for e in events]
    assert driver["launches"] == [expected_call(t, 99) for t in tasks if t[1] > 0]


def test_no_tasks_launch_nothing(driver):
    packed = np.array([0, 5], np.int64)
    assert driver["launchers"].launch_all(packed.ctypes.data) == -1
    assert driver["launchers"].launch_timed(packed.ctypes.data, 0) == -1
    assert driver["launches"] == [] and driver["records"] == []


def test_the_bound_builtin_launches_its_packed_array(driver, rng):
    packed, tasks = packed_tasks(rng, 5, stream=4242)
    launch_all = driver["launchers"].bind_launch_all(packed.ctypes.data)
    assert launch_all() == -1
    assert driver["launches"] == [expected_call(t, 4242) for t in tasks if t[1] > 0]
    working = [k for k, t in enumerate(tasks) if t[1] > 0]
    if working:
        driver["fail"][tasks[working[-1]][0]] = 1
        assert launch_all() == (working[-1] << 32) | 1


@pytest.mark.parametrize("shape, strides", [((), ()), ((5,), (8,)), ((3, 4), (32, 8)), ((3, 4), (64, 16))])
def test_ndarray_argument_types_keep_the_views_dimensions(shape, strides):
    """The type of a device ndarray argument comes from a host stand-in of the view: a 0-d view
    stays 0-d (numpy's ascontiguousarray would make it 1-d), a strided view gets layout 'A'."""
    import qd_numba as qd
    from qd_numba.targets.cuda.arrays import ArrayView, _view_type

    view = ArrayView(np.dtype(np.float64), shape, strides, 0, False)
    ty = _view_type("kernel 'k', argument 'a'", qd.types.ndarray(dtype=qd.f64, ndim=len(shape)), view)
    assert ty.ndim == len(shape) and ty.layout == ("C" if view.c_contiguous else "A")


def test_recorded_device_exception_is_raised_once_naming_the_task():
    """raise_recorded (the CUDA and AMDGPU plans' debug check): the first task's recorded code
    becomes our exception naming the task and its line; every error word is cleared."""
    from types import SimpleNamespace

    from qd_numba.errors import QuadrantsRuntimeError
    from qd_numba.lowering.raising import raise_recorded

    words = {0x10: 0, 0x20: 7, 0x30: 9}
    rt = SimpleNamespace(read_i32=words.__getitem__, write_i32=words.__setitem__)
    launches = [SimpleNamespace(binary=SimpleNamespace(exceptions={7: (IndexError, ("index 12 out of range",), None),
                                                                   9: (ValueError, ("later",), None)}),
                                task=SimpleNamespace(name=f"task{k}", loc=f"k.py:{k + 3}")) for k in range(3)]
    kernel = SimpleNamespace(runtime_error=lambda e: QuadrantsRuntimeError(f"kernel 'k': {type(e).__name__}: {e}"))
    message = r"kernel 'k': IndexError: index 12 out of range \(task task1, k.py:4\)"
    with pytest.raises(QuadrantsRuntimeError, match=message):
        raise_recorded(kernel, rt, list(zip(launches, (0x10, 0x20, 0x30))), lambda launch: launch.task)
    assert words == {0x10: 0, 0x20: 0, 0x30: 0}
    raise_recorded(kernel, rt, list(zip(launches, (0x10, 0x20, 0x30))), lambda launch: launch.task)   # nothing left


@pytest.fixture
def fresh_launchers(monkeypatch):
    """The runtime's process-wide launchers reset (restored after the test), the driver's entry
    points replaced by the stand-ins, and the native build held until ``release`` is set."""
    release = __import__("threading").Event()
    built = []

    class HeldLaunchers(Launchers):
        def __init__(self, *a):
            assert release.wait(30)
            super().__init__(*a)
            built.append(self)

    entry = (ctypes.cast(_launch, ctypes.c_void_p).value, ctypes.cast(_record, ctypes.c_void_p).value)
    monkeypatch.setattr(runtime, "_driver_entry_points", lambda: entry)
    monkeypatch.setattr(runtime, "Launchers", HeldLaunchers)
    for name, value in (("_launchers", None), ("_launchers_error", None), ("_launchers_thread", None),
                        ("_build_mutex", __import__("threading").Lock()),
                        ("_waiting", []), ("_py_launchers", None)):
        monkeypatch.setattr(runtime, name, value)
    _STATE["launches"].clear()
    yield release, built
    release.set()
    if runtime._launchers_thread is not None:
        runtime._launchers_thread.join()


def test_a_plan_launches_in_python_until_the_native_loops_exist_then_switches(fresh_launchers, rng):
    release, built = fresh_launchers
    packed, tasks = packed_tasks(rng, 5, stream=77)
    expected = [expected_call(t, 77) for t in tasks if t[1] > 0]
    assert expected
    switched = []
    launch_all = runtime.bind_launch_all(packed.ctypes.data, switched.append)
    assert isinstance(runtime._py_launchers, runtime.PyLaunchers) and not built
    assert launch_all() == -1                       # launched by the Python loop
    assert _STATE["launches"] == expected
    release.set()
    runtime._launchers_thread.join()
    assert len(built) == 1 and len(switched) == 1 and runtime.launchers() is built[0]
    _STATE["launches"].clear()
    assert switched[0]() == -1                      # the native builtin, bound to the same array
    assert _STATE["launches"] == expected
    # once the native loops exist, a new plan gets them at once
    assert runtime.bind_launch_all(packed.ctypes.data, switched.append)() == -1 and len(switched) == 1


def test_a_plans_generated_callers_switch_to_the_native_launch_all(fresh_launchers, rng):
    from qd_numba.targets.cuda.plan import LaunchPlan

    release, _built = fresh_launchers
    packed, tasks = packed_tasks(rng, 4, stream=0)
    expected = [expected_call(t, 0) for t in tasks if t[1] > 0]
    plan = LaunchPlan.__new__(LaunchPlan)
    plan._launch_all_users = []
    plan.launch_all = runtime.bind_launch_all(packed.ctypes.data, plan._use_native_launch_all)
    python = plan.launch_all
    caller, stream_parallel = {"launch_all": python}, {"launch_all": "a stream-parallel block launcher"}
    plan._launch_all_users += [caller, stream_parallel]
    release.set()
    runtime._launchers_thread.join()
    assert plan.launch_all is not python and caller["launch_all"] is plan.launch_all
    assert stream_parallel["launch_all"] == "a stream-parallel block launcher"   # only its own launcher
    _STATE["launches"].clear()
    assert caller["launch_all"]() == -1 and _STATE["launches"] == expected


def test_launchers_reports_a_failed_build(fresh_launchers, monkeypatch):
    release, _built = fresh_launchers

    def broken(*a):
        raise OSError("no LLVM today")

    monkeypatch.setattr(runtime, "Launchers", broken)
    release.set()
    with pytest.raises(runtime.QuadrantsRuntimeError, match="launch loops could not be built"):
        runtime.launchers()
