"""The AMDGPU target and its kernel backend: a ``@qd.kernel`` launched through HIP.

The plan of a kernel instance mirrors the CUDA target's (targets/cuda/plan.py): the
:class:`~qd_numba.targets.cuda.plan.PlanBinary` of its tasks (code objects instead of cubins,
the same parameter slots, temporaries, return slot and host iteration counts), one ``void*[]``
of ctypes cells per task, shared by all tasks of the kernel, and one ``hipModuleLaunchKernel``
per task. A call writes the cells of its arguments, computes the host iteration counts, launches
in program order on the null stream, copies numpy arguments back and reads the return value.

Arguments: scalars, ndarrays (numpy: copied to the device and back; ``qd.ndarray``: in place;
objects with ``__cuda_array_interface__`` holding HIP memory: in place) and template values.
Matrix and struct arguments are not supported on ``qd.amdgpu`` yet (QuadrantsTypeError).
"""

from __future__ import annotations

import ctypes
import threading

import numba
import numpy as np
from numba.core import types

from ... import config, profiler
from ...errors import QuadrantsRuntimeError, QuadrantsTypeError
from ...field import Ndarray
from ...frontend.args import template_key
from ...frontend.diagnostics import compile_error
from ...generated_code import exec_generated
from ...lowering.raising import device_exception
from ..base import KernelBackend, Target
from ..untyped import gc_paused
from .plan import CODEGEN_STAGES, Toolchain, compile_kernel
from .runtime import HipArray, HipRuntime, ensure_device, missing


class AmdgpuTarget(Target):
    arch = "amdgpu"
    codegen_stages = CODEGEN_STAGES

    def kernel_backend(self, kernel) -> AmdgpuKernel:
        return AmdgpuKernel(kernel)

    def place(self, data) -> None:
        ensure_device(data)

    def synchronize(self) -> None:
        HipRuntime.get().synchronize()

    def open(self) -> None:
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

    def __init__(self, kernel, binary, fields, functions):
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
        self.error_words = [(launch, rt.global_address(launch.module, launch.binary.error_symbol))
                            for launch in self.launches if launch.binary.error_symbol]

    def run(self, args, views):
        """Launch every task on the null stream with ``args`` (the kernel's, in order) and
        ``views`` (param name -> (device address, shape, strides, itemsize, copy back))."""
        for p, a in zip(self.kernel.params, args):
            cells = self.cells.get(p.name)
            if cells is None:
                continue
            if p.kind == "ndarray":
                address, shape, strides, itemsize, _back = views[p.name]
                values = [0, 0, int(np.prod(shape, dtype=np.int64)), itemsize, address, *shape, *strides]
            else:
                values = [a]
            for cell, value in zip(cells, values, strict=True):
                cell.value = value
        totals = self.static_totals if self.totals_fn is None else self.totals_fn(args)
        for launch in self.launches:
            grid = launch.grid
            if launch.total_index is not None:
                n = int(totals[launch.total_index])
                if n <= 0:
                    continue
                grid = min(grid, -(-n // launch.block))
            self.rt.launch(launch.fn, grid, launch.block, 0, ctypes.addressof(launch.argv))
        self._raise_recorded()
        for _name, (_address, _shape, _strides, _itemsize, back) in views.items():
            if back is not None:
                back()
        if self.binary.ret is None:
            return None
        offset, dtype, count = self.binary.ret
        raw = self.tmp.copy_to_host()[offset:offset + np.dtype(dtype).itemsize * count]
        return self.read_return(raw, np.dtype(dtype), self.kernel.return_type)

    def _raise_recorded(self) -> None:
        """The first exception a task recorded (debug mode), as the CUDA plan raises it; every
        error word is cleared."""
        recorded = []
        for launch, address in self.error_words:
            code = self.rt.read_i32(address)
            if code:
                self.rt.write_i32(address, 0)
                recorded.append((launch, code))
        if recorded:
            launch, code = recorded[0]
            cls, exc_args, loc = device_exception(code) or launch.binary.exceptions.get(
                code, (SystemError, (f"unknown error {code} in native function",), None))
            line = f"{loc[1]}:{loc[2]}" if loc else launch.binary.task.loc
            where = f" (task {launch.binary.task.name}" + (f", {line}" if line else "") + ")"
            err = self.kernel.runtime_error(cls(*exc_args) if exc_args else cls())
            raise type(err)(f"{err}{where}") from None


def _ndarray_view(where, a):
    """(Numba type, (device address, shape, byte strides, itemsize, copy-back or None)) of an
    ndarray argument on AMDGPU."""
    if type(a) is Ndarray:
        ensure_device(a)
        arr = a._arr
        return numba.typeof(arr), (a._dev.address, arr.shape, arr.strides, arr.itemsize, None)
    if isinstance(a, np.ndarray):
        host = np.ascontiguousarray(a)
        dev = HipArray(host.shape, host.dtype)
        dev.copy_to_device(host)

        def back():
            if a.flags.writeable:
                a[...] = dev.copy_to_host()

        return numba.typeof(host), (dev.address, host.shape, host.strides, host.itemsize, back)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        dtype = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or tuple(int(s) * dtype.itemsize
                                              for s in np.cumprod((1,) + shape[:0:-1])[::-1])
        layout = "C" if cai.get("strides") is None else "A"
        ty = types.Array(numba.from_dtype(dtype), len(shape), layout)
        return ty, (int(cai["data"][0]), shape, tuple(strides), dtype.itemsize, None)
    raise QuadrantsTypeError(f"{where}: expected a numpy array, a qd.ndarray or an object with "
                             f"__cuda_array_interface__ (HIP memory) on qd.amdgpu, got {type(a).__name__}")


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
        plan, views = self._plan(args)
        return plan.run(args, views)

    def tasks(self, args) -> list:
        return list(self._plan(args)[0].tasks)

    def compiled_count(self) -> int:
        return len(self.plans)

    def tasks_and_fields(self, args):
        plan = self._plan(args)[0]
        return plan.tasks, plan.fields

    def _plan(self, args):
        kernel = self.kernel
        param_types, templates, views, key = {}, {}, {}, []
        for p, a in zip(kernel.params, args):
            where = f"kernel '{kernel.name}', argument '{p.name}'"
            if p.kind == "template":
                templates[p.name] = a
                key.append(template_key(a))
            elif p.kind == "ndarray":
                param_types[p.name], views[p.name] = _ndarray_view(where, a)
                key.append(param_types[p.name])
            elif p.kind in ("matrix", "struct"):
                raise QuadrantsTypeError(f"{where}: {p.kind} arguments are not supported on qd.amdgpu yet "
                                         "(docs/amdgpu.md)")
            else:
                param_types[p.name] = p.nbtype
        key = tuple(key)
        with self.lock:
            plan = self.plans.get(key)
            if plan is None:
                plan = self.plans[key] = self._build(param_types, templates)
        return plan, views

    def _build(self, param_types, templates):
        from ..cuda.plan import plan_binary

        kernel = self.kernel
        rt = HipRuntime.get()
        try:
            with gc_paused(), profiler.compiling(kernel.qualname, "amdgpu"):
                toolchain = Toolchain.current()
                toolchain.require_linker()
                state, plan_ir, compiled, temp_types = compile_kernel(kernel, param_types, templates, toolchain)
                per_device = [(unit, tk, c[rt.arch]) for unit, tk, c in compiled]
                binary = plan_binary(kernel, state, plan_ir, per_device, temp_types, f"amdgpu-{rt.arch}")
                with profiler.stage("module load"):
                    functions = [rt.load_function(t.cubin, t.entry_name) for t in binary.tasks]
        except Exception as e:
            err = compile_error(kernel.name, e, param_types, config.current.raw_errors)
            if err is None:
                raise
            raise err from None
        rt.plan_builds += 1
        kernel.compile_count += 1
        return AmdgpuPlan(kernel, binary, state.hidden, functions)
