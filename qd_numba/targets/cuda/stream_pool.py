"""Stream-parallel launches: the pool of streams and a plan's fork/join over it (docs/streams.md).

A launch plan whose tasks belong to two or more ``qd.stream_parallel()`` groups
(``Task.stream_group``, passes/stream_blocks.py) launches through :class:`StreamBlocks` instead of
the native launch-all loop. Its rules:

* the *caller's stream* S is word 1 of the plan's packed array: 0 (the legacy default stream) or
  the ``qd_stream=`` of the call (plan.py puts it there). Tasks outside every group run on S, in
  program order;
* a run of consecutive groups forks: an event recorded on S, which the pool streams wait for;
  the run's first group runs on S itself, its k-th other group on pool stream k (tasks of one
  group in program order on their stream); each pool stream records a join event after its
  group, and S waits for it. So everything is ordered on S before the kernel returns, with no
  host wait and no device-wide synchronisation; the copies and the return value's read that
  follow on the legacy default stream come after it (S is that stream, or is ordered with it);
* the pool's streams are created once per process, on first need, and reused by every plan.
  They are *non-blocking* streams: a blocking stream would be serialised with the legacy
  default stream, where S usually is;
* two events per plan serve every fork and every join: a stream's wait takes the event's state
  when it is queued.

Launches go one task at a time through the native ``launch_task`` (runtime.py), with the stream
word set per group; the driver calls around them are plain ctypes calls into libcuda (well under
a microsecond each). Plans that launch task by task for other reasons (debug plans checking
error words, the kernel profiler) and gradient kernels launch in order on S: :func:`stream_blocks`
returns None for them.
"""

from __future__ import annotations

import ctypes

from .runtime import _check, _driver, launchers

_pool: list = []        # handles of the non-blocking pool streams, created on first need
_libcuda = None


def _cuda_lib():
    """libcuda's ``cuEventRecord`` and ``cuStreamWaitEvent`` as ctypes functions."""
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        record, wait = lib.cuEventRecord, lib.cuStreamWaitEvent
        record.argtypes, record.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
        wait.argtypes, wait.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint], ctypes.c_int
        _libcuda = (record, wait)
    return _libcuda


def pool_streams(rt, count: int) -> list:
    """The first ``count`` streams of the pool (more are created when needed)."""
    drv = _driver()
    rt.context  # noqa: B018  (numba made the primary context current in this thread)
    while len(_pool) < count:
        _pool.append(int(_check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING),
                                "cuStreamCreate(stream pool)")))
    return _pool[:count]


def launch_program(groups) -> list:
    """Per task stream group (program order) -> the program :class:`StreamBlocks` runs: a list of
    ``(False, tasks)`` (in order on S) and ``(True, [tasks of each group])`` (a fork/join)."""
    program = []
    for k, group in enumerate(groups):
        if group == 0:
            if program and not program[-1][0]:
                program[-1][1].append(k)
            else:
                program.append((False, [k]))
            continue
        if not program or not program[-1][0]:
            program.append((True, {}))
        program[-1][1].setdefault(group, []).append(k)
    return [(parallel, list(parts.values()) if parallel else parts) for parallel, parts in program]


class StreamBlocks:
    """The fork/join launch of one plan (see the module docstring); :meth:`launch` returns what
    the native launcher does: -1, or ``task index << 32 | CUresult`` of the first failure."""

    def __init__(self, packed, program, pool, events, launch_task, record, wait):
        self.words = packed                       # the plan's packed array (word 1: S)
        self.address = packed.ctypes.data
        self.program = program                    # launch_program()
        self.pool = pool                          # pool stream handles, enough for the widest fork
        self.fork, self.join = events             # event handles
        # launch_task(address, k) as runtime.Launchers; record(event, stream) and
        # wait(stream, event, flags) as cuEventRecord and cuStreamWaitEvent (-> CUresult)
        self.launch_task, self.record, self.wait = launch_task, record, wait

    def launch(self) -> int:
        words, caller = self.words, int(self.words[1])
        try:
            for parallel, parts in self.program:
                if not parallel:
                    status = self._launch(parts)
                    if status >= 0:
                        return status
                    continue
                self._driver(self.record(self.fork, caller), "cuEventRecord (fork)")
                for j, tasks in enumerate(parts):
                    stream = self.pool[j - 1] if j else caller
                    if j:
                        self._driver(self.wait(stream, self.fork, 0), "cuStreamWaitEvent (fork)")
                    words[1] = stream
                    status = self._launch(tasks)
                    words[1] = caller
                    if status >= 0:
                        return status
                    if j:
                        self._driver(self.record(self.join, stream), "cuEventRecord (join)")
                        self._driver(self.wait(caller, self.join, 0), "cuStreamWaitEvent (join)")
        finally:
            words[1] = caller
        return -1

    def _launch(self, tasks) -> int:
        for k in tasks:
            status = self.launch_task(self.address, k)
            if status >= 0:
                return status
        return -1

    @staticmethod
    def _driver(err: int, what: str) -> None:
        if err:
            _check((_driver().CUresult(err),), what)


def stream_blocks(plan) -> StreamBlocks | None:
    """The :class:`StreamBlocks` of ``plan``, or None when it launches all tasks in order on S: fewer
    than two groups, a gradient kernel, a debug plan or a profiled one."""
    groups = [launch.task.stream_group for launch in plan.launches]
    if len(set(groups) - {0}) < 2 or plan.kernel.autodiff_mode is not None or plan.error_words \
            or plan.timer is not None:
        return None
    program = launch_program(groups)
    rt = plan.rt
    width = max(len(parts) for parallel, parts in program if parallel)
    return StreamBlocks(plan.packed, program, pool_streams(rt, width - 1), (rt.event_create(), rt.event_create()),
                        launchers().launch_task, *_cuda_lib())
