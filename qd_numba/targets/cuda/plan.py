"""The launch plan of one kernel instance: compile its tasks, then replay them on every call.

:func:`build_plan` runs the untyped pipeline on numba-cuda's IR classes (:func:`compile_state`),
splits the result into task kernels (tasks.py) and compiles each to a cubin (compile.py,
:func:`compile_tasks`), loads the cubins and pre-packs one ``void*[]`` parameter array per task
whose ctypes cells are shared by all tasks of the kernel. The :class:`LaunchPlan` it returns runs
generated straight-line Python (:func:`_runner_source`): patch the cells of arguments that
changed, recompute host iteration counts (:func:`host_totals`) and grids (:func:`_grid`), call the
native launcher once, copy numpy arguments back (:func:`_copy_back`), read the return value.
:func:`compile_check` is the same compile without a GPU (``cuda_compile_check``).

This module never checks or converts a call's arguments (kernel.py, arrays.py) and never talks to
the driver but through runtime.py.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
from numba.core import types

from ... import adstack, config, profiler
from ...errors import QuadrantsRuntimeError
from ...field import Ndarray
from ...frontend.keys import artifact_key
from ...generated_code import exec_generated
from ...lowering import device
from ...lowering.raising import device_exception
from . import tasks as cuda_tasks
from .arrays import _view_type
from .runtime import (
    PACK_HEAD,
    PACK_TASK,
    CudaRuntime,
    _check,
    _driver,
    native_launcher,
    native_task_launcher,
    native_timed_launcher,
)

CODEGEN_STAGES = ("split into task kernels: range-for -> grid-stride kernel, serial code -> 1-thread kernel "
                  "(targets/cuda/tasks.py)",
                  "per task: numba-cuda typing + lowering, NVVM, nvJitLink -> cubin (targets/cuda/compile.py)",
                  "launch plan: cubins loaded, parameters pre-packed, host iteration counts (targets/cuda/plan.py)")


# -- cells: one ctypes value per kernel parameter slot -------------------------------------------------

_CTYPES = {"b": ctypes.c_int8, "B": ctypes.c_uint8, "h": ctypes.c_int16, "H": ctypes.c_uint16,
           "i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64, "Q": ctypes.c_uint64,
           "f": ctypes.c_float, "d": ctypes.c_double, "e": ctypes.c_uint16}


class TaskLaunch:
    """One task of a plan: its function, launch shape and parameter array."""

    __slots__ = ("task", "fn", "module", "argv_array", "argv", "grid", "block", "total_index", "compiled")

    def __init__(self, task, fn, module, argv_array, grid, block, total_index, compiled):
        self.task, self.fn, self.module = task, fn, module
        self.argv_array = argv_array                    # keeps the void*[] alive
        self.argv = ctypes.addressof(argv_array)
        self.grid = grid                                # the saturating grid (1 for serial tasks)
        self.block, self.total_index, self.compiled = block, total_index, compiled


class LaunchPlan:
    """Everything one kernel instance needs to launch: built once, replayed on every call.

    :attr:`run` is Python generated for this plan (see :func:`_runner_source`): straight-line
    code that patches the cells of arguments that changed, updates grids whose iteration
    counts depend on arguments, calls the native launcher once and copies numpy arguments
    back. It takes the kernel's arguments followed by the views of its ndarray arguments.
    """

    def __init__(self, kernel, state, launches, cells, params, totals_fn, static_totals, tmp_dev, field_table,
                 ret):
        self.kernel, self.state, self.launches = kernel, state, launches
        self.cells = cells                  # runtime param name -> list of ctypes cells
        self.params = params                # (name, kind) per kernel parameter, call order
        self.totals_fn = totals_fn
        self.static_totals = static_totals
        self.tmp_dev = tmp_dev
        self.field_table = field_table      # the device table the context parameter points to
        self.ret = ret                      # (byte offset, numpy dtype, element count) or None
        self.tasks = [launch.task for launch in launches]
        self.rt = CudaRuntime.get()
        self.artifact_key = artifact_key(kernel, state.param_types, state.template_values, state.hidden,
                                         state.config, f"cuda-sm{''.join(map(str, self.rt.cc))}")
        # the arguments the host iteration counts read (parsed from the generated source)
        self.totals_args = sorted(set(getattr(totals_fn, "qd_args", ())))
        self.packed = self._pack(self.rt)
        self.launch_all = native_launcher()
        # qd.init(kernel_profiler=True): this plan launches through CUDA events (profiler.py)
        self.timer = profiler.CudaLaunchTimer(kernel.qualname, [t.name for t in self.tasks], native_timed_launcher(),
                                              self.packed[PACK_HEAD + 1::PACK_TASK]) \
            if config.current.kernel_profiler else None
        # debug=True: (launch, device address of its int32 error word) per task that records exceptions
        self.error_words = [(launch, self.rt.global_address(launch.module, launch.compiled.error_symbol))
                            for launch in launches if launch.compiled.error_symbol]
        words = {id(launch): address for launch, address in self.error_words}
        # debug plans compile every task with an error word
        self.error_word_of = [words[id(launch)] for launch in launches] if words else []
        self.run = self._make_runner()

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
        """After a debug launch: raise the first exception a thread of some task recorded (the
        copy waits for the kernels), naming the kernel and the task. Every word is cleared: the
        tasks after a failing one still ran (their own checks keep them in bounds), and what they
        recorded must not surface at the next call."""
        recorded = []
        for launch, address in self.error_words:
            code = self.rt.read_i32(address)
            if code:
                self.rt.write_i32(address, 0)
                recorded.append((launch, code))
        if recorded:
            launch, code = recorded[0]
            cls, exc_args, loc = device_exception(code) or launch.compiled.exception_of(code)
            # numba-cuda's own raises carry their line; qd_numba's bounds checks name the task,
            # whose location is its loop (or serial region)
            line = f"{loc[1]}:{loc[2]}" if loc else launch.task.loc
            where = f" (task {launch.task.name}" + (f", {line}" if line else "") + ")"
            exc = cls(*exc_args) if exc_args else cls()
            err = self.kernel.runtime_error(exc)
            raise type(err)(f"{err}{where}") from None

    def _failed(self, status):
        task = self.launches[status >> 32].task
        _check((_driver().CUresult(status & 0xFFFFFFFF),), f"launching {task.name}")

    def _result(self):
        off, dt, count = self.ret
        raw = self.tmp_dev[off:off + dt.itemsize * count].copy_to_host()
        return read_return(raw, dt, self.kernel.return_type)

    def _make_runner(self):
        src, ns = _runner_source(self)
        exec_generated(src, f"launch {self.kernel.qualname}", ns)
        return ns["make"]()


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
    from ...matrix import from_flat_tuple
    from ...typing.matrix import MatrixType

    values = raw.view(dt)
    if isinstance(return_type, MatrixType):
        return from_flat_tuple(tuple(values[:return_type.count].tolist()), return_type)
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


def _runner_source(plan):
    """Source of ``make() -> run(*args, *ndarray views)`` for one plan, and its namespace.

    Per argument only what its kind needs: a scalar writes its cell; an ndarray re-patches
    its cells when its view is not the one of the last call (qd.ndarray views are cached, so
    identity is enough) and is copied back when it is a numpy array. Iteration counts are
    recomputed when an argument they read changed: a different qd.ndarray object (their
    shapes never change) or scalar, or any other array kind (no cheap key)."""
    params = plan.params
    args = [f"a{i}" for i in range(len(params))]
    views = {i: f"v{i}" for i, (_, kind) in enumerate(params) if kind == "ndarray"}
    ns = {"plan": plan, "rt": plan.rt, "launch_all": plan.launch_all, "packed": plan.packed,
          "Ndarray": Ndarray, "copy_back": _copy_back, "UNSET": _UNSET}
    state, body = [], []
    for i, (name, kind) in enumerate(params):
        if kind == "template" or name not in plan.cells:
            continue
        if kind == "scalar":
            (cell,) = plan.cells[name]
            ns[f"c{i}"] = cell
            body.append(f"c{i}.value = a{i}")
        elif kind == "matrix":  # a qd.Vector/Matrix (see CudaKernel): one cell per element
            ns[f"c{i}"] = tuple(plan.cells[name])
            body += [f"for cell, x in zip(c{i}, a{i}.entries.reshape(-1).tolist()):",
                     "    cell.value = x"]
        else:
            ns[f"n{i}"] = name
            state += [f"last{i} = None", f"key{i} = None"]
            body += [f"if v{i} is not last{i}:",
                     f"    last{i} = v{i}",
                     f"    key{i} = plan._patch_view(n{i}, v{i}, key{i})"]
    if plan.totals_fn is not None:
        changed = []
        for i in plan.totals_args:
            state.append(f"t{i} = UNSET")
            kind = params[i][1]
            changed.append(f"type(a{i}) is not Ndarray or a{i} is not t{i}" if kind == "ndarray"
                           else "True" if kind == "matrix"  # a qd.Vector may have changed in place
                           else f"a{i} != t{i}")
        tracked = [f"t{i}" for i in plan.totals_args]
        body += [f"if {' or '.join(changed)}:" if changed else "if True:",
                 *(f"    {t} = a{i}" for t, i in zip(tracked, plan.totals_args)),
                 # ndarrays as their views: every array kind (DLPack producers too) has .shape there
                 f"    plan._update_grids({_tuple_src([views.get(i, a) for i, a in enumerate(args)])})"]
    ns["timer"] = plan.timer
    if plan.error_words:   # debug: one task at a time, stopping at the first that records an error
        ns["launch_task"], ns["error_word_of"] = native_task_launcher(), plan.error_word_of
        body += [f"for k in range({len(plan.launches)}):",
                 "    status = launch_task(packed, k)",
                 "    if status >= 0:",
                 "        plan._failed(status)",
                 "    if rt.read_i32(error_word_of[k]):",
                 "        break"]
    else:
        body += ["status = launch_all(packed)" if plan.timer is None else "status = timer.launch(packed)",
                 "if status >= 0:",
                 "    plan._failed(status)"]
    # numpy arguments get what the tasks wrote before an error is raised, as on the CPU
    for v in views.values():
        body.append(f"if {v}.host is not None: copy_back({v})")
    if plan.error_words:
        body.append(f"plan._check_errors({_tuple_src(args)})")
    body.append("return plan._result()" if plan.ret is not None else "return None")
    names = [s.split(" = ")[0] for s in state]
    lines = ["def make():", *(f"    {s}" for s in state),
             f"    def run({', '.join(args + list(views.values()))}):",
             *([f"        nonlocal {', '.join(names)}"] if names else []),
             *(f"        {line}" for line in body),
             "    return run"]
    return "\n".join(lines) + "\n", ns


def _grid(total: int, block: int, max_grid: int) -> int:
    """Blocks for ``total`` iterations: one per ``block`` up to the saturating grid (the kernels
    are grid-stride loops); 0 (no launch) for an empty loop."""
    return min(-(-total // block), max_grid) if total > 0 else 0


def field_token(field):
    from ...field import Ndarray
    from ...typing.field import FieldType

    fty = FieldType(field.dtype, len(field.shape), field.elem_type, "C", checked=config.current.debug,
                    kind="field" if not isinstance(field, Ndarray) else "ndarray")
    return device.TypeToken(fty, tuple(field.shape) + tuple(field.element_shape))


def compile_state(kernel, param_types, templates):
    """Run the untyped pipeline on numba-cuda's IR classes."""
    from ...passes.base import IRTools
    from ..untyped import untyped_compile

    return untyped_compile(kernel, IRTools.for_cuda(), param_types, templates, CODEGEN_STAGES)


def compile_tasks(kernel, state, cc, field_slot):
    """Compile every task kernel to a cubin, in program order. Returns (plan_ir, [(unit, compiled)])."""
    from .compile import compile_task_to_cubin

    plan_ir = state.task_plan
    temp_types, out = {}, []
    debug = config.current.debug
    for unit in plan_ir.units:
        with profiler.stage("task split"):
            tk = cuda_tasks.build_task_ir(state, unit, temp_types, field_slot, field_token, plan_ir.ret_slot)
        if config.current.print_ir:
            import sys

            print(f"=== qd_numba CUDA task {unit.task.name} ===", file=sys.stderr)
            tk.func_ir.dump()
        argtypes = [types.uint64, types.uint64] + [state.param_types[n] for n in tk.runtime_args]
        compiled = compile_task_to_cubin(tk.func_ir, argtypes, cc=cc, debug=False, lineinfo=debug, exceptions=debug)
        typemap = compiled.typemap or {}
        for name in unit.stores:
            temp_types[name] = _lookup_type(typemap, name, unit.task)
        if unit.ret_var is not None:
            temp_types["$qd_return"] = _lookup_type(typemap, unit.ret_var, unit.task)
        out.append((unit, tk, compiled))
    return plan_ir, out, temp_types


def kernel_field_slots(state):
    """``field -> context slot`` of one kernel instance: the field's position among the fields
    the kernel uses (``state.hidden``, in order of first reference), so compiled code depends on
    the kernel alone, never on how many fields the process created before (relocatable)."""
    slots = {id(f): k for k, f in enumerate(state.hidden)}
    return lambda field: slots[id(field)]


def compile_check(kernel, param_types, templates, cc=(9, 0)):
    """Compile every task of this kernel instance for CUDA down to cubins, without a GPU.

    Fields get placeholder context slots (no device memory is touched). Returns the compiled
    tasks; raises what a real CUDA compile would raise."""
    with profiler.compiling(kernel.qualname, "cuda (compile check)"):
        state = compile_state(kernel, param_types, templates)
        _, compiled, _ = compile_tasks(kernel, state, cc, kernel_field_slots(state))
        host_totals(kernel, state, param_types, [u for u, _, _ in compiled])  # the launcher's host code too
    return compiled


def host_totals(kernel, state, param_types, units):
    """(totals function taking the kernel's arguments or None, iteration counts known now or None)."""
    param_ndims = {name: getattr(ty, "ndim", None) for name, ty in param_types.items()}
    runtime_positions = [i for i, p in enumerate(kernel.params) if p.kind != "template"]
    src, env = cuda_tasks.totals_source(state, units, param_ndims, runtime_positions)
    if src is None:
        return None, None
    ns = dict(env)
    exec_generated(src, f"totals {kernel.qualname}", ns)
    fn = ns["totals"]
    if "args[" in src:
        fn.qd_args = tuple(int(k) for k in re.findall(r"args\[(\d+)\]", src))
        return fn, None
    return None, fn(())


def _lookup_type(typemap, name, task):
    if name in typemap:
        return types.unliteral(typemap[name])
    versions = [t for n, t in typemap.items() if n.split(".")[0] == name]
    if versions:
        return types.unliteral(versions[-1])
    raise QuadrantsRuntimeError(f"internal error: no type for '{name}' in {task.name}")


def plan_types(kernel, args, views):
    """(runtime parameter name -> Numba type, template name -> value) of a call's arguments."""
    param_types, templates = {}, {}
    for p, a in zip(kernel.params, args):
        where = f"kernel '{kernel.name}', argument '{p.name}'"
        if p.kind == "template":
            templates[p.name] = a
        elif p.kind in ("scalar", "matrix"):
            param_types[p.name] = p.nbtype
        else:
            param_types[p.name] = _view_type(where, p.annotation, views[p.name])
    return param_types, templates


def build_plan(kernel, param_types, templates) -> LaunchPlan:
    rt = CudaRuntime.get()
    state = compile_state(kernel, param_types, templates)
    plan_ir, compiled, temp_types = compile_tasks(kernel, state, rt.cc, kernel_field_slots(state))
    rt.plan_builds += 1
    kernel.compile_count += 1

    field_table = rt.field_table(state.hidden)
    cells = {cuda_tasks.PARAM_CTX: [ctypes.c_uint64(int(field_table.device_ctypes_pointer.value))]}
    tmp_bytes = max(1, plan_ir.temp_slots) * device.TEMP_SLOT_BYTES
    tmp_dev = rt.cuda.device_array(tmp_bytes, np.uint8)
    cells[cuda_tasks.PARAM_TMP] = [ctypes.c_uint64(int(tmp_dev.device_ctypes_pointer.value))]
    for _, tk, c in compiled:
        for name in tk.runtime_args:
            if name not in cells:  # same Numba type in every task -> same slots
                cells[name] = [_CTYPES[s.fmt]() for s in c.param_layout if s.arg_name == name]
    launches = []
    range_index = 0
    for unit, tk, c in compiled:
        with profiler.stage("module load"):
            module, fn = rt.load_function(c.cubin, c.entry_name)
        order = [cuda_tasks.PARAM_CTX, cuda_tasks.PARAM_TMP] + tk.runtime_args
        ptrs = [ctypes.addressof(cell) for name in order for cell in cells[name]]
        argv = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        if unit.kind == "range_for" and not unit.task.serialize:
            (grid, block), total_index = rt.occupancy(fn), range_index
        else:
            grid, block, total_index = 1, 1, None
        if unit.kind == "range_for":
            range_index += 1
        launches.append(TaskLaunch(unit.task, fn, module, argv, grid, block, total_index, c))
    # iteration counts on the host
    totals_fn, static_totals = host_totals(kernel, state, param_types, [u for u, _, _ in compiled])
    ret = None
    if plan_ir.ret_slot is not None:
        ret = (plan_ir.ret_slot * device.TEMP_SLOT_BYTES, *return_slot(temp_types["$qd_return"]))
    params = [(p.name, p.kind) for p in kernel.params]
    plan = LaunchPlan(kernel, state, launches, cells, params, totals_fn, static_totals, tmp_dev, field_table, ret)
    if state.adstacks:  # a gradient kernel with loops inside a task: size the adstacks per launch
        rows = {launch.task.uid: launch.grid * launch.block for launch in launches}
        plan.run = adstack.wrap_cuda_run(plan.run, state.adstacks, params, state.hidden, rows.__getitem__,
                                         rt.device_words)
    return plan
