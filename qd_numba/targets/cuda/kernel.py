"""The CUDA target and its kernel backend: the call path of a ``@qd.kernel`` on CUDA.

:class:`CudaTarget` is what the target registry (targets/base.py) instantiates for
``arch="cuda"``: it places fields in device memory and synchronizes. :class:`CudaKernel` generates
a kernel's call path: argument views and checks (:func:`_check_scalar`, :func:`_check_matrix`),
the spec key, the plan lookup (building a plan, plan.py, on a miss), then the plan's runner.

This module never compiles or launches by itself: plan.py does both.
"""

from __future__ import annotations

import threading

from numba.core import types

from ... import config, dlpack, profiler
from ...errors import QuadrantsRuntimeError, QuadrantsTypeError
from ...field import Ndarray
from ...frontend.args import (
    INT_TYPES,
    NUMBER_TYPES,
    argument_where,
    int_range,
    pinned_templates,
    scalar_argument,
    template_key,
)
from ...frontend.diagnostics import compile_error
from ...generated_code import exec_generated
from ..base import KernelBackend, Target
from ..untyped import gc_paused
from .arrays import array_view
from .compile import cuda_available
from .plan import CODEGEN_STAGES, _tuple_src, build_plan, plan_types
from .runtime import CudaRuntime, ensure_device, start_launchers


class CudaTarget(Target):
    arch = "cuda"
    codegen_stages = CODEGEN_STAGES
    dlpack_device_type = dlpack.CUDA

    def kernel_backend(self, kernel) -> CudaKernel:
        return CudaKernel(kernel)

    def place(self, data) -> None:
        ensure_device(data)

    def synchronize(self) -> None:
        CudaRuntime.get().cuda.synchronize()

    def open(self, cfg) -> None:
        if not cuda_available():
            raise QuadrantsRuntimeError("qd.init(arch=cuda): no usable NVIDIA GPU (needs a CUDA driver, a device, and "
                                        "`pip install qd_numba[cuda]`); use qd.cpu")
        CudaRuntime.open(cfg.device_id)
        start_launchers()   # the native launch loops, built while the program goes on (runtime.py)

    def dlpack_buffer(self, data, stream, copy):
        dev = data._dev
        if dev is None:
            return None
        rt = CudaRuntime.get()
        if copy:    # queued first: the consumer's stream waits for the copy too
            dev = rt.cuda.device_array(dev.shape, dev.dtype)
            dev.copy_to_device(data._dev)
        # kernels and copies run on the legacy default stream: a consumer's stream that CUDA does
        # not order with it (non-blocking) waits for them; -1 and None ask for no ordering
        if stream is not None and stream != -1 and rt.stream_nonblocking(int(stream)):
            rt.fence(0, int(stream))
        return int(dev.device_ctypes_pointer.value or 0), rt.device_id, dev

    def configure(self, cfg) -> None:
        rt = CudaRuntime.get()
        rt.apply_stack_limit(cfg.cuda_stack_limit)


class CudaKernel(KernelBackend):
    """The CUDA side of one ``@qd.kernel``: its launch plans, per argument spec."""

    arch = "cuda"

    def __init__(self, kernel):
        self.kernel = kernel
        self.plans = {}
        self.template_objects = {}   # plan key -> the template objects it was built for (kept alive)
        self.lock = threading.RLock()
        self._where = [argument_where(kernel, p) for p in kernel.params]
        for p in kernel.params:
            if p.kind == "scalar":
                p.exact_types = INT_TYPES if isinstance(p.nbtype, types.Integer) else NUMBER_TYPES
        self.caller, self._plan_for, self._dunder_call = self._call_path()
        self._device_loop = None

    # -- the call path ---------------------------------------------------------------------------
    def make_caller(self):
        """The kernel's ``__call__`` on CUDA (:meth:`_call_path`)."""
        return self._dunder_call

    def call(self, *args):
        return self.caller(*args)

    def _call_path(self):
        """(``call``, ``plan_for``, ``__call__``): the launcher's (:meth:`_launcher_source`) and
        the kernel's parameters in front of it (Kernel.caller_prologue), generated as one source
        (one code object to compile, or load from the offline cache, in a process's first call)."""
        src, ns = self._launcher_source()
        lines, names = self.kernel.caller_prologue(ns)
        lines.append(f"    return __qd_call({', '.join(names)})")    # a parameter may be named ``call``
        exec_generated(src + "__qd_call = call\n" + "\n".join(lines) + "\n", f"call {self.kernel.qualname}", ns)
        return ns["call"], ns["plan_for"], ns["__call__"]

    def tasks(self, args) -> list:
        return list(self.plan_for(args).tasks)

    def compiled_count(self) -> int:
        return len(self.plans)

    def tasks_and_fields(self, args):
        plan = self.plan_for(args)
        return plan.tasks, plan.fields

    def _launcher_source(self):
        """(source, namespace) of this kernel's call path, ``call(*args)``: views and spec key of
        the arguments, the plan lookup, then the plan's runner (:func:`_runner_source`). Scalars
        of an exact Python or numpy type pass without a check; anything else is validated.
        ``plan_for(args)`` and ``call_on(stream, nonblocking, *args)`` (``qd_stream=``) share the
        source up to the lookup. Executed by :meth:`_call_path`."""
        params = self.kernel.params
        args = [f"a{i}" for i in range(len(params))]
        ns = {"Ndarray": Ndarray, "array_view": array_view, "template_key": template_key,
              "plans": self.plans, "build": self._plan, "check_scalar": _check_scalar,
              "check_matrix": _check_matrix,
              "kernel": self.kernel}
        body, key, views = [], [], []
        for i, p in enumerate(params):
            if p.kind == "ndarray":
                ns[f"w{i}"] = self._where[i]
                body += [f"v{i} = a{i}._cuda_view if type(a{i}) is Ndarray else None",
                         f"if v{i} is None: v{i} = array_view(a{i}, w{i})"]
                key.append(f"v{i}.spec")
                views.append(f"v{i}")
            elif p.kind == "template":
                key.append(f"template_key(a{i})")
            elif p.kind in ("matrix", "struct"):
                ns[f"p{i}"] = p
                body.append(f"a{i} = check_matrix(kernel, p{i}, a{i})")
            else:
                ns[f"ok{i}"], ns[f"p{i}"] = p.exact_types, p
                fits = ""
                if isinstance(p.nbtype, types.Integer):   # an int that does not fit: check_scalar raises
                    ns[f"lo{i}"], ns[f"hi{i}"] = int_range(p.nbtype)
                    fits = f" or not lo{i} <= a{i} <= hi{i}"
                body.append(f"if type(a{i}) not in ok{i}{fits}: a{i} = check_scalar(kernel, p{i}, a{i})")
        body += [f"plan = plans.get({_tuple_src(key)})",
                 f"if plan is None: plan = build({_tuple_src(args)}, {_tuple_src(views)}, {_tuple_src(key)})"]
        src = "\n".join([f"def call({', '.join(args)}):", *(f"    {line}" for line in body),
                         f"    return plan.run({', '.join(args + views)})",
                         f"def plan_for({', '.join(args)}):", *(f"    {line}" for line in body),
                         "    return plan"]) + "\n"
        # on a stream, and up to the launch (graphs): made at their first use (a compile() less
        # in a process's first call, docs/compile_time.md)
        self._rare_paths = (args, views, body, ns)
        self._call_on = self._prepare = None
        return src, ns

    def _make_rare(self, name):
        """Generate ``call_on`` or ``prepare`` of this kernel's call path (at its first use) and
        keep it as ``self._<name>``."""
        args, views, body, ns = self._rare_paths
        head, tail = {
            "call_on": (f"def call_on(stream, nonblocking, {', '.join(args)}):",
                        [f"    return plan.on_stream()(stream, nonblocking, {', '.join(args + views)})"]),
            "prepare": (f"def prepare({', '.join(args)}):",
                        ["    if plan.graph is None: return plan, None",
                         f"    return plan, plan.prepare()({', '.join(args + views)})"]),
        }[name]
        src = "\n".join([head, *(f"    {line}" for line in body), *tail]) + "\n"
        exec_generated(src, f"cuda {name} {self.kernel.qualname}", ns)
        setattr(self, "_" + name, ns[name])
        return ns[name]

    def call_on_stream(self, handle, args):
        """The call path with the launch on stream ``handle`` (LaunchPlan.on_stream)."""
        call_on = self._call_on or self._make_rare("call_on")
        return call_on(handle, CudaRuntime.get().stream_nonblocking(handle), *args)

    def prepare(self, args):
        """(plan, dirty node bits) of these arguments: the call path up to the launch (the plan's
        cells written, nothing launched; dirty is None when the plan has no graph)."""
        return (self._prepare or self._make_rare("prepare"))(*args)

    def do_while_loop(self, kernel):
        """The device-side runner of the ``qd.graph.do_while`` kernel whose first part is this
        kernel (do_while.py), kept with this backend (``qd.init`` drops both)."""
        from .do_while import DeviceLoop

        if self._device_loop is None or self._device_loop.kernel is not kernel:
            self._device_loop = DeviceLoop(kernel)
        return self._device_loop

    def plan_for(self, args):
        """The launch plan these arguments select (built if needed), without launching."""
        return self._plan_for(*args)

    def _plan(self, args, view_list, key):
        with self.lock:  # one build per spec, also when threads race for it
            plan = self.plans.get(key)
            if plan is None:
                names = [p.name for p in self.kernel.params if p.kind == "ndarray"]
                plan = self.plans[key] = self._build(args, dict(zip(names, view_list)))
                self.template_objects[key] = pinned_templates(args, self.kernel.params)
        return plan

    # -- building a plan ------------------------------------------------------------------------
    def _build(self, args, views):
        kernel = self.kernel
        param_types, templates = plan_types(kernel, args, views)
        try:
            with gc_paused(), profiler.compiling(kernel.qualname, "cuda"):
                return build_plan(kernel, param_types, templates)
        except Exception as e:
            err = compile_error(kernel.name, e, param_types, config.current.raw_errors)
            if err is None:
                raise
            raise err from None


def _check_scalar(kernel, p, a):
    """A scalar argument whose type is not one of the exact types the fast path takes: a float
    for an integer parameter, converted (frontend/args.scalar_argument), else our error."""
    where = argument_where(kernel, p)
    value = scalar_argument(where, p, a)
    if type(value) not in p.exact_types:
        raise QuadrantsTypeError(f"{where}: expected a {p.nbtype} scalar, got {type(a).__name__}")
    return value


def _check_matrix(kernel, p, a):
    """A vector/matrix (struct) argument as a qd.Vector/qd.Matrix (qd.Struct) of its parameter's type."""
    from ...matrix import matrix_argument
    from ...struct import struct_argument

    try:
        return (struct_argument if p.kind == "struct" else matrix_argument)(a, p.nbtype)
    except QuadrantsTypeError as e:
        raise QuadrantsTypeError(f"kernel '{kernel.name}', argument '{p.name}': {e}") from None
