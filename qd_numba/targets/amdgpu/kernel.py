"""The AMDGPU target and its kernel backend: a ``@qd.kernel`` launched through HIP.

The plan of a kernel instance mirrors the CUDA target's (targets/cuda/plan.py): the
:class:`~qd_numba.targets.cuda.plan.PlanBinary` of its tasks (code objects instead of cubins,
the same parameter slots, temporaries, return slot and host iteration counts), one ``void*[]``
of ctypes cells per task, shared by all tasks of the kernel, and one ``hipModuleLaunchKernel``
per task. A call writes the cells of its arguments, computes the host iteration counts, launches
in program order on the caller's stream (the null stream, or ``qd_stream=``; a non-blocking one
is fenced with the null stream around the launches, where the copies run), copies numpy
arguments back and reads the return value. Tasks in two or more ``qd.stream_parallel()`` groups
fork and join over the runtime's pool of non-blocking streams as on CUDA (the program of
targets/cuda/stream_pool.py ``launch_program``, its events recorded through HIP).

Arguments: scalars, ndarrays (numpy: copied to the device and back; ``qd.ndarray``: in place;
objects with ``__cuda_array_interface__`` holding HIP memory, then DLPack producers on ROCm
(device type kDLROCM: torch on ROCm, cupy, jax): in place), vectors, matrices and structs
(checked as on CUDA, one cell per element in the data model's order) and template values.

With ``qd.init(kernel_profiler=True)`` a plan launches its tasks in order between HIP timing
events (profiler.py ``GpuLaunchTimer``, the CUDA target's timer over HIP's events).
"""

from __future__ import annotations

import ctypes
import threading

import numba
import numpy as np
from numba.core import types

from ... import adstack, config, dlpack, offline_cache, profiler
from ...errors import QuadrantsRuntimeError, QuadrantsTypeError
from ...field import Field, Ndarray, next_generation, written_by
from ...frontend.args import field_for_ndarray_message, template_key
from ...frontend.diagnostics import compile_error
from ...generated_code import exec_generated
from ...lowering.device import c_strides
from ...lowering.raising import raise_recorded
from ..base import KernelBackend, Target
from ..untyped import gc_paused
from .plan import CODEGEN_STAGES, Toolchain, compile_kernel
from .runtime import HipArray, HipRuntime, ensure_device, missing


class AmdgpuTarget(Target):
    arch = "amdgpu"
    codegen_stages = CODEGEN_STAGES
    dlpack_device_type = dlpack.ROCM

    def kernel_backend(self, kernel) -> AmdgpuKernel:
        return AmdgpuKernel(kernel)

    def place(self, data) -> None:
        ensure_device(data)

    def synchronize(self) -> None:
        HipRuntime.get().synchronize()

    def dlpack_buffer(self, data, stream, copy):
        """The HIP buffer of ``data`` (a copy when ``copy``), ordered before the consumer's
        ``stream`` in DLPack's ROCm numbering: None and 0 are the null stream, where kernels and
        copies run (nothing to do), -1 asks for no ordering, a non-blocking stream waits for the
        null stream's work (an event, no host wait); 1 and 2 are CUDA's, not ROCm's."""
        dev = data._dev
        if dev is None:
            return None
        if stream in (1, 2):
            raise QuadrantsTypeError(f"DLPack export of {data._describe()}: stream {stream} is not a ROCm stream "
                                     "(DLPack on ROCm: None or 0 for the default stream, -1 for none, else a "
                                     "hipStream_t)")
        rt = HipRuntime.get()
        if copy:
            dev = dev.copy()
        if stream not in (None, 0, -1) and rt.stream_nonblocking(int(stream)):
            rt.fence(0, int(stream))
        return dev.address, rt.device_id, dev

    def open(self, cfg=None) -> None:
        lacking = missing()
        toolchain = Toolchain.current()
        if toolchain.lld is None:
            lacking.append("ld.lld (pip install 'qd_numba[amdgpu]' for the ziglang wheel's, or set QD_AMDGPU_LLD)")
        if not lacking:
            rt = HipRuntime.get()
            if toolchain.device_libs.get(rt.arch) is None and rt.arch in toolchain.archs:
                lacking.append(f"ROCm's device library for {rt.arch} (ocml.bc and oclc_*.bc: set QD_AMDGPU_DEVICE_LIBS "
                               "or ROCM_PATH)")
            if rt.arch not in toolchain.archs:
                lacking.append(f"the device's processor {rt.arch} in amdgpu_arch ({','.join(toolchain.archs)}; "
                               "QD_AMDGPU_ARCH)")
        if lacking:
            raise QuadrantsRuntimeError("qd.init(arch=amdgpu): this machine lacks " + "; ".join(lacking)
                                        + " (docs/amdgpu.md)")


class _Launch:
    __slots__ = ("fn", "module", "argv", "grid", "block", "total_index", "binary")

    def __init__(self, fn, module, argv, grid, block, total_index, binary):
        self.fn, self.module, self.argv = fn, module, argv
        self.grid, self.block, self.total_index, self.binary = grid, block, total_index, binary


class AmdgpuPlan:
    """One kernel instance on AMDGPU, built once and replayed on every call."""

    def __init__(self, kernel, binary, fields, functions, adstacks=None):
        from ..cuda import tasks as cuda_tasks
        from ..cuda.plan import _CTYPES, host_totals, read_return

        rt = self.rt = HipRuntime.get()
        self.kernel, self.binary, self.fields = kernel, binary, list(fields)
        self.read_return = read_return
        self.tasks = [t.task for t in binary.tasks]
        self.field_table = rt.field_table(fields)
        self.tmp = HipArray((max(1, binary.temp_slots) * 64,), np.uint8)
        self.cells = {cuda_tasks.PARAM_CTX: [ctypes.c_uint64(self.field_table.address)],
                      cuda_tasks.PARAM_TMP: [ctypes.c_uint64(self.tmp.address)]}
        for t in binary.tasks:
            for name in t.runtime_args:
                if name not in self.cells:
                    self.cells[name] = [_CTYPES[fmt]() for arg, fmt in t.slots if arg == name]
        self.launches, range_index = [], 0
        self.grids = np.zeros(len(binary.tasks), np.int64)     # of the last launch (0: not launched)
        for t, (module, fn) in zip(binary.tasks, functions):
            order = [cuda_tasks.PARAM_CTX, cuda_tasks.PARAM_TMP, *t.runtime_args]
            ptrs = [ctypes.addressof(cell) for name in order for cell in self.cells[name]]
            argv = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
            if t.kind == "range_for" and not t.task.serialize:
                (grid, block), total_index = rt.occupancy(fn), range_index
            else:
                grid, block, total_index = 1, 1, None
            range_index += t.kind == "range_for"
            self.launches.append(_Launch(fn, module, argv, grid, block, total_index, t))
        self.totals_fn, self.static_totals = host_totals(kernel, binary.totals, fields)
        if binary.static_totals is not None:    # counts known when it compiled (constants, field shapes)
            self.static_totals = binary.static_totals
        self.error_words = [(launch, rt.global_address(launch.module, launch.binary.error_symbol))
                            for launch in self.launches if launch.binary.error_symbol]
        runtime_positions = [i for i, p in enumerate(kernel.params) if p.kind != "template"]
        written, written_args = written_by(self.tasks, len(runtime_positions), self.fields,
                                           kernel.autodiff_mode == "reverse")
        # what a launch writes gets a new write generation (field.py; adstack sizes are cached on them)
        self.written, self.written_args = written, tuple(runtime_positions[r] for r in written_args)
        self.program = self.pool = self.events = None
        # qd.init(kernel_profiler=True): timing events around each task (profiler.py)
        self.timer = profiler.GpuLaunchTimer(kernel.qualname, [t.name for t in self.tasks], self._launch_timed,
                                             self.grids, rt.timing_events(), "amdgpu") \
            if config.current.kernel_profiler else None
        groups = [t.task.stream_group for t in binary.tasks]
        # stream_parallel() blocks fork and join, as CUDA's StreamBlocks (gradient, debug and profiled plans: in order)
        if len(set(groups) - {0}) >= 2 and kernel.autodiff_mode is None and not self.error_words \
                and self.timer is None:
            from ..cuda.stream_pool import launch_program

            self.program = launch_program(groups)
            width = max(len(parts) for parallel, parts in self.program if parallel)
            self.pool = rt.pool_streams(width - 1)
            self.events = (rt.event_create(), rt.event_create())
        if adstacks:    # a gradient kernel with loops inside a task: its adstacks sized per launch
            rows = {launch.binary.task.uid: launch.grid * launch.block for launch in self.launches}
            self.run = adstack.wrap_sync_run(self.run, adstacks, kernel, self.fields, rows.__getitem__, _heap)

    def run(self, args, views, stream=0):
        """Launch every task on ``stream`` (0: the null stream) with ``args`` (the kernel's, in
        order) and ``views`` (param name -> (device address, shape, strides, itemsize, copy back,
        what keeps the memory alive until the launch))."""
        for p, a in zip(self.kernel.params, args):
            cells = self.cells.get(p.name)
            if cells is None:
                continue
            if p.kind == "ndarray":
                address, shape, strides, itemsize, _back, _keep = views[p.name]
                values = [0, 0, int(np.prod(shape, dtype=np.int64)), itemsize, address, *shape, *strides]
            elif p.kind == "matrix":
                values = a.entries.reshape(-1).tolist()
            elif p.kind == "struct":
                values = a._flat_tuple()
            else:
                values = [a]
            for cell, value in zip(cells, values, strict=True):
                cell.value = value
        if self.totals_fn is None:
            totals = self.static_totals
        else:   # ndarrays as their shapes: every array kind (DLPack producers too) has one there
            totals = self.totals_fn(tuple(_Shape(views[p.name][1]) if p.kind == "ndarray" else a
                                          for p, a in zip(self.kernel.params, args)))
        rt = self.rt
        nonblocking = bool(stream) and rt.stream_nonblocking(stream)
        if nonblocking:
            rt.fence(0, stream)
        if self.timer is not None:
            self.timer.launch((totals, stream))
        elif self.program is None:
            for launch in self.launches:
                self._launch(launch, totals, stream)
        else:
            self._fork_join(totals, stream)
        if nonblocking:
            rt.fence(stream, 0)
        for f in self.written:
            f._gen = next_generation()
        for i in self.written_args:
            if type(args[i]) is Ndarray:
                args[i]._gen = next_generation()
        self._raise_recorded()
        for _name, (_address, _shape, _strides, _itemsize, back, _keep) in views.items():
            if back is not None:
                back()
        if self.binary.ret is None:
            return None
        offset, dtype, count = self.binary.ret
        raw = self.tmp.copy_to_host()[offset:offset + np.dtype(dtype).itemsize * count]
        return self.read_return(raw, np.dtype(dtype), self.kernel.return_type)

    def _launch(self, launch, totals, stream) -> int:
        """Launch one task; its grid (0: no iterations, not launched)."""
        grid = launch.grid
        if launch.total_index is not None:
            n = int(totals[launch.total_index])
            if n <= 0:
                return 0
            grid = min(grid, -(-n // launch.block))
        self.rt.launch(launch.fn, grid, launch.block, stream, ctypes.addressof(launch.argv))
        return grid

    def _launch_timed(self, packed, events) -> int:
        """The profiled launch (profiler.py ``GpuLaunchTimer``): ``packed`` is (host iteration
        counts, stream); timing event ``events[2k]`` is recorded before task k and ``events[2k +
        1]`` after it on that stream, also around a task that does not launch. HIP's errors
        raise, so a launch that returns launched every task (-1)."""
        totals, stream = packed
        rt = self.rt
        for k, launch in enumerate(self.launches):
            rt.event_record(int(events[2 * k]), stream)
            self.grids[k] = self._launch(launch, totals, stream)
            rt.event_record(int(events[2 * k + 1]), stream)
        return -1

    def _fork_join(self, totals, caller) -> None:
        """The tasks of a stream_parallel() plan: a run of groups forks from the caller's stream
        (an event the pool streams wait for), its first group on the caller's stream, its k-th
        other group on pool stream k, each joined back by an event the caller's stream waits for."""
        rt, (fork, join) = self.rt, self.events
        for parallel, parts in self.program:
            if not parallel:
                for k in parts:
                    self._launch(self.launches[k], totals, caller)
                continue
            rt.event_record(fork, caller)
            for j, tasks in enumerate(parts):
                stream = self.pool[j - 1] if j else caller
                if j:
                    rt.stream_wait_event(stream, fork)
                for k in tasks:
                    self._launch(self.launches[k], totals, stream)
                if j:
                    rt.event_record(join, stream)
                    rt.stream_wait_event(caller, join)

    def _raise_recorded(self) -> None:
        """The first exception a task recorded (debug mode), as the CUDA plan raises it."""
        raise_recorded(self.kernel, self.rt, self.error_words, lambda launch: launch.binary.task)


class _Shape:
    """An ndarray argument as the host iteration counts see it (its ``shape``)."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = shape


def _heap(words: int):
    """(HIP buffer, address) of an adstack heap of ``words`` int64 words."""
    buf = HipArray((words,), np.int64)
    return buf, buf.address


def _ndarray_view(where, a):
    """(Numba type, (device address, shape, byte strides, itemsize, copy-back or None, what keeps
    the memory alive until the launch)) of an ndarray argument on AMDGPU."""
    if type(a) is Ndarray:
        ensure_device(a)
        arr = a._arr
        return numba.typeof(arr), (a._dev.address, arr.shape, arr.strides, arr.itemsize, None, a)
    if isinstance(a, np.ndarray):
        host = np.ascontiguousarray(a)
        dev = HipArray(host.shape, host.dtype)
        dev.copy_to_device(host)

        def back():
            if a.flags.writeable:
                a[...] = dev.copy_to_host()

        return numba.typeof(host), (dev.address, host.shape, host.strides, host.itemsize, back, dev)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        dtype = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or tuple(int(s) * dtype.itemsize
                                              for s in np.cumprod((1,) + shape[:0:-1])[::-1])
        layout = "C" if cai.get("strides") is None else "A"
        ty = types.Array(numba.from_dtype(dtype), len(shape), layout)
        return ty, (int(cai["data"][0]), shape, tuple(strides), dtype.itemsize, None, a)
    if isinstance(a, Field):    # fields export DLPack, but are not ndarray arguments
        raise QuadrantsTypeError(field_for_ndarray_message(where, a))
    if hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
        # DLPack's ROCm stream 0: the producer's pending work is ordered before the null stream
        address, shape, strides, dtype, owner = dlpack.consume(a, where, "qd.amdgpu", (dlpack.ROCM,),
                                                               HipRuntime.get().device_id, 0, _on_other_device)
        contiguous = tuple(strides) == tuple(c_strides(shape, dtype.itemsize))
        ty = types.Array(numba.from_dtype(dtype), len(shape), "C" if contiguous else "A")
        return ty, (address, shape, strides, dtype.itemsize, None, owner)
    raise QuadrantsTypeError(f"{where}: expected a numpy array, a qd.ndarray, an object with "
                             f"__cuda_array_interface__ (HIP memory) or a ROCm DLPack producer on qd.amdgpu, "
                             f"got {type(a).__name__}")


def _on_other_device(where: str, theirs: int, ours: int) -> QuadrantsTypeError:
    return QuadrantsTypeError(f"{where}: the array is on ROCm device {theirs}, but qd_numba runs on device {ours}; "
                              f"move it to device {ours} (torch: .to('cuda:{ours}')) or run this kernel in a process "
                              "on that device")


class AmdgpuKernel(KernelBackend):
    """The AMDGPU side of one ``@qd.kernel``: its plans, per argument spec."""

    arch = "amdgpu"

    def __init__(self, kernel):
        self.kernel = kernel
        self.plans = {}
        self.lock = threading.RLock()

    def make_caller(self):
        """The kernel's ``__call__`` on AMDGPU: the kernel's parameters (Kernel.caller_prologue),
        then :meth:`call`."""
        ns = {"call": self.call}
        lines, names = self.kernel.caller_prologue(ns)
        lines.append(f"    return call({', '.join(names)})")
        exec_generated("\n".join(lines) + "\n", f"amdgpu call {self.kernel.qualname}", ns)
        return ns["__call__"]

    def call(self, *args):
        plan, args, views = self._plan(args)
        return plan.run(args, views)

    def call_on_stream(self, handle, args):
        """The call with its launches on HIP stream ``handle`` (``qd_stream=``, streams.py)."""
        plan, args, views = self._plan(args)
        return plan.run(args, views, handle)

    def tasks(self, args) -> list:
        return list(self._plan(args)[0].tasks)

    def compiled_count(self) -> int:
        return len(self.plans)

    def tasks_and_fields(self, args):
        plan = self._plan(args)[0]
        return plan.tasks, plan.fields

    def _plan(self, args):
        """(plan, the arguments with vectors/matrices/structs checked and converted, ndarray views)."""
        from ..cuda.kernel import _check_matrix

        kernel = self.kernel
        param_types, templates, views, key, args = {}, {}, {}, [], list(args)
        for i, (p, a) in enumerate(zip(kernel.params, args)):
            where = f"kernel '{kernel.name}', argument '{p.name}'"
            if p.kind == "template":
                templates[p.name] = a
                key.append(template_key(a))
            elif p.kind == "ndarray":
                param_types[p.name], views[p.name] = _ndarray_view(where, a)
                key.append(param_types[p.name])
            elif p.kind in ("matrix", "struct"):
                args[i] = _check_matrix(kernel, p, a)
                param_types[p.name] = p.nbtype
            else:
                param_types[p.name] = p.nbtype
        key = tuple(key)
        with self.lock:
            plan = self.plans.get(key)
            if plan is None:
                plan = self.plans[key] = self._build(param_types, templates)
        return plan, tuple(args), views

    def _build(self, param_types, templates):
        """The plan of an argument spec: from the offline cache (code objects loaded, no frontend,
        no compile) or compiled, and then written to the cache, as on CUDA (targets/cuda/plan.py
        ``build_plan``: the same :class:`PlanBinary`, code objects in place of cubins)."""
        from ..cuda.plan import plan_binary

        kernel = self.kernel
        rt = HipRuntime.get()
        try:
            with gc_paused(), profiler.compiling(kernel.qualname, "amdgpu"):
                toolchain = Toolchain.current()
                target = toolchain.cache_target(rt.arch)
                cfg = config.current.for_kernel(fuse=kernel.fuse, graph=kernel.graph)
                place = offline_cache.lookup(kernel, param_types, templates, cfg, target)
                if place is not None:
                    with profiler.stage("offline cache load"):
                        loaded = offline_cache.load(place, _load_modules)
                    fields = place.hidden_fields(loaded[1]) if loaded is not None else None
                    if fields is not None:
                        return AmdgpuPlan(kernel, loaded[0], fields, loaded[2])
                toolchain.require_linker()
                state, plan_ir, compiled, temp_types = compile_kernel(kernel, param_types, templates, toolchain)
                per_device = [(unit, tk, c[rt.arch]) for unit, tk, c in compiled]
                binary = plan_binary(kernel, state, plan_ir, per_device, temp_types, target)
                with profiler.stage("module load"):
                    functions = [rt.load_function(t.cubin, t.entry_name) for t in binary.tasks]
        except Exception as e:
            err = compile_error(kernel.name, e, param_types, config.current.raw_errors)
            if err is None:
                raise
            raise err from None
        rt.plan_builds += 1
        kernel.compile_count += 1
        # a gradient kernel with adstacks sizes them from compile-time data: compiled in every process
        hidden_paths = place.hidden_paths(state.hidden) if place is not None and not state.adstacks else None
        if hidden_paths is not None:
            offline_cache.store(place, (binary, hidden_paths), (binary, hidden_paths, functions))
        return AmdgpuPlan(kernel, binary, state.hidden, functions, state.adstacks)


def _load_modules(payload) -> tuple:
    """(PlanBinary, hidden-field paths, (module, function) per task) of a cache entry: its code
    objects loaded (one HIP refuses is a bad entry)."""
    from ..cuda.plan import PlanBinary

    binary, hidden_paths = payload
    if not isinstance(binary, PlanBinary):
        raise TypeError(f"not an AMDGPU plan: {type(binary).__name__}")
    rt = HipRuntime.get()
    return binary, hidden_paths, [rt.load_function(t.cubin, t.entry_name) for t in binary.tasks]
