"""``qd.profiler``: the kernel profiler, compile-time records, and qd_numba's log output.

Kernel profiler (``qd.init(kernel_profiler=True)``; Quadrants' API). Whether a kernel is timed
is settled when its instance (CPU) or launch plan (CUDA, AMDGPU) is built — ``qd.init`` drops both — so
the call path of an unprofiled kernel is exactly the one without a profiler: no flag is read
per call.

- CPU: the instance's entry becomes a wrapper that reads the monotonic clock around the native
  call (one kernel record per call); each range-for launch site reads ``clock_gettime`` around
  its parallel region and adds to a three-word counter of its own (launches, nanoseconds, first
  start) in the kernel's library, which the wrapper turns into one task record per call and
  resets (targets/cpu.py, ``launch_range``). Serial code between loops is part of the kernel's
  time only. Calls of one kernel instance from several Python threads at once may mix their
  task times (the counters are per instance).
- CUDA: a profiled plan launches through a native launcher that records a CUDA event before
  and after every task. Events are read lazily — when information is asked for, or when many
  calls are pending — so launches stay asynchronous; a kernel's time is the device time from
  its first task's start to its last task's end.
- AMDGPU: the same, through HIP's timing events (hipEventRecord on the launch stream around
  each task's hipModuleLaunchKernel, read with hipEventElapsedTime): :class:`GpuLaunchTimer`
  and :class:`GpuEventPool` serve both GPUs.

Records: statistics (count, total, min, max) per kernel and per task, kept for every call, and
the most recent :data:`MAX_TRACE_RECORDS` individual records for ``print_kernel_profiler_info
('trace')`` and :func:`export_chrome_trace`. ``qd.init`` clears them.

Compile records are always kept (they cost a clock read per stage, at compile time only): per
compile of a kernel instance, the seconds of each stage — frontend, untyped passes, task typing,
task split, typing + lowering, LLVM (CPU) or NVVM and nvJitLink (CUDA), module load. Stages are timed by
:func:`stage` blocks at the compile sites; a :func:`compiling` block opens a record, and blocks
nest (the CUDA compile check inside a CPU compile is a stage of it and a record of its own).

Logging goes through the ``logging`` logger ``"qd_numba"``. ``qd.init(log_level=qd.INFO)`` /
``QD_LOG_LEVEL=info`` logs every compile with its stages; at the default level (warn) one
compile slower than :data:`SLOW_COMPILE_SECONDS` logs a warning, once per process.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import threading
import time

import numpy as np

from . import config
from .errors import QuadrantsRuntimeError

logger = logging.getLogger("qd_numba")

# -- log levels (Quadrants' names) -------------------------------------------------------------------

TRACE, DEBUG, INFO, WARN, ERROR, CRITICAL = config.LOG_LEVELS
_TRACE_NUMBER = 5
_LEVEL_NUMBERS = {TRACE: _TRACE_NUMBER, DEBUG: logging.DEBUG, INFO: logging.INFO, WARN: logging.WARNING,
                  ERROR: logging.ERROR, CRITICAL: logging.CRITICAL}
logging.addLevelName(_TRACE_NUMBER, "TRACE")


_level_set = False   # whether set_logging_level set the logger's level (qd.init resets only that)


def set_logging_level(level: str) -> None:
    """Log qd_numba's messages of ``level`` and above: ``qd.TRACE``, ``qd.DEBUG``, ``qd.INFO``,
    ``qd.WARN`` (the default), ``qd.ERROR``, ``qd.CRITICAL``. Below warn, a stderr handler is
    added to the ``"qd_numba"`` logger if neither it nor the root logger has one (Python would
    show only warnings otherwise); an application that configures ``logging`` gets the records
    through its own handlers."""
    global _level_set
    number = _LEVEL_NUMBERS[config.log_level(level)]
    logger.setLevel(number)
    _level_set = True
    if number < logging.WARNING and not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[qd_numba] %(levelname)s %(message)s"))
        logger.addHandler(handler)


def apply_log_level(level: str | None) -> None:
    """The configured level (``qd.init(log_level=)``, ``QD_LOG_LEVEL``); None leaves the
    logger to ``logging``'s configuration, undoing a level set here before."""
    global _level_set
    if level is not None:
        set_logging_level(level)
    elif _level_set:
        logger.setLevel(logging.NOTSET)
        _level_set = False


def is_logging_effective(level: str) -> bool:
    """Whether messages of ``level`` are logged now."""
    return logger.isEnabledFor(_LEVEL_NUMBERS[config.log_level(level)])


# -- clocks --------------------------------------------------------------------------------------------

# CLOCK_MONOTONIC on every Unix: native task timing calls clock_gettime with it, so task and
# kernel timestamps share one time base (elsewhere tasks are not timed, only kernels)
CLOCK_MONOTONIC = getattr(time, "CLOCK_MONOTONIC", None)


def _now_ns() -> int:
    return time.clock_gettime_ns(CLOCK_MONOTONIC)


now_ns = _now_ns if CLOCK_MONOTONIC is not None else time.perf_counter_ns

# -- records -------------------------------------------------------------------------------------------

MAX_TRACE_RECORDS = 200_000   # individual records kept for 'trace' and the Chrome trace (the latest)
MAX_PENDING_GPU_CALLS = 1024  # profiled GPU calls whose events wait to be read before a forced read


@dataclasses.dataclass
class StatisticalResult:
    """The statistics of one kernel or task over the recorded calls; times in milliseconds."""

    name: str
    kind: str                   # "kernel" or "task"
    kernel: str = ""            # a task's kernel
    counter: int = 0
    min_time: float = 0.0
    max_time: float = 0.0
    total_time: float = 0.0

    def insert_record(self, ms: float) -> None:
        if self.counter == 0 or ms < self.min_time:
            self.min_time = ms
        if self.counter == 0 or ms > self.max_time:
            self.max_time = ms
        self.counter += 1
        self.total_time += ms

    def merge(self, other: StatisticalResult) -> None:
        """Add ``other``'s calls to these statistics."""
        if other.counter:
            self.min_time = other.min_time if not self.counter else min(self.min_time, other.min_time)
            self.max_time = max(self.max_time, other.max_time)
            self.counter += other.counter
            self.total_time += other.total_time

    @property
    def avg_time(self) -> float:
        return self.total_time / self.counter if self.counter else 0.0


@dataclasses.dataclass(frozen=True)
class KernelProfilerQueryResult:
    """What :func:`query_kernel_profiler_info` returns: Quadrants' ``counter``, ``min``, ``max``,
    ``avg`` (milliseconds), plus ``total`` (milliseconds)."""

    counter: int = 0
    min: float = 0.0
    max: float = 0.0
    avg: float = 0.0
    total: float = 0.0


@dataclasses.dataclass(frozen=True)
class ProfileRecord:
    """One kernel call or one task of it. ``start_ns`` is on the monotonic clock."""

    name: str
    kind: str        # "kernel" or "task"
    kernel: str
    device: str      # "cpu", "cuda" or "amdgpu"
    start_ns: int
    duration_ns: int


class KernelProfiler:
    """The process-wide kernel records (:data:`kernel_profiler`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._stats: dict[str, StatisticalResult] = {}
        self._trace: collections.deque = collections.deque(maxlen=MAX_TRACE_RECORDS)
        self._pending_gpu: list = []
        self.events = GpuEventPool(_CudaDriverEvents())   # CUDA's (AMDGPU's: its runtime's)

    # -- recording ---------------------------------------------------------------------------
    def _stat(self, name, kind, kernel):
        stat = self._stats.get(name)
        if stat is None:
            stat = self._stats[name] = StatisticalResult(name, kind, kernel)
        return stat

    def record(self, kernel: str, device: str, start_ns: int, duration_ns: int, tasks) -> None:
        """One call of ``kernel`` and its tasks ``(task name, start ns, duration ns)``."""
        with self._lock:
            self._stat(kernel, "kernel", kernel).insert_record(duration_ns * 1e-6)
            self._trace.append(ProfileRecord(kernel, "kernel", kernel, device, start_ns, duration_ns))
            for name, task_start, task_ns in tasks:
                self._stat(name, "task", kernel).insert_record(task_ns * 1e-6)
                self._trace.append(ProfileRecord(name, "task", kernel, device, task_start, task_ns))

    def record_cpu_call(self, kernel: str, start_ns: int, end_ns: int, clocks) -> None:
        """A CPU call: the kernel's wall time, and per launched task its counter (reset here)."""
        tasks = []
        for name, counter in clocks:
            if counter[0]:
                tasks.append((name, int(counter[2]), int(counter[1])))
                counter[:] = 0
        self.record(kernel, "cpu", start_ns, end_ns - start_ns, tasks)

    def launched_on_gpu(self, timer: GpuLaunchTimer, events: np.ndarray, launched: np.ndarray) -> None:
        """A profiled GPU call was launched: read its events later (now, if many wait)."""
        with self._lock:
            self._pending_gpu.append((timer, events, launched))
            full = len(self._pending_gpu) >= MAX_PENDING_GPU_CALLS
        if full:
            self.flush()

    @property
    def pending_gpu_calls(self) -> int:
        """Profiled GPU calls whose events have not been read yet."""
        return len(self._pending_gpu)

    # -- reading -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Read the GPU events of profiled calls launched since the last read (waits for them)."""
        with self._lock:
            pending, self._pending_gpu = self._pending_gpu, []
        for timer, events, launched in pending:
            self.record(timer.kernel, timer.device, *timer.pool.read(events, launched, timer.task_names))
            timer.pool.release(events)

    def statistics(self) -> dict[str, StatisticalResult]:
        self.flush()
        with self._lock:
            return {name: dataclasses.replace(s) for name, s in self._stats.items()}

    def records(self) -> list[ProfileRecord]:
        self.flush()
        with self._lock:
            return list(self._trace)

    def clear(self) -> None:
        self.flush()
        with self._lock:
            self._stats.clear()
            self._trace.clear()


def _profiler_on() -> bool:
    if config.current.kernel_profiler:
        return True
    logger.warning("the kernel profiler is off: use qd.init(kernel_profiler=True) to turn it on")
    return False


# -- CPU: the timed entry point --------------------------------------------------------------------------

def timed_cpu_entry(kernel: str, entry, clocks):
    """``entry`` (a compiled kernel's native entry point) timed per call; ``clocks`` are
    ``(task name, counter)`` of the range-for launch sites (targets/cpu.py)."""
    record = kernel_profiler.record_cpu_call
    clock = now_ns

    def entry_timed(*args):
        start = clock()
        try:
            return entry(*args)
        finally:
            record(kernel, start, clock(), clocks)

    entry_timed.__qualname__ = f"timed entry of {kernel}"
    return entry_timed


TASK_COUNTER_WORDS = 3   # a CPU launch site's counter: launches, nanoseconds, start of the first launch


def counter_at(address: int) -> np.ndarray:
    """The task counter at this address (a global of a compiled kernel's library)."""
    return np.frombuffer((ctypes.c_int64 * TASK_COUNTER_WORDS).from_address(address), np.int64)


# -- GPUs: events around every task -----------------------------------------------------------------------

def _check(result, what: str):
    """The value of a ``cuda.bindings`` driver call, or QuadrantsRuntimeError naming the call."""
    err, *values = result
    if int(err) != 0:
        raise QuadrantsRuntimeError(f"CUDA driver error in {what} (kernel profiler): {err!r}")
    return values[0] if values else None


class _CudaDriverEvents:
    """The CUDA driver's timing events (``cuda.bindings``) as :class:`GpuEventPool` uses them:
    int handles, recorded on the legacy default stream."""

    def __init__(self):
        self._objects: dict[int, object] = {}

    def timing_event_create(self) -> int:
        from cuda.bindings import driver

        event = _check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        self._objects[int(event)] = event
        return int(event)

    def event_record(self, event: int, stream: int) -> None:
        from cuda.bindings import driver

        _check(driver.cuEventRecord(self._objects[event], stream), "cuEventRecord")

    def event_synchronize(self, event: int) -> None:
        from cuda.bindings import driver

        _check(driver.cuEventSynchronize(self._objects[event]), "cuEventSynchronize")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        from cuda.bindings import driver

        return _check(driver.cuEventElapsedTime(self._objects[start], self._objects[end]), "cuEventElapsedTime")


class GpuEventPool:
    """Timing events of one GPU for profiled launches, reused once read; and the time base that
    maps event times onto the host's monotonic clock (an event recorded at a known host time).
    ``api`` is the GPU's: ``timing_event_create() -> handle`` (an int; timing enabled),
    ``event_record(event, stream)``, ``event_synchronize(event)``, ``event_elapsed_ms(start,
    end)`` (CUDA: :class:`_CudaDriverEvents`; AMDGPU: targets/amdgpu/runtime.py ``HipRuntime``)."""

    def __init__(self, api):
        self.api = api
        self._lock = threading.Lock()
        self._free: list[int] = []
        self._anchor = None          # (event, host ns when it completed)

    def take(self, n: int) -> np.ndarray:
        with self._lock:
            return self._take(n)

    def _take(self, n: int) -> np.ndarray:
        api = self.api
        while len(self._free) < n:
            self._free.append(api.timing_event_create())
        if self._anchor is None:
            anchor = api.timing_event_create()
            api.event_record(anchor, 0)
            api.event_synchronize(anchor)
            self._anchor = (anchor, now_ns())
        taken, self._free = self._free[-n:], self._free[:-n]
        return np.array(taken, np.int64)

    def release(self, events: np.ndarray) -> None:
        with self._lock:
            self._free.extend(int(e) for e in events)

    def read(self, events, launched, task_names):
        """(start ns, kernel ns, [(task name, start ns, ns)]) of one call: its events were
        recorded around each task, start and end, in order (launched: grid > 0 per task)."""
        api = self.api
        api.event_synchronize(int(events[-1]))
        anchor, anchor_ns = self._anchor

        def ns_between(a, b):
            return int(api.event_elapsed_ms(a, b) * 1e6)

        # the call's start from the process-wide anchor; every other time from the call's first
        # event: small offsets keep the float milliseconds precise, and equal events give equal
        # times, so a task's interval lies inside its call's
        first = int(events[0])
        start = anchor_ns + ns_between(anchor, first)

        def at(k):
            return start + ns_between(first, int(events[k]))

        tasks = []
        for k, name in enumerate(task_names):
            if launched[k]:
                begin = at(2 * k)
                tasks.append((name, begin, at(2 * k + 1) - begin))
        return start, at(len(events) - 1) - start, tasks


class GpuLaunchTimer:
    """The launch of one profiled GPU plan: ``launch(packed) -> status`` runs ``launch_timed
    (packed, events)``, which records timing event ``events[2k]`` before task k and
    ``events[2k + 1]`` after it on the launch stream (also around a task that does not launch)
    and returns a negative status when every task launched (else the failed one's: the caller
    raises); the events are queued for a lazy read. ``grids`` is the plan's view of its tasks'
    grids in that launch (0: not launched), ``pool`` the GPU's :class:`GpuEventPool`, ``device``
    the name its records carry."""

    def __init__(self, kernel: str, task_names, launch_timed, grids, pool: GpuEventPool, device: str):
        self.kernel = kernel
        self.task_names = list(task_names)
        self.launch_timed = launch_timed
        self.grids = grids
        self.pool = pool
        self.device = device

    def launch(self, packed) -> int:
        if not self.task_names:   # a kernel with no work launches nothing
            kernel_profiler.record(self.kernel, self.device, now_ns(), 0, [])
            return self.launch_timed(packed, None)
        pool = self.pool
        events = pool.take(2 * len(self.task_names))
        try:
            status = self.launch_timed(packed, events)
        except BaseException:
            pool.release(events)
            raise
        if status >= 0:   # a failed launch: the caller raises; nothing to read
            pool.release(events)
        else:
            kernel_profiler.launched_on_gpu(self, events, self.grids > 0)
        return status


class CudaLaunchTimer(GpuLaunchTimer):
    """A profiled CUDA plan's :class:`GpuLaunchTimer`: ``launch_timed(packed, events)`` takes
    both by address (targets/cuda/runtime.py's native launch loop)."""

    def __init__(self, kernel: str, task_names, launch_timed, grids):
        def by_address(packed, events):
            return launch_timed(packed, 0 if events is None else events.ctypes.data)

        super().__init__(kernel, task_names, by_address, grids, kernel_profiler.events, "cuda")


kernel_profiler = KernelProfiler()


# -- the kernel profiler's public functions (Quadrants' names) ------------------------------------------

COUNT = "count"   # print_kernel_profiler_info modes: statistics per kernel and task
TRACE_MODE = "trace"  # ... or every recorded call


def print_kernel_profiler_info(mode: str = COUNT) -> None:
    """Print the kernel profiler's records: ``'count'`` (default) the statistics per kernel and
    per task (calls, total/min/avg/max time), ``'trace'`` every recorded call."""
    if mode not in (COUNT, TRACE_MODE):
        raise ValueError(f"print_kernel_profiler_info: mode must be 'count' or 'trace', got {mode!r}")
    if not _profiler_on():
        return
    print(_trace_table() if mode == TRACE_MODE else _count_table())


def query_kernel_profiler_info(name: str) -> KernelProfilerQueryResult | None:
    """Statistics of the kernel or task ``name`` (milliseconds): a kernel by its qualified name
    (``module.kernel``) or its plain name (every kernel of that name together), a task by its
    name (``kernel.tasks()``' ``Task.name``). An unknown name gives ``counter == 0``."""
    if not _profiler_on():
        return None
    stats = kernel_profiler.statistics()
    matched = [stats[name]] if name in stats else \
        [s for s in stats.values() if s.kind == "kernel" and s.name.rsplit(".", 1)[-1] == name]
    merged = StatisticalResult(name, "kernel")
    for s in matched:
        merged.merge(s)
    return KernelProfilerQueryResult(merged.counter, merged.min_time, merged.max_time, merged.avg_time,
                                     merged.total_time)


def clear_kernel_profiler_info() -> None:
    """Drop every kernel profiler record."""
    if _profiler_on():
        kernel_profiler.clear()


def get_kernel_profiler_total_time() -> float:
    """Seconds spent in all recorded kernel calls."""
    if not _profiler_on():
        return 0.0
    return sum(s.total_time for s in kernel_profiler.statistics().values() if s.kind == "kernel") / 1000


def _count_table() -> str:
    stats = kernel_profiler.statistics()
    kernels = sorted((s for s in stats.values() if s.kind == "kernel"), key=lambda s: -s.total_time)
    total_ms = sum(s.total_time for s in kernels)
    header = f"Kernel Profiler(count) @ {config.current.arch.upper()}"
    columns = "[      %     total   count |      min       avg       max   ] Kernel name"
    rows = []
    for kernel in kernels:
        rows.append(_count_row(kernel, total_ms, ""))
        tasks = sorted((s for s in stats.values() if s.kind == "task" and s.kernel == kernel.name),
                       key=lambda s: s.name)
        rows += [_count_row(task, total_ms, "  task ") for task in tasks]
    summary = (f"[100.00%] Total execution time: {total_ms / 1000:7.3f} s   "
               f"number of results: {len(kernels)}")
    return _table(header, columns, rows, summary)


def _count_row(s: StatisticalResult, total_ms: float, prefix: str) -> str:
    share = 100.0 * s.total_time / total_ms if total_ms else 0.0
    return (f"[{share:6.2f}% {s.total_time / 1000:7.3f} s {s.counter:6d}x |"
            f"{s.min_time:9.3f} {s.avg_time:9.3f} {s.max_time:9.3f} ms] {prefix}{s.name}")


def _trace_table() -> str:
    records = kernel_profiler.records()
    header = f"Kernel Profiler(trace) @ {config.current.arch.upper()}"
    columns = "[  start.time | kernel.time ] Kernel name"
    origin = records[0].start_ns if records else 0
    rows = [f"[{(r.start_ns - origin) * 1e-6:9.3f} ms |{r.duration_ns * 1e-6:9.3f} ms ] "
            f"{'  task ' if r.kind == 'task' else ''}{r.name}" for r in records]
    return _table(header, columns, rows, f"Number of records:  {len(records)}")


def _table(header: str, columns: str, rows: list[str], summary: str) -> str:
    width = max(len(header), len(columns))
    return "\n".join(["=" * width, header, "=" * width, columns, "-" * width, *rows, "-" * width, summary,
                      "=" * width])


# -- compile records --------------------------------------------------------------------------------------

SLOW_COMPILE_SECONDS = 1.0   # a compile slower than this logs one warning per process


@dataclasses.dataclass
class CompileRecord:
    """One compile of a kernel instance for a target: the seconds of each stage, in order."""

    kernel: str
    target: str                 # "cpu", "cuda", or "cuda (compile check)"
    start_ns: int
    seconds: float = 0.0
    stages: dict[str, float] = dataclasses.field(default_factory=dict)
    # seconds worked on other threads (CUDA: NVVM, nvJitLink on the device-codegen pool), per
    # stage; they overlap the stages, which split the compiling thread's time
    threads: dict[str, float] = dataclasses.field(default_factory=dict)
    # the stages open in this compile, innermost last: seconds of the stages nested in each
    _open_stages: list = dataclasses.field(default_factory=list, repr=False, compare=False)

    def describe(self) -> str:
        stages = ", ".join(f"{name} {sec:.3f} s" for name, sec in self.stages.items())
        return f"kernel '{self.kernel}' for {self.target} in {self.seconds:.3f} s ({stages})"


@dataclasses.dataclass(frozen=True)
class CompileQueryResult:
    """What :func:`query_compile_info` returns: the number of compiles, their total seconds,
    the seconds per stage summed over them, and the records themselves."""

    counter: int = 0
    total: float = 0.0
    stages: dict[str, float] = dataclasses.field(default_factory=dict)
    records: tuple[CompileRecord, ...] = ()


_compile_records: list[CompileRecord] = []
_compile_lock = threading.Lock()
_open = threading.local()          # the records being compiled in this thread, innermost last
_warned_slow_compile = False


def _open_records() -> list:
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    return stack


@contextlib.contextmanager
def compiling(kernel: str, target: str):
    """Time one compile of ``kernel`` for ``target``; :func:`stage` blocks inside it add its
    stages. A compile that raises leaves no record. A compile nested in another (the CUDA
    compile check) is also one stage of the outer one."""
    stack = _open_records()
    record = CompileRecord(kernel, target, now_ns())
    stack.append(record)
    start = time.perf_counter()
    try:
        yield record
    finally:
        stack.pop()
    record.seconds = time.perf_counter() - start
    other = record.seconds - sum(record.stages.values())
    if other >= 0.001:   # outside every stage: one-time imports and set-up, glue
        record.stages["other"] = other
    with _compile_lock:
        _compile_records.append(record)
    if stack:
        outer = stack[-1].stages
        outer[target] = outer.get(target, 0.0) + record.seconds
    _report_compile(record, outermost=not stack)


@contextlib.contextmanager
def stage(name: str, *, llvm: bool = False):
    """Add the time of this block to stage ``name`` of the compile open in this thread (if
    any), less the time of the stages opened inside it (each counts its own), so the stages
    of a record add up to its time. ``llvm=True``: the part spent inside LLVM (Numba's LLVM
    lock) goes to stage "LLVM"."""
    stack = getattr(_open, "stack", None)
    if not stack:
        yield
        return
    record = stack[-1]
    stages, nested = record.stages, [0.0]
    listener = None
    start = time.perf_counter()
    record._open_stages.append(nested)
    try:
        if llvm:
            from numba.core import event

            listener = event.TimingListener()
            with event.install_listener("numba:llvm_lock", listener):
                yield
        else:
            yield
    finally:
        record._open_stages.pop()
    seconds = time.perf_counter() - start
    if record._open_stages:     # a stage inside a stage: its time is not the outer one's
        record._open_stages[-1][0] += seconds
    seconds -= nested[0]
    if listener is not None and listener.done:
        seconds -= listener.duration
        stages["LLVM"] = stages.get("LLVM", 0.0) + listener.duration
    stages[name] = stages.get(name, 0.0) + seconds


def add_stage_time(name: str, seconds: float, *, background: float = 0.0) -> None:
    """Add ``seconds`` of the compiling thread to stage ``name`` of the compile open in this
    thread (if any), and ``background`` seconds that other threads worked for it."""
    stack = getattr(_open, "stack", None)
    if not stack:
        return
    record = stack[-1]
    record.stages[name] = record.stages.get(name, 0.0) + seconds
    if record._open_stages:     # inside a stage: not that stage's time
        record._open_stages[-1][0] += seconds
    if background:
        record.threads[name] = record.threads.get(name, 0.0) + background


def _report_compile(record: CompileRecord, outermost: bool) -> None:
    global _warned_slow_compile
    if logger.isEnabledFor(logging.INFO):
        logger.info("compiled %s", record.describe())
    if outermost and record.seconds >= SLOW_COMPILE_SECONDS and not _warned_slow_compile:
        _warned_slow_compile = True
        logger.warning(
            "kernel '%s' took %.1f s to compile for %s (%s). A kernel compiles once per argument "
            "types and template values; qd.init(log_level=qd.INFO) or QD_LOG_LEVEL=info logs every "
            "compile, and qd.profiler.print_compile_info() lists them (shown once per process)",
            record.kernel, record.seconds, record.target,
            ", ".join(f"{name} {sec:.2f} s" for name, sec in record.stages.items()))


def query_compile_info(name: str, target: str | None = None) -> CompileQueryResult:
    """The compiles of kernel ``name`` (qualified or plain name), for ``target`` or every
    target; seconds. An unknown name gives ``counter == 0``."""
    with _compile_lock:
        records = tuple(r for r in _compile_records
                        if name in (r.kernel, r.kernel.rsplit(".", 1)[-1]) and target in (None, r.target))
    stages: dict[str, float] = {}
    for r in records:
        for stage_name, seconds in r.stages.items():
            stages[stage_name] = stages.get(stage_name, 0.0) + seconds
    return CompileQueryResult(len(records), sum(r.seconds for r in records), stages, records)


def print_compile_info() -> None:
    """Print the compile records: per kernel and target, the compiles, their time, and the
    time per stage."""
    with _compile_lock:
        records = list(_compile_records)
    groups: dict[tuple[str, str], list[CompileRecord]] = {}
    for r in records:
        groups.setdefault((r.kernel, r.target), []).append(r)
    rows = []
    for (kernel, target), group in sorted(groups.items(), key=lambda kv: -sum(r.seconds for r in kv[1])):
        stages: dict[str, float] = {}
        for r in group:
            for name, seconds in r.stages.items():
                stages[name] = stages.get(name, 0.0) + seconds
        rows.append(f"[{sum(r.seconds for r in group):8.3f} s {len(group):6d}x ] {kernel} ({target})")
        rows.append("      " + " | ".join(f"{name} {seconds:.3f} s" for name, seconds in stages.items()))
    total = sum(r.seconds for r in records if r.target != "cuda (compile check)")
    print(_table("Compile times (qd_numba)", "[     total   count ] Kernel name (target), then its stages",
                 rows, f"Total compile time: {total:.3f} s   compiles: {len(records)}"))


def clear_compile_info() -> None:
    """Drop every compile record."""
    with _compile_lock:
        _compile_records.clear()


# Quadrants' host-side "scoped profiler" reports where host time went, compiles included
print_scoped_profiler_info = print_compile_info
clear_scoped_profiler_info = clear_compile_info

# -- Chrome trace -----------------------------------------------------------------------------------------


_TRACE_THREADS = {"cpu": 0, "cuda": 1, "amdgpu": 2}


def export_chrome_trace(path: str | os.PathLike) -> None:
    """Write the recorded kernel calls, tasks and compiles as a Chrome trace (JSON; opens in
    Perfetto or chrome://tracing). Host work is thread 0, CUDA device time thread 1, AMDGPU
    device time thread 2."""
    pid = os.getpid()
    events = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}}
              for tid, label in ((0, "host"), (1, "cuda device"), (2, "amdgpu device"))]
    with _compile_lock:
        compiles = list(_compile_records)
    for r in compiles:
        events.append({"name": r.kernel, "cat": "compile", "ph": "X", "pid": pid, "tid": 0,
                       "ts": r.start_ns / 1000, "dur": r.seconds * 1e6,
                       "args": {"target": r.target, **{k: round(v, 6) for k, v in r.stages.items()}}})
    for r in kernel_profiler.records():
        events.append({"name": r.name, "cat": r.kind, "ph": "X", "pid": pid, "tid": _TRACE_THREADS[r.device],
                       "ts": r.start_ns / 1000, "dur": r.duration_ns / 1000, "args": {"kernel": r.kernel}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


apply_log_level(config.current.log_level)   # QD_LOG_LEVEL, also without qd.init
