"""The launch plan of one kernel instance: compile its tasks, then replay them on every call.

:func:`build_plan` runs the untyped pipeline on numba-cuda's IR classes (:func:`compile_state`),
splits the result into task kernels (tasks.py) and compiles each to a cubin (compile.py,
:func:`compile_tasks`), keeping what the launch needs as a :class:`PlanBinary` (the offline
cache stores it; a hit starts here, with no frontend and no compile). :func:`launch_plan` loads
the cubins and pre-packs one ``void*[]`` parameter array per task whose ctypes cells are shared
by all tasks of the kernel. The :class:`LaunchPlan` it returns runs
generated straight-line Python (:func:`_runner_source`): patch the cells of arguments that
changed, recompute host iteration counts (:func:`host_totals`) and grids (:func:`_grid`), call the
native launcher once, copy numpy arguments back (:func:`_copy_back`), read the return value.
:func:`compile_check` is the same compile without a GPU (``cuda_compile_check``).

This module never checks or converts a call's arguments (kernel.py, arrays.py) and never talks to
the driver but through runtime.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re

import numpy as np
from numba.core import types

from ... import adstack, config, offline_cache, profiler
from ...field import Ndarray, next_generation, written_by
from ...frontend.args import template_argument
from ...frontend.keys import artifact_key
from ...generated_code import exec_generated
from ...lowering import device
from ...lowering.raising import raise_recorded
from ...passes.task_ir import LABEL_SHIFT as TASK_LABEL_SHIFT
from ...passes.task_ir import TaskIR, cut_task
from ...passes.task_types import TaskTyper, TypedPiece
from ..untyped import gc_paused
from . import graphs, toolchain
from . import tasks as cuda_tasks
from .arrays import _view_type
from .runtime import (
    PACK_HEAD,
    PACK_TASK,
    CudaRuntime,
    _check,
    _driver,
    bind_launch_all,
    launchers,
)
from .stream_pool import stream_blocks

CODEGEN_STAGES = ("split into task kernels, in program order: range-for -> grid-stride kernel, serial code -> "
                  "1-thread kernel (passes/task_ir.py with targets/cuda/tasks.py CudaTaskABI)",
                  "per task: numba-cuda typing (the task's only one) + lowering, then NVVM, nvJitLink -> cubin "
                  "on a pool (targets/cuda/compile.py); the Tasks get their types from the typed task kernels "
                  "(passes/task_types.py)",
                  "launch plan: cubins loaded, parameters pre-packed, host iteration counts (targets/cuda/plan.py)")


# -- cells: one ctypes value per kernel parameter slot -------------------------------------------------

_CTYPES = {"b": ctypes.c_int8, "B": ctypes.c_uint8, "h": ctypes.c_int16, "H": ctypes.c_uint16,
           "i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64, "Q": ctypes.c_uint64,
           "f": ctypes.c_float, "d": ctypes.c_double, "e": ctypes.c_uint16}


class TaskLaunch:
    """One task of a plan: its function, launch shape and parameter array."""

    __slots__ = ("task", "fn", "module", "argv_array", "argv", "grid", "block", "total_index", "binary")

    def __init__(self, task, fn, module, argv_array, grid, block, total_index, binary):
        self.task, self.fn, self.module = task, fn, module
        self.argv_array = argv_array                    # keeps the void*[] alive
        self.argv = ctypes.addressof(argv_array)
        self.grid = grid                                # the saturating grid (1 for serial tasks)
        self.block, self.total_index = block, total_index
        self.binary = binary                            # its TaskBinary


class LaunchPlan:
    """Everything one kernel instance needs to launch: built once, replayed on every call.

    :attr:`run` is Python generated for this plan (see :func:`_runner_source`): straight-line
    code that patches the cells of arguments that changed, updates grids whose iteration
    counts depend on arguments, calls the native launcher once and copies numpy arguments
    back. It takes the kernel's arguments followed by the views of its ndarray arguments.
    """

    def __init__(self, kernel, artifact_key, launches, cells, params, totals_fn, static_totals, context_buffer, tmp,
                 ret, fields=(), written=(), written_args=()):
        self.kernel, self.launches = kernel, launches
        self.cells = cells                  # runtime param name -> list of ctypes cells
        self.params = params                # (name, kind) per kernel parameter, call order
        self.totals_fn = totals_fn
        self.static_totals = static_totals
        self.context_buffer = context_buffer    # the device table the context parameter points to, and the temporaries
        self.tmp = tmp                          # the temporaries' device address
        self.ret = ret                      # (byte offset, numpy dtype, element count) or None
        self.tasks = [launch.task for launch in launches]
        self.rt = CudaRuntime.get()
        self.artifact_key = artifact_key    # content key of the compiled code (frontend/keys.py)
        # the arguments the host iteration counts read (parsed from the generated source)
        self.totals_args = sorted(set(getattr(totals_fn, "qd_args", ())))
        self.packed = self._pack(self.rt)
        # launch_all() -> status: the Python loop until the native one exists (runtime.bind_launch_all)
        self._launch_all_users = []         # namespaces of generated callers holding launch_all
        self.launch_all = bind_launch_all(self.packed.ctypes.data, self._use_native_launch_all)
        # qd.init(kernel_profiler=True): this plan launches through CUDA events (profiler.py)
        self.timer = profiler.CudaLaunchTimer(kernel.qualname, [t.name for t in self.tasks], launchers().launch_timed,
                                              self.packed[PACK_HEAD + 1::PACK_TASK]) \
            if config.current.kernel_profiler else None
        # debug=True: (launch, device address of its int32 error word) per task that records exceptions
        self.error_words = [(launch, self.rt.global_address(launch.module, launch.binary.error_symbol))
                            for launch in launches if launch.binary.error_symbol]
        words = {id(launch): address for launch, address in self.error_words}
        # debug plans compile every task with an error word
        self.error_word_of = [words[id(launch)] for launch in launches] if words else []
        self.fields = list(fields)      # in context-slot order (qd.ad.Tape validation reads them)
        self.written, self.written_args = written, written_args   # fields, ndarray parameter positions a launch writes
        self.stream_blocks = stream_blocks(self)    # qd.stream_parallel() groups: fork/join (stream_pool.py)
        self._run_on_stream = None
        self._prepare = None
        # @qd.kernel(graph=True): replayed as a CUDA graph (graphs.py), unless graphs are off
        # (QD_GRAPH=0) or each task must be launched and checked alone (debug) or timed (profiler)
        # Without graph=True, a plan of two or more tasks replays a graph too (qd.init(auto_graph=...)),
        # on the calls whose arguments did not change since the last call (see _runner_source)
        plain = not self.error_words and self.timer is None and kernel.autodiff_mode is None
        self.auto_graph = not kernel.graph and config.current.auto_graph and len(launches) >= 2 and plain
        self.graph = graphs.CudaGraph(self) if (kernel.graph or self.auto_graph) and config.current.cuda_graph \
            and launches and plain else None
        self.cells_owner = None    # the runner whose state describes the cells (plain or on a stream)
        self.run = self._make_runner()

    def _use_native_launch_all(self, native) -> None:
        """Switch to the native ``launch_all`` (called once, on the thread that built it)."""
        python, self.launch_all = self.launch_all, native
        for ns in self._launch_all_users:
            if ns.get("launch_all") is python:
                ns["launch_all"] = native

    def _pack(self, rt):
        """The native launcher's array; grids of loops with host-known counts are final."""
        packed = np.zeros(PACK_HEAD + PACK_TASK * len(self.launches), np.int64)
        packed[0] = len(self.launches)
        packed[1] = 0  # the legacy default stream
        for k, launch in enumerate(self.launches):
            grid = launch.grid
            if launch.total_index is not None and self.static_totals is not None:
                total = self.static_totals[launch.total_index]
                if total is not None:
                    grid = _grid(total, launch.block, launch.grid)
            packed[PACK_HEAD + PACK_TASK * k:PACK_HEAD + PACK_TASK * (k + 1)] = (
                int(launch.fn), grid, launch.block, launch.argv)
        return packed

    # -- pieces the generated runner calls ------------------------------------------------------
    def _patch_view(self, name, view, last_key):
        """Write an ndarray argument's cells (meminfo, parent, nitems, itemsize, data, shape,
        strides); returns the new key, skipping the writes when it equals ``last_key``."""
        key = (view.ptr, view.shape, view.strides)
        if key != last_key:
            values = (0, 0, view.size, view.dtype.itemsize, view.ptr, *view.shape, *view.strides)
            for cell, value in zip(self.cells[name], values):
                cell.value = value
        return key

    def _update_grids(self, args):
        totals = self.totals_fn(args)
        packed = self.packed
        for k, launch in enumerate(self.launches):
            if launch.total_index is not None:
                total = totals[launch.total_index]
                if total is not None:
                    packed[PACK_HEAD + PACK_TASK * k + 1] = _grid(total, launch.block, launch.grid)

    def _check_errors(self, args):
        """After a debug launch: the first exception a task recorded, raised (raise_recorded)."""
        raise_recorded(self.kernel, self.rt, self.error_words, lambda launch: launch.task)

    def _failed(self, status):
        task = self.launches[status >> 32].task
        _check((_driver().CUresult(status & 0xFFFFFFFF),), f"launching {task.name}")

    def _result(self):
        off, dt, count = self.ret
        raw = self.rt.read_bytes(self.tmp + off, dt.itemsize * count)
        return read_return(raw, dt, self.kernel.return_type)

    def _make_runner(self, on_stream=False, prepare=False):
        src, ns = _runner_source(self, on_stream, prepare)
        what = " on a stream" if on_stream else " (prepare)" if prepare else ""
        exec_generated(src, f"launch {self.kernel.qualname}{what}", ns)
        return ns["make"]()

    def prepare(self):
        """``prepare(*args, *views) -> dirty``: :attr:`run` up to the launch, which it leaves to
        the caller: the cells written, the grids updated, the bits of the graph nodes whose cells
        changed returned (graph plans only; a device-side ``qd.graph.do_while`` launches the
        nodes inside its own graph, targets/cuda/do_while.py)."""
        if self._prepare is None:
            self._prepare = self._make_runner(prepare=True)
        return self._prepare

    def on_stream(self):
        """``run(stream, nonblocking, *args, *views)``: :attr:`run` with the launches on the
        stream ``stream`` (generated on first use, so :attr:`run` is untouched), fenced with the
        legacy default stream when the stream is non-blocking."""
        if self._run_on_stream is None:
            self._run_on_stream = self._make_runner(on_stream=True)
        return self._run_on_stream


def return_slot(ty) -> tuple[np.dtype, int]:
    """(numpy dtype, element count) of a kernel's return value of Numba type ``ty`` in its
    temporary slot: a scalar, or a vector's/matrix's elements, row-major."""
    from numba.np.numpy_support import as_dtype

    from ...typing.matrix import MatrixType

    if isinstance(ty, MatrixType):
        return as_dtype(ty.dtype), ty.count
    return as_dtype(ty), 1


def read_return(raw: np.ndarray, dt: np.dtype, return_type):
    """The value a kernel returns from the bytes of its return slot (elements of dtype ``dt``):
    a Python scalar, or a qd.Vector/qd.Matrix of the annotated type, as on the CPU."""
    from ...typing.matrix import MatrixType

    values = raw.view(dt)
    if isinstance(return_type, MatrixType):
        return return_type.from_elements(tuple(values[:return_type.count].tolist()))
    result = values[0].item()
    if isinstance(return_type, types.Integer):
        return int(result)
    if isinstance(return_type, types.Float):
        return float(result)
    if isinstance(return_type, types.Boolean):
        return bool(result)
    return result


def _copy_back(view):
    """Write a numpy argument's device copy back into it (a strided view through a temporary)."""
    if view.readonly:
        return
    if view.host.flags.c_contiguous:
        view.keep.copy_to_host(view.host)
    else:
        view.host[...] = view.keep.copy_to_host()


_UNSET = object()


def _tuple_src(items) -> str:
    """Source of a tuple display of these expressions."""
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"


def _runner_source(plan, on_stream=False, prepare=False):
    """Source of ``make() -> run(*args, *ndarray views)`` for one plan, and its namespace;
    ``on_stream``: ``run(stream, nonblocking, *args, *views)`` launching on ``stream`` (word 1 of
    the packed array, put back to 0 after), behind a fence from and before a fence to the legacy
    default stream when ``nonblocking`` (the copies and the return value's read run there);
    ``prepare`` (graph plans): everything before the launch, returning the dirty node bits.

    Per argument only what its kind needs: a scalar writes its cell; an ndarray re-patches
    its cells when its view is not the one of the last call (qd.ndarray views are cached, so
    identity is enough) and is copied back when it is a numpy array. Iteration counts are
    recomputed when an argument they read changed: a different qd.ndarray object (their
    shapes never change) or scalar, or any other array kind (no cheap key)."""
    params = plan.params
    args = [f"a{i}" for i in range(len(params))]
    views = {i: f"v{i}" for i, (_, kind) in enumerate(params) if kind == "ndarray"}
    # launch_all() launches every task: in order, or forked/joined over qd.stream_parallel() blocks
    launch_all = plan.launch_all if plan.stream_blocks is None else plan.stream_blocks.launch
    ns = {"plan": plan, "rt": plan.rt, "launch_all": launch_all,
          "Ndarray": Ndarray, "copy_back": _copy_back, "UNSET": _UNSET, "me": object()}
    if plan.stream_blocks is None:
        plan._launch_all_users.append(ns)    # the generated code's globals: switched to the native loop
    state, body = [], []
    graph = plan.graph if not on_stream else None    # graph kernels refuse qd_stream=
    auto = graph is not None and plan.auto_graph and not prepare
    if graph is not None:   # dirty: a bit per graph node that reads a cell this call changes
        ns["graph"] = graph
        body.append("dirty = 0")
    if auto:                # nodes to patch at the next replay (changed on calls launched plainly)
        state.append("pending = 0")

    def dirties(i, name):
        """The line marking the nodes that read parameter ``name`` (graph plans only)."""
        if graph is None:
            return []
        ns[f"m{i}"] = graph.node_mask(lambda k: name in plan.launches[k].binary.runtime_args)
        return [f"dirty |= m{i}"]

    for i, (name, kind) in enumerate(params):
        if kind == "template" or name not in plan.cells:
            continue
        if kind == "scalar":
            (cell,) = plan.cells[name]
            ns[f"c{i}"] = cell
            if graph is None:
                body.append(f"c{i}.value = a{i}")
            else:   # a node is patched only when the value changed
                state.append(f"s{i} = UNSET")
                body += [f"if a{i} != s{i}:", f"    s{i} = c{i}.value = a{i}", *(f"    {d}" for d in dirties(i, name))]
        elif kind == "matrix":  # a qd.Vector/Matrix (see CudaKernel): one cell per element
            ns[f"c{i}"] = tuple(plan.cells[name])
            body += [f"for cell, x in zip(c{i}, a{i}.entries.reshape(-1).tolist()):",
                     "    cell.value = x", *dirties(i, name)]
        elif kind == "struct":  # a qd.Struct: one cell per leaf element, in the data model's order
            ns[f"c{i}"] = tuple(plan.cells[name])
            body += [f"for cell, x in zip(c{i}, a{i}._flat_tuple()):",
                     "    cell.value = x", *dirties(i, name)]
        else:
            ns[f"n{i}"] = name
            state += [f"last{i} = None", f"key{i} = None"]
            body += [f"if v{i} is not last{i}:",
                     f"    last{i} = v{i}",
                     f"    key{i} = plan._patch_view(n{i}, v{i}, key{i})", *(f"    {d}" for d in dirties(i, name))]
    if plan.totals_fn is not None:
        changed = []
        for i in plan.totals_args:
            state.append(f"t{i} = UNSET")
            kind = params[i][1]
            changed.append(f"type(a{i}) is not Ndarray or a{i} is not t{i}" if kind == "ndarray"
                           else "True" if kind in ("matrix", "struct")  # a qd.Vector may have changed in place
                           else f"a{i} != t{i}")
        tracked = [f"t{i}" for i in plan.totals_args]
        body += [f"if {' or '.join(changed)}:" if changed else "if True:",
                 *(f"    {t} = a{i}" for t, i in zip(tracked, plan.totals_args)),
                 # ndarrays as their views: every array kind (DLPack producers too) has .shape there
                 f"    plan._update_grids({_tuple_src([views.get(i, a) for i, a in enumerate(args)])})"]
        if graph is not None:   # the nodes of loops with host iteration counts get their new grids
            ns["mt"] = graph.node_mask(lambda k: plan.launches[k].total_index is not None)
            body.append("    dirty |= mt")
    ns["timer"] = plan.timer
    if plan.written:
        ns["written"], ns["next_generation"] = plan.written, next_generation
        body += ["for f in written:", "    f._gen = next_generation()"]
    for i in plan.written_args:
        ns["next_generation"] = next_generation
        body.append(f"if type(a{i}) is Ndarray: a{i}._gen = next_generation()")
    launch = []
    if plan.error_words:   # debug: one task at a time, stopping at the first that records an error
        ns["launch_task"], ns["error_word_of"] = launchers().launch_task, plan.error_word_of
        ns["packed"] = plan.packed.ctypes.data   # by address (the array lives as long as the plan)
        launch += [f"for k in range({len(plan.launches)}):",
                   "    status = launch_task(packed, k)",
                   "    if status >= 0:",
                   "        plan._failed(status)",
                   *(["    if nonblocking: rt.fence(stream, 0)"] if on_stream else []),
                   "    if rt.read_i32(error_word_of[k]):",
                   "        break"]
    elif auto:   # replay when nothing changed; a call that changes arguments launches plainly
        launch += ["if dirty:",
                   "    pending |= dirty",
                   "    status = launch_all()",
                   "    if status >= 0:",
                   "        plan._failed(status)",
                   "else:",
                   "    graph.launch(pending)",
                   "    pending = 0"]
    elif graph is not None:
        launch.append("graph.launch(dirty)")
    else:
        if plan.timer is not None:
            ns["packed"] = plan.packed.ctypes.data
        launch += ["status = launch_all()" if plan.timer is None else "status = timer.launch(packed)",
                   "if status >= 0:",
                   "    plan._failed(status)"]
    if prepare:
        launch = ["return dirty"]
    if on_stream:
        ns["words"] = plan.packed
        body += ["if nonblocking: rt.fence(0, stream)", "words[1] = stream", "try:",
                 *(f"    {line}" for line in launch),
                 "finally:", "    words[1] = 0",
                 "if nonblocking: rt.fence(stream, 0)"]
    else:
        body += launch
    # numpy arguments get what the tasks wrote before an error is raised, as on the CPU
    for v in views.values() if not prepare else ():
        body.append(f"if {v}.host is not None: copy_back({v})")
    if plan.error_words and not prepare:
        body.append(f"plan._check_errors({_tuple_src(args)})")
    if not prepare:
        body.append("return plan._result()" if plan.ret is not None else "return None")
    names = [s.split(" = ")[0] for s in state]
    if names:   # the other runner of this plan (plain / on a stream) wrote the cells since: forget what they hold
        reset = [s for s in state if not s.startswith("pending")]
        if auto:   # the graph's nodes keep the values of its last replay: all are patched at the next one
            reset.append(f"pending = {(1 << len(plan.launches)) - 1}")
        body[:0] = ["if plan.cells_owner is not me:", "    plan.cells_owner = me", *(f"    {s}" for s in reset)]
    lines = ["def make():", *(f"    {s}" for s in state),
             f"    def run({', '.join(['stream', 'nonblocking'] if on_stream else [])}"
             f"{', ' if on_stream and args else ''}{', '.join(args + list(views.values()))}):",
             *([f"        nonlocal {', '.join(names)}"] if names else []),
             *(f"        {line}" for line in body),
             "    return run"]
    return "\n".join(lines) + "\n", ns


def _grid(total: int, block: int, max_grid: int) -> int:
    """Blocks for ``total`` iterations: one per ``block`` up to the saturating grid (the kernels
    are grid-stride loops); 0 (no launch) for an empty loop."""
    return min(-(-total // block), max_grid) if total > 0 else 0


def field_token(field):
    from ...frontend.args import field_type

    fty = field_type(field, config.current.debug)
    return device.TypeToken(fty, field._arr.shape,
                            None if fty.layout == "C" else field._arr.strides)


def compile_state(kernel, param_types, templates):
    """Run the untyped pipeline on numba-cuda's IR classes."""
    from ...passes.base import IRTools
    from ..untyped import untyped_compile

    return untyped_compile(kernel, IRTools.for_cuda(), param_types, templates, CODEGEN_STAGES)


def compile_tasks(kernel, state, cc, field_slot, codegen=None, meanwhile=None):
    """Compile every task kernel to a cubin. Each task is typed once, by numba-cuda as it lowers
    it, in program order: a value that crosses tasks through a temporary takes the type it has in
    the task that stores it, and the Tasks get their types from the typed task kernels together
    (passes/task_types.py, as the CPU target does), with no whole-kernel type inference. NVVM +
    nvJitLink of each task run on a pool while the next task lowers (compile.py); tasks that load
    no temporary may first lower in forked worker processes (fork_lowering.py). Returns
    (plan_ir, [(unit, task IR, compiled)], Numba type of each value passed through a temporary,
    the return value's as "$qd_return"). ``codegen``: what finishes the lowered tasks instead of
    NVVM + nvJitLink (the AMDGPU target's, targets/amdgpu/codegen.py). ``meanwhile(plan_ir,
    units, temp types)``: work that needs no cubin, run while the last tasks are finishing (a
    1-loop kernel's whole NVVM + nvJitLink comes after its lowering)."""
    from numba.cuda.descriptor import cuda_target

    from .compile import DeviceCodegen, lower_task

    plan_ir = state.task_plan
    debug = config.current.debug
    typer = TaskTyper(state)        # from the kernel IR as planned, before any task is cut
    temp_types: dict = {}
    return_type = None
    abi = cuda_tasks.CudaTaskABI(state, field_slot, field_token, plan_ir.ret_slot, temp_types)

    def lower_unit(unit):
        with profiler.stage("task split"):
            tk = cut_task(state, unit, abi)
        if config.current.print_ir:
            import sys

            print(f"=== qd_numba CUDA task {unit.task.name} ===", file=sys.stderr)
            tk.func_ir.dump()
        argtypes = [types.uint64, types.uint64] + [state.param_types[n] for n in tk.params]
        task = lower_task(tk.func_ir, argtypes, cc=cc, debug=False, lineinfo=debug, exceptions=debug)
        # the task kernel's entry block (label 0: its parameters, loads and recomputed values)
        # counts as the unit's first block
        labels = {0: min(unit.labels), **{label + TASK_LABEL_SHIFT: label for label in unit.labels}}
        return tk, task, _stored_types(task, state.ir), TypedPiece(task.blocks, task.typemap, labels)

    lowered, pieces = [], []
    with codegen or DeviceCodegen(config.current.compile_threads) as device_codegen:
        early = {} if codegen is not None else _lower_early(plan_ir.units, lower_unit, typer, device_codegen)
        for k, unit in enumerate(plan_ir.units):
            if k in early:      # lowered by a worker, already finishing on the pool
                tk, task, stored, piece, started = early.pop(k)
                device_codegen.submit(task, started)
            else:
                tk, task, stored, piece = lower_unit(unit)
                device_codegen.submit(task)
            temp_types.update((name, stored[f"$qd_temp_store_{slot}"]) for name, slot in unit.stores.items())
            return_type = stored.get("$qd_temp_store_ret", return_type)
            pieces.append(piece)
            lowered.append((unit, tk))
        typer.assign(pieces, return_type, cuda_target.typing_context)
        temp_types = dict(temp_types)
        if plan_ir.ret_slot is not None:
            temp_types["$qd_return"] = plan_ir.return_type
        if meanwhile is not None:
            meanwhile(plan_ir, [unit for unit, _tk in lowered], temp_types)
        compiled = device_codegen.results()
    return plan_ir, [(unit, tk, c) for (unit, tk), c in zip(lowered, compiled)], temp_types


def _lower_early(units, lower_unit, typer, device_codegen) -> dict:
    """``unit index -> (task IR stand-in, lowered task, stored types, label types, started)`` of
    the units that load no temporary, lowered on worker processes (fork_lowering.py) and
    started on the device-codegen pool as they arrive; {} where workers are not used. A unit no
    worker delivered is left out: :func:`compile_tasks` lowers it in program order."""
    from . import fork_lowering
    from .compile import rebuild_lowered, ship_lowered

    jobs = [k for k, unit in enumerate(units) if not unit.loads]
    processes = fork_lowering.processes_for(len(jobs))
    if processes <= 1:
        return {}

    def ship(result):
        tk, task, stored, piece = result
        return tk.params, ship_lowered(task), stored, typer.label_types(piece)

    early = {}

    def on_result(j, shipped):
        params, task_data, stored, label_types = shipped
        task = rebuild_lowered(task_data)
        early[jobs[j]] = (TaskIR(units[jobs[j]], None, list(params)), task, stored, label_types,
                          device_codegen.start(task))

    costs = [_unit_size(typer.state, units[k]) for k in jobs]
    with profiler.stage("typing + lowering"):
        fork_lowering.lower_in_processes([units[k] for k in jobs], costs, processes, lower_unit, ship, on_result)
    return early


def _unit_size(state, unit) -> int:
    """Statements of a unit's blocks: the cost by which units are shared out to processes."""
    blocks = state.func_ir.blocks
    return sum(len(blocks[label].body) for label in unit.labels if label in blocks) + len(unit.recompute)


def _stored_types(task, ir) -> dict:
    """``"$qd_temp_store_<slot>"`` / ``"$qd_temp_store_ret"`` -> the Numba type of the value a typed
    task kernel stores there (tasks.py ``CudaTaskABI``), literals widened."""
    out = {}
    for block in task.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign) and stmt.target.name.startswith("$qd_temp_store_"):
                out[stmt.target.name] = types.unliteral(task.typemap[stmt.value.args[2].name])
    return out


def kernel_field_slots(state):
    """``field -> context slot`` of one kernel instance: the field's position among the fields
    the kernel uses (``state.hidden``, in order of first reference), so compiled code depends on
    the kernel alone, never on how many fields the process created before (relocatable)."""
    slots = {id(f): k for k, f in enumerate(state.hidden)}
    return lambda field: slots[id(field)]


def compile_check(kernel, param_types, templates, cc=(9, 0), codegen=None):
    """Compile every task of this kernel instance for CUDA down to cubins, without a GPU.

    Fields get placeholder context slots (no device memory is touched). Returns the compiled
    tasks; raises what a real CUDA compile would raise. ``codegen``: as :func:`compile_tasks`'
    (the AMDGPU compile check finishes the same lowered tasks both ways)."""
    with gc_paused(), profiler.compiling(kernel.qualname, "cuda (compile check)"):
        state = compile_state(kernel, param_types, templates)
        plan_ir, compiled, binary, _ = _compile(kernel, state, cc, codegen)
        host_totals(kernel, binary.totals, state.hidden)  # the launcher's host code too
    return compiled


def _compile(kernel, state, cc, codegen=None, rt=None) -> tuple:
    """(plan IR, compiled tasks, :class:`PlanBinary`, context buffers) of a kernel instance's
    untyped state. What needs no cubin is done while the last tasks finish: the binary's other
    parts and, given the runtime ``rt``, the toolchain's versions asked (:func:`toolchain.confirm`:
    the compile loads the libraries anyway, and the keys then name the toolchain that made the
    code) and the context buffers (:meth:`CudaRuntime.context_buffers`; else None)."""
    done = {}

    def meanwhile(plan_ir, units, temp_types):
        if rt is not None:
            toolchain.confirm()
            done["buffers"] = rt.context_buffers(state.hidden, max(1, plan_ir.temp_slots) * device.TEMP_SLOT_BYTES)
        done["target"] = cache_target(cc)
        done["parts"] = plan_parts(kernel, state, plan_ir, units, temp_types, done["target"])

    plan_ir, compiled, temp_types = compile_tasks(kernel, state, cc, kernel_field_slots(state), codegen, meanwhile)
    binary = plan_binary(kernel, state, plan_ir, compiled, temp_types, done["target"], done["parts"])
    return plan_ir, compiled, binary, done.get("buffers")


def host_totals(kernel, totals, fields):
    """(totals function taking the kernel's arguments or None, iteration counts known now or None)
    from a plan's ``(source, env)`` (:attr:`PlanBinary.totals`), its fields bound."""
    if totals is None:
        return None, None
    src, env = totals
    ns = {name: fields[v.index] if isinstance(v, FieldSlot) else v for name, v in env.items()}
    exec_generated(src, f"totals {kernel.qualname}", ns)
    fn = ns["totals"]
    if "args[" in src:
        fn.qd_args = tuple(int(k) for k in re.findall(r"args\[(\d+)\]", src))
        return fn, None
    return None, fn(())


def plan_types(kernel, args, views):
    """(runtime parameter name -> Numba type, template name -> value) of a call's arguments."""
    param_types, templates = {}, {}
    for p, a in zip(kernel.params, args):
        where = f"kernel '{kernel.name}', argument '{p.name}'"
        if p.kind == "template":
            templates[p.name] = template_argument(where, p, a)
        elif p.kind in ("scalar", "matrix", "struct"):
            param_types[p.name] = p.nbtype
        else:
            param_types[p.name] = _view_type(where, p.annotation, views[p.name])
    return param_types, templates


# -- the plan binary: what compiling leaves, what the offline cache stores ---------------------------------

@dataclasses.dataclass(frozen=True)
class FieldSlot:
    """A field in a stored value, by its position among the kernel instance's fields."""

    index: int


@dataclasses.dataclass(frozen=True)
class TaskBinary:
    """One compiled task, as its launch needs it: no Numba object, no device state."""

    task: object            # the Task (passes/tasks.py)
    kind: str               # the unit's kind: "range_for" (a grid-stride kernel) or a serial one
    cubin: bytes
    entry_name: str
    runtime_args: tuple     # runtime parameter names after (ctx, tmp)
    slots: tuple            # (argument name, struct format) per parameter slot, in order
    error_symbol: str | None
    exceptions: dict        # debug tasks: error code -> (exception class, args, location)


@dataclasses.dataclass(frozen=True)
class PlanBinary:
    """The output of compiling one kernel instance: its tasks' cubins, the temporaries, the
    return slot, the host iteration counts and the code's content key. :func:`build_plan` makes
    it and :func:`launch_plan` turns it into a :class:`LaunchPlan`; the offline cache pickles it
    (the fields it reaches are :class:`FieldSlot` references, bound in each process)."""

    tasks: tuple            # TaskBinary per task, in program order
    temp_slots: int
    ret: tuple | None       # (byte offset, numpy dtype, element count) of the return value
    totals: tuple | None    # (source, env) of the host iteration counts (:func:`host_totals`)
    artifact_key: str | None
    # the counts themselves where they depend on no argument (constants and field shapes, which
    # are in the cache key): computed when the kernel compiles, so a cache hit runs no host code
    static_totals: tuple | None = None


def cache_target(cc) -> str:
    """The target part of a CUDA kernel's keys: the compute capability, the versions of the
    NVVM and nvJitLink libraries that make its cubins (:mod:`.toolchain`) and numba-cuda's."""
    import numba_cuda

    return f"cuda-sm{''.join(map(str, cc))}-{toolchain.versions()}-numba-cuda{numba_cuda.__version__}"


@dataclasses.dataclass(frozen=True)
class PlanParts:
    """What a :class:`PlanBinary` holds besides its tasks' code: made before the cubins exist."""

    ret: tuple | None
    totals: tuple | None
    artifact_key: str
    static_totals: tuple | None


def plan_parts(kernel, state, plan_ir, units, temp_types, target) -> PlanParts:
    """The :class:`PlanParts` of a kernel instance whose tasks are ``units`` (in program order)."""
    ret = None
    if plan_ir.ret_slot is not None:
        ret = (plan_ir.ret_slot * device.TEMP_SLOT_BYTES, *return_slot(temp_types["$qd_return"]))
    param_ndims = {name: getattr(ty, "ndim", None) for name, ty in state.param_types.items()}
    runtime_positions = [i for i, p in enumerate(kernel.params) if p.kind != "template"]
    src, env = cuda_tasks.totals_source(state, units, param_ndims, runtime_positions)
    slots = {id(f): k for k, f in enumerate(state.hidden)}
    totals = None if src is None else (src, {name: FieldSlot(slots[id(v)]) if id(v) in slots else v
                                             for name, v in env.items()})
    key = artifact_key(kernel, state.param_types, state.template_values, state.hidden, state.config, target)
    if totals is not None and "args[" not in src:
        return PlanParts(ret, None, key, host_totals(kernel, totals, state.hidden)[1])
    return PlanParts(ret, totals, key, None)


def plan_binary(kernel, state, plan_ir, compiled, temp_types, target, parts: PlanParts | None = None) -> PlanBinary:
    """The :class:`PlanBinary` of :func:`compile_tasks`' output (``parts``: its
    :func:`plan_parts`, made here if not given); needs no GPU."""
    if parts is None:
        parts = plan_parts(kernel, state, plan_ir, [u for u, _, _ in compiled], temp_types, target)
    # Tasks are stored without their Numba types (compile-time data that does not pickle)
    binaries = tuple(TaskBinary(dataclasses.replace(unit.task, types=None), unit.kind, c.cubin, c.entry_name,
                                tuple(tk.params), tuple((s.arg_name, s.fmt) for s in c.param_layout),
                                c.error_symbol, _raises(c))
                     for unit, tk, c in compiled)
    return PlanBinary(binaries, plan_ir.temp_slots, parts.ret, parts.totals, parts.artifact_key, parts.static_totals)


def _raises(compiled) -> dict:
    """Error code -> (exception class, args, location) of a task compiled with exceptions: the
    table of the Numba call helper behind ``exception_of``, whose codes the task records."""
    helper = getattr(compiled.exception_of, "__self__", None)
    return dict(helper.exceptions) if helper is not None else {}


def build_plan(kernel, param_types, templates) -> LaunchPlan:
    """The launch plan of a kernel instance: from the offline cache (no frontend, no compile)
    or compiled, and then written to the cache."""
    rt = CudaRuntime.get()
    cfg = config.current.for_kernel(fuse=kernel.fuse, graph=kernel.graph)
    place = offline_cache.lookup(kernel, param_types, templates, cfg, cache_target(rt.cc))
    if place is not None:
        with profiler.stage("offline cache load"):
            loaded = offline_cache.load(place, _load_modules)
        fields = place.hidden_fields(loaded[1]) if loaded is not None else None
        if fields is not None:
            return launch_plan(kernel, loaded[0], fields, loaded[2])
    state = compile_state(kernel, param_types, templates)
    plan_ir, compiled, binary, buffers = _compile(kernel, state, rt.cc, rt=rt)
    rt.plan_builds += 1
    kernel.compile_count += 1
    with profiler.stage("module load"):
        functions = [rt.load_function(t.cubin, t.entry_name) for t in binary.tasks]
    # a gradient kernel with adstacks sizes them from compile-time data: compiled in every process
    hidden_paths = place.hidden_paths(state.hidden) if place is not None and not state.adstacks else None
    if hidden_paths is not None:
        offline_cache.store(place, (binary, hidden_paths), (binary, hidden_paths, functions))
    return launch_plan(kernel, binary, state.hidden, functions, state.adstacks, buffers)


def _load_modules(payload) -> tuple:
    """(PlanBinary, hidden-field paths, (module, function) per task) of a cache entry: its
    cubins loaded (a cubin the driver refuses is a bad entry)."""
    binary, hidden_paths = payload
    if not isinstance(binary, PlanBinary):
        raise TypeError(f"not a CUDA plan: {type(binary).__name__}")
    rt = CudaRuntime.get()
    return binary, hidden_paths, [rt.load_function(t.cubin, t.entry_name) for t in binary.tasks]


def launch_plan(kernel, binary: PlanBinary, fields, functions, adstacks=None, buffers=None) -> LaunchPlan:
    """The :class:`LaunchPlan` of a compiled kernel instance: ``fields`` are its fields (in the
    order of its context slots), ``functions`` the (module, function) of each task's cubin,
    ``adstacks`` the adstacks of a gradient kernel (``CompileState.adstacks``; never cached),
    ``buffers`` its :meth:`CudaRuntime.context_buffers` if made already."""
    rt = CudaRuntime.get()
    if buffers is None:
        buffers = rt.context_buffers(fields, max(1, binary.temp_slots) * device.TEMP_SLOT_BYTES)
    context_buffer, table, tmp = buffers
    cells = {cuda_tasks.PARAM_CTX: [ctypes.c_uint64(table)], cuda_tasks.PARAM_TMP: [ctypes.c_uint64(tmp)]}
    for t in binary.tasks:
        for name in t.runtime_args:
            if name not in cells:  # same Numba type in every task -> same slots
                cells[name] = [_CTYPES[fmt]() for arg, fmt in t.slots if arg == name]
    launches = []
    range_index = 0
    for t, (module, fn) in zip(binary.tasks, functions):
        order = [cuda_tasks.PARAM_CTX, cuda_tasks.PARAM_TMP, *t.runtime_args]
        ptrs = [ctypes.addressof(cell) for name in order for cell in cells[name]]
        argv = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        if t.kind == "range_for" and not t.task.serialize:
            (grid, block), total_index = rt.occupancy(fn), range_index
        else:
            grid, block, total_index = 1, 1, None
        if t.kind == "range_for":
            range_index += 1
        launches.append(TaskLaunch(t.task, fn, module, argv, grid, block, total_index, t))
    totals_fn, static_totals = host_totals(kernel, binary.totals, fields)
    if binary.static_totals is not None:
        static_totals = binary.static_totals
    params = [(p.name, p.kind) for p in kernel.params]
    # a launch gives what it writes new write generations (field.py): known before the runner is made
    runtime_positions = [i for i, p in enumerate(kernel.params) if p.kind != "template"]
    written, written_args = written_by([launch.task for launch in launches], len(runtime_positions), list(fields),
                                       kernel.autodiff_mode == "reverse")
    plan = LaunchPlan(kernel, binary.artifact_key, launches, cells, params, totals_fn, static_totals, context_buffer,
                      tmp, binary.ret, fields, written, tuple(runtime_positions[r] for r in written_args))
    if adstacks:  # a gradient kernel with loops inside a task: size the adstacks per launch
        rows = {launch.task.uid: launch.grid * launch.block for launch in launches}
        plan.run = adstack.wrap_cuda_run(plan.run, adstacks, kernel, list(fields), rows.__getitem__, rt)
    return plan
