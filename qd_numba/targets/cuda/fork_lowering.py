"""Lowering a kernel's task kernels in forked worker processes.

Numba types and lowers a task kernel in Python, under a global lock: the tasks of a kernel lower
one after another on one core, and at 32 tasks that is most of a cold compile (NVVM and
nvJitLink already run on a thread pool, compile.py ``DeviceCodegen``). Tasks that load no
temporary are independent once the kernel is planned, so the compiling process forks workers
that lower a share of them each while it lowers its own share. ``fork()`` gives a worker the
compiler's whole state (the planned kernel, Numba's registries and caches) without serialising
any of it; a worker sends back, per task, what the compiling process keeps of a lowered task:
the NVVM IR text with what numba-cuda needs to link it (rebuilt as a ``CUDACodeLibrary``), the
parameter layout, the types of the values the task stores for later tasks, and the types its
variables took (``TaskTyper.label_types``, passes/task_types.py). NVVM and nvJitLink then run on
the compiling process's pool, as for a task lowered there: the cubins are those of the serial
path (tests/test_fork_lowering.py compares them).

Numba types cross the pipe by their interning code when they existed before the fork (the
compiling process still holds them), a function type made in the worker by the value it types
(resolved again here), anything else by pickling. A task whose result cannot be sent, a worker
that fails, dies or sends nothing for :data:`STALL_SECONDS`, a fork the system refuses: those
tasks lower in the compiling process afterwards, as without workers, so an error is raised
exactly as the serial path raises it. Workers never call NVVM, nvJitLink or the CUDA driver,
never write to stdout/stderr (in a notebook those are the kernel's sockets), and the fork happens
under Numba's compiler locks, so no thread of this process is inside Numba's compiler when it
forks. Forking copies the process's page tables: a process holding many gigabytes spends a few
milliseconds per worker on it.

Linux only (``fork`` without ``exec`` is not safe on macOS, absent on Windows); never for debug
compiles (their exception tables stay in the process that lowered the task) or printed IR;
``qd.init(compile_processes=...)`` / ``QD_COMPILE_PROCESSES`` (docs/configuration.md).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from numba.core import types
from numba.core.types import abstract as types_abstract

from ... import config

log = logging.getLogger("qd_numba")

MIN_TASKS_PER_PROCESS = 2      # auto mode: a worker for every two independent tasks at most
MIN_TASKS = 6                  # auto mode: fewer independent tasks lower in the compiling process
MIN_CORES = 4                  # auto mode: with fewer cores, workers and NVVM's pool only contend
STALL_SECONDS = 300.0          # a worker silent this long is stopped; its tasks lower here
_HEADER = 8                    # bytes of a message's length


def processes_for(tasks: int) -> int:
    """How many processes (the compiling one included) lower ``tasks`` independent tasks: 1 where
    workers are off, not possible, or not worth a fork."""
    cfg = config.current
    wanted = cfg.compile_processes
    if wanted == 1 or tasks < 2 or sys.platform != "linux" or cfg.debug or cfg.print_ir:
        return 1
    if wanted == 0:     # auto: one per core, two tasks each at least (docs/compile_time.md)
        cores = len(os.sched_getaffinity(0))
        if tasks < MIN_TASKS or cores < MIN_CORES:
            return 1
        wanted = min(cores, tasks // MIN_TASKS_PER_PROCESS)
    return max(1, min(wanted, tasks))


def share_out(costs: Sequence[int], processes: int) -> list[list[int]]:
    """Indices of ``costs`` split into ``processes`` lists of about equal total cost (largest
    first onto the least loaded), each list in ascending order."""
    loads = [0] * processes
    shares: list[list[int]] = [[] for _ in range(processes)]
    for k in sorted(range(len(costs)), key=lambda k: -costs[k]):
        p = loads.index(min(loads))
        loads[p] += costs[k]
        shares[p].append(k)
    return [sorted(s) for s in shares]


def lower_in_processes(jobs: Sequence[Any], costs: Sequence[int], processes: int,
                       lower: Callable[[Any], Any], ship: Callable[[Any], Any],
                       on_result: Callable[[int, Any], None]) -> set[int]:
    """Lower ``jobs`` on ``processes`` processes (this one and forked workers).

    ``lower(job)`` lowers one job (in whichever process runs it); ``ship(lowered)`` reduces its
    result to what crosses the pipe; ``on_result(k, shipped)`` gets each job's shipped result, in
    this process, as it arrives (jobs this process lowers are shipped too, so every result has one
    form). Returns the indices of the jobs no process delivered: the caller lowers them itself.
    Blocks until every worker is done or stopped.

    The first job lowers here before any fork: what Numba sets up lazily at a process's first
    compile (its typing and target registries, a template's first resolution: ~1 s on the H100
    host) then happens once, and the workers inherit it instead of each doing it again."""
    missing: set[int] = set()

    def here(k: int) -> None:
        try:
            shipped = ship(lower(jobs[k]))
        except Exception:   # lowered again by the caller, in program order: the serial path's error
            missing.add(k)
            return
        on_result(k, shipped)

    here(0)
    if missing:     # the first task fails: the caller raises its error before any other task lowers
        return set(range(len(jobs)))
    rest = list(range(1, len(jobs)))
    shares = [[rest[j] for j in share] for share in share_out([costs[k] for k in rest], processes)]
    own, worker_shares = shares[0], [s for s in shares[1:] if s]
    workers, unforked = _fork_workers(jobs, worker_shares, lower, ship)
    try:
        collector = _Collector(workers, on_result)
        for k in sorted(own + unforked):                # this process's share, meanwhile,
            here(k)
            collector.read(0)       # workers' results start NVVM as soon as they are there
        missing |= collector.finish()
    finally:
        _stop(workers)
    for worker in workers:
        missing |= worker.pending
    return missing


class _Worker:
    def __init__(self, pid: int, fd: int, share: list[int]):
        self.pid, self.fd = pid, fd
        self.pending = set(share)       # jobs not delivered yet
        self.buffer = bytearray()
        self.last = time.monotonic()
        self.open = True


def _compiler_locks() -> list:
    """Numba's and numba-cuda's global compiler locks: held across the fork, so no other thread
    of this process is inside either compiler then (the locks are reentrant: the forking thread
    already holds them while it compiles)."""
    from numba.core.compiler_lock import global_compiler_lock as numba_lock
    from numba.cuda.core.compiler_lock import global_compiler_lock as cuda_lock

    return [numba_lock, cuda_lock] if cuda_lock is not numba_lock else [numba_lock]


def _fork_workers(jobs, shares, lower, ship) -> tuple[list[_Worker], list[int]]:
    """(the workers forked, one per share; the jobs of shares no worker took: the system refused a
    pipe or a process, and this process lowers them)."""
    workers: list[_Worker] = []
    locks = _compiler_locks()
    before = types_abstract._autoincr()     # every type that exists now has a smaller code
    for lock in locks:
        lock.acquire()
    try:
        for stream in (sys.stdout, sys.stderr):     # a worker's copy of their buffers must be empty
            try:                                    # (nothing printed twice); None under pythonw
                stream.flush()
            except Exception:
                pass
        for n, share in enumerate(shares):
            try:
                read_fd, write_fd = os.pipe()
                try:
                    with warnings.catch_warnings():
                        # Python 3.12+ warns about fork() with other threads alive: the workers run
                        # no thread and never take a lock another thread of this process may hold
                        warnings.simplefilter("ignore", DeprecationWarning)
                        pid = os.fork()
                except OSError:
                    os.close(read_fd)
                    os.close(write_fd)
                    raise
            except OSError as e:    # out of processes or descriptors: the rest lowers here
                log.debug("qd_numba: no compile worker (%s); %d task(s) lower in this process", e,
                          sum(len(s) for s in shares[n:]))
                return workers, sorted(k for s in shares[n:] for k in s)
            if pid == 0:                                # the worker
                os.close(read_fd)
                _worker_main(write_fd, jobs, share, lower, ship, before)   # never returns
            os.close(write_fd)
            os.set_blocking(read_fd, False)
            workers.append(_Worker(pid, read_fd, share))
    except BaseException:
        _stop(workers)
        raise
    finally:
        for lock in reversed(locks):
            lock.release()
    return workers, []


def _worker_main(fd: int, jobs, share, lower, ship, before: int) -> None:
    """A worker: lower each job of ``share``, write one message per job, exit. Never returns."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # Ctrl-C ends the worker; the parent decides
        from . import compile as cuda_compile

        cuda_compile._pools.clear()     # the parent's pool threads do not exist here
        for k in share:
            try:
                with warnings.catch_warnings(record=True) as caught:
                    shipped = ship(lower(jobs[k]))
                data = _dumps((k, shipped, _warnings(caught)), before)
            except BaseException:       # the compiling process lowers it again and raises the error
                data = pickle.dumps((k, None, []))
            _write_all(fd, len(data).to_bytes(_HEADER, "little") + data)
    finally:
        # no flush of sys.stdout/stderr here: in a notebook they are the kernel's sockets, which
        # belong to the parent; a worker prints nothing, and its warnings travel with its results
        os._exit(0)


def _warnings(caught) -> list:
    """Warnings a worker's lowering issued, as (message, category, filename, lineno), re-issued
    by the compiling process; only those whose category pickles."""
    out = []
    for w in caught:
        try:
            pickle.dumps(w.category)
        except Exception:
            continue
        out.append((str(w.message), w.category, w.filename, w.lineno))
    return out


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _TypePickler(pickle.Pickler):
    """Pickles Numba types that existed before the fork by their interning code, function types
    made since by the value they type; everything else as pickle does."""

    def __init__(self, file, before: int):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.before = before

    def persistent_id(self, obj):
        if isinstance(obj, types.Type) and getattr(obj, "_code", self.before) < self.before:
            return obj._code
        return None

    def reducer_override(self, obj):
        if isinstance(obj, types.Function):
            return _function_type, (obj.typing_key,)
        return NotImplemented


class _TypeUnpickler(pickle.Unpickler):
    def __init__(self, file, known: dict):
        super().__init__(file)
        self.known = known

    def persistent_load(self, code):
        if not self.known:
            for ref in list(types_abstract._typecache):
                ty = ref()
                if ty is not None:
                    self.known[ty._code] = ty
        ty = self.known.get(code)
        if ty is None:
            raise pickle.UnpicklingError(f"type #{code} is gone")
        return ty


def _function_type(value):
    """The Numba function type of ``value`` in this process (a worker made it; unpickling)."""
    from numba.cuda.descriptor import cuda_target

    ctx = cuda_target.typing_context
    ctx.refresh()       # loaded already where a task was lowered; at no cost then
    ty = ctx.resolve_value_type(value)
    if not isinstance(ty, types.Function):
        raise pickle.UnpicklingError(f"{value!r} types as {ty}, not a function")
    return ty


def _dumps(obj, before: int) -> bytes:
    out = io.BytesIO()
    _TypePickler(out, before).dump(obj)
    return out.getvalue()


class _Collector:
    """Reads the workers' messages as they arrive and hands each result on; ``missing``: jobs
    whose worker sent them as failed (lowered again by the caller). A message that does not load
    leaves its job pending; so does a worker that stops early or stalls."""

    def __init__(self, workers: list[_Worker], on_result):
        self.on_result = on_result
        self.missing: set[int] = set()
        self.known: dict = {}      # interning code -> type of this process (filled at first need)
        self.open = {w.fd: w for w in workers}
        self.poller = select.poll()
        for fd in self.open:
            self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def read(self, timeout_ms: int) -> None:
        """One round: what has arrived within ``timeout_ms`` (0: only what is there now)."""
        events = self.poller.poll(timeout_ms)
        now = time.monotonic()
        for fd, _event in events:
            worker = self.open[fd]
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if chunk:
                worker.buffer += chunk
                worker.last = now
                self.missing |= _messages(worker, self.on_result, self.known)
                continue
            self.poller.unregister(fd)      # end of file: the worker is done
            del self.open[fd]
        for fd, worker in list(self.open.items()):
            if now - worker.last > STALL_SECONDS:
                log.warning("qd_numba: a compile worker (pid %d) sent nothing for %.0f s; its %d task(s) "
                            "lower in this process", worker.pid, STALL_SECONDS, len(worker.pending))
                self.poller.unregister(fd)
                del self.open[fd]
                _kill(worker)

    def finish(self) -> set[int]:
        """Read until every worker is done or stopped."""
        while self.open:
            self.read(1000)
        return self.missing


def _messages(worker: _Worker, on_result, known: dict) -> set[int]:
    missing = set()
    buf = worker.buffer
    while len(buf) >= _HEADER:
        size = int.from_bytes(buf[:_HEADER], "little")
        if len(buf) < _HEADER + size:
            break
        data = bytes(buf[_HEADER:_HEADER + size])
        del buf[:_HEADER + size]
        try:
            k, shipped, caught = _TypeUnpickler(io.BytesIO(data), known).load()
        except Exception as e:      # lowered again here
            log.debug("qd_numba: a compile worker's result did not load (%s)", e)
            continue
        worker.pending.discard(k)
        if shipped is None:
            missing.add(k)
            continue
        for message, category, filename, lineno in caught:
            warnings.warn_explicit(message, category, filename, lineno)
        on_result(k, shipped)
    return missing


def _kill(worker: _Worker) -> None:
    if worker.open:
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stop(workers: list[_Worker]) -> None:
    """Reap every worker (killing those still running after an error) and close the pipes."""
    for worker in workers:
        if not worker.open:
            continue
        try:
            done, _ = os.waitpid(worker.pid, os.WNOHANG)
            if done == 0:
                if worker.pending:
                    _kill(worker)
                os.waitpid(worker.pid, 0)
        except ChildProcessError:
            pass
        try:
            os.close(worker.fd)
        except OSError:
            pass
        worker.open = False
