"""The CPU target: compiled instances of a kernel, and its generated call path.

A kernel is compiled once per *instance key*: the Numba types of its ndarray arguments and the
values of its template arguments. The call path (:meth:`CpuKernel.make_caller`) is generated
per kernel: it converts each ndarray argument to the numpy array the kernel uses, looks the key
up and calls the compiled driver's native entry point with the runtime arguments plus the address
of the instance's field table (targets/cpu.py) — one Python frame per call. Argument validation,
error messages and compilation happen on a miss, in :meth:`CpuKernel.slow_call`. Code generation
is in targets/cpu.py.
"""

from __future__ import annotations

import numpy as np
from numba import _dispatcher
from numba.core import types

from .. import adstack, config, offline_cache, profiler
from ..errors import QuadrantsError, QuadrantsTypeError
from ..field import Field, Ndarray, bump_buffers, next_generation, written_by
from ..frontend.args import (
    INT_TYPES,
    NUMBER_TYPES,
    argument_where,
    field_for_ndarray_message,
    host_array,
    int_range,
    ndarray_type,
    pinned_templates,
    scalar_argument,
    template_argument,
    template_key,
)
from ..frontend.diagnostics import compile_error
from ..frontend.keys import artifact_key
from ..generated_code import exec_generated
from ..matrix import matrix_argument
from ..passes.base import IRTools
from ..passes.task_types import TaskTyper
from ..struct import struct_argument
from . import cpu
from .base import KernelBackend, Target
from .untyped import gc_paused, untyped_compile

VALUE_ARGUMENTS = {"matrix": matrix_argument, "struct": struct_argument}  # by-value parameters: their checks


class Instance:
    """One compiled kernel instance (per argument types and template values)."""

    __slots__ = ("entry", "fields", "table", "hidden", "tasks", "cres", "task_functions", "state", "artifact_key",
                 "written", "written_args")

    def __init__(self, entry, fields, tasks, cres, task_functions, state, artifact_key, kernel=None):
        for f in fields:
            f.claim()                                  # a field of an earlier qd.init is our error (field.py)
        self.fields = list(fields)                     # in the order of their slots in the field table
        self.table = cpu.field_table(fields)           # their buffers' addresses (kept alive here)
        self.hidden = (self.table.ctypes.data,)        # what the entry point takes after the runtime arguments
        self.entry, self.tasks = entry, tasks
        # what a launch writes: fields and runtime ndarray positions get new write generations
        self.written, self.written_args = written_by(
            tasks, sum(p.kind != "template" for p in kernel.params) if kernel is not None else 0, self.fields,
            getattr(kernel, "autodiff_mode", None) == "reverse")
        self.cres, self.task_functions, self.state = cres, task_functions, state
        self.artifact_key = artifact_key    # content key of the compiled code (frontend/keys.py)


class CpuTarget(Target):
    arch = "cpu"
    codegen_stages = cpu.CODEGEN_STAGES

    def kernel_backend(self, kernel) -> CpuKernel:
        return CpuKernel(kernel)


class CpuKernel(KernelBackend):
    """One kernel on the CPU: its instances by key, and its call path."""

    arch = "cpu"

    def __init__(self, kernel):
        self.kernel = kernel
        self.instances = {}
        self.template_objects = {}   # instance key -> the template objects it was compiled for (kept alive)
        self.lock = kernel._lock

    # -- the call path ---------------------------------------------------------------------------
    def make_caller(self):
        """The kernel's ``__call__`` on the CPU (see the module docstring)."""
        kernel = self.kernel
        ns = {"Ndarray": Ndarray, "fingerprint": _dispatcher.compute_fingerprint, "template_key": template_key,
              "matrix_argument": matrix_argument, "struct_argument": struct_argument,
              "instances": self.instances, "backend": self,
              "ndarray": np.ndarray, "host_array": host_array,
              "next_generation": next_generation}
        lines, names = kernel.caller_prologue(ns)
        originals = [p.name for p in kernel.signature.parameters.values()]   # bound before conversion
        lines.append("    try:")
        key_items, runtime, runtime_objects = [], [], []
        for name, original, p in zip(names, originals, kernel.params):
            if p.kind != "template":
                runtime_objects.append((original, p.kind))
            if p.kind == "ndarray":
                # numpy arrays pass with one type check; anything else becomes the numpy view
                # of its memory (host_array)
                ns[f"where_{name}"] = argument_where(kernel, p)
                lines.append(f"        if type({name}) is not ndarray: "
                             f"{name} = {name}._arr if type({name}) is Ndarray else host_array({name}, where_{name})")
                key_items.append(f"fingerprint({name})")
                runtime.append(name)
            elif p.kind == "template":
                key_items.append(f"template_key({name})")
            elif p.kind in ("matrix", "struct"):  # a qd.Vector/Matrix/Struct of the annotated type
                ns[f"type_{name}"] = p.nbtype
                lines.append(f"        {name} = {p.kind}_argument({name}, type_{name})")
                runtime.append(name)
            else:
                # exact-type membership: anything else takes the slow path, which validates
                ns[f"ok_{name}"] = INT_TYPES if isinstance(p.nbtype, types.Integer) else NUMBER_TYPES
                # an int that does not fit the parameter's type takes the slow path, which raises
                fits = ""
                if isinstance(p.nbtype, types.Integer):
                    ns[f"lo_{name}"], ns[f"hi_{name}"] = int_range(p.nbtype)
                    fits = f" or not lo_{name} <= {name} <= hi_{name}"
                lines.append(f"        if type({name}) not in ok_{name}{fits}: raise KeyError")
                runtime.append(name)
        key = "(" + "".join(f"{k}, " for k in key_items) + ")"
        lines += [f"        inst = instances[{key}]",
                  "    except (KeyError, TypeError, ValueError, NotImplementedError):",
                  f"        return backend.slow_call({', '.join(names)})",
                  # new write generations for what the launch writes (adstack sizes are cached on
                  # them): the fields, and the qd.ndarray arguments (numpy arrays have none)
                  "    if inst.written:",
                  "        for f in inst.written:",
                  "            f._gen = next_generation()",
                  *(f"    if type({obj}) is Ndarray and {k} in inst.written_args: {obj}._gen = next_generation()"
                    for k, (obj, kind) in enumerate(runtime_objects) if kind == "ndarray"),
                  "    try:",
                  f"        return inst.entry({''.join(f'{r}, ' for r in runtime)}*inst.hidden)",
                  "    except Exception as e:",
                  f"        raise backend.runtime_error(e, ({', '.join(names)}{',' if names else ''})) from None"]
        exec_generated("\n".join(lines) + "\n", f"call {kernel.qualname}", ns)
        return ns["__call__"]

    def call(self, *args):
        return self.slow_call(*args)

    def slow_call(self, *args):
        """A call the generated caller did not serve: check the arguments, compile if needed, run.
        It runs inside the caller's ``except KeyError`` (the cache miss): our errors leave without
        that KeyError as their context, so no "During handling of the above exception" precedes them."""
        kernel = self.kernel
        try:
            with self.lock:
                args = self.host_args(args)
                inst = self._instance(args)
                args = tuple(VALUE_ARGUMENTS[p.kind](a, p.nbtype) if p.kind in VALUE_ARGUMENTS else
                             scalar_argument(argument_where(kernel, p), p, a) if p.kind == "scalar" else a
                             for p, a in zip(kernel.params, args))
                kernel.last_instance = inst
        except QuadrantsError as e:
            e.__context__ = None
            raise
        runtime = [a for p, a in zip(kernel.params, args) if p.kind != "template"]
        for f in inst.written:
            f._gen = next_generation()
        bump_buffers(inst.written_args, runtime)
        try:
            return inst.entry(*runtime, *inst.hidden)
        except Exception as e:
            raise self.runtime_error(e, args) from None

    def runtime_error(self, exc, args):
        return self.kernel.runtime_error(exc, lambda: self.argument_types(self.host_args(args)))

    def _instance(self, host_args) -> Instance:
        """The compiled instance these (host) arguments select, compiled if needed."""
        kernel = self.kernel
        types_, templates = self.argument_types(host_args)
        key = tuple(_dispatcher.compute_fingerprint(a) if p.kind == "ndarray" else template_key(a)
                    for p, a in zip(kernel.params, host_args) if p.kind in ("ndarray", "template"))
        with self.lock:
            inst = self.instances.get(key)
            if inst is None:
                inst = self.instances[key] = self.compile(types_, templates)
                self.template_objects[key] = pinned_templates(host_args, kernel.params)
        return inst

    # -- argument checks ------------------------------------------------------------------------------
    def host_args(self, args):
        """The arguments with each ndarray argument as the numpy array the CPU target uses."""
        return tuple(host_array(a, argument_where(self.kernel, p)) if p.kind == "ndarray" else a
                     for p, a in zip(self.kernel.params, args))

    def argument_types(self, args):
        """(runtime param name -> Numba type, template name -> value); raises on bad arguments."""
        types_, templates = {}, {}
        debug = config.current.debug
        for p, a in zip(self.kernel.params, args):
            where = argument_where(self.kernel, p)
            if p.kind == "template":
                templates[p.name] = template_argument(where, p, a)
            elif p.kind == "scalar":
                scalar_argument(where, p, a)
                types_[p.name] = p.nbtype
            elif p.kind in VALUE_ARGUMENTS:
                try:
                    VALUE_ARGUMENTS[p.kind](a, p.nbtype)
                except QuadrantsTypeError as e:
                    raise QuadrantsTypeError(f"{where}: {e}") from None
                types_[p.name] = p.nbtype
            else:
                if isinstance(a, Field):
                    raise QuadrantsTypeError(field_for_ndarray_message(where, a))
                types_[p.name] = ndarray_type(where, p.annotation, a, debug)
        return types_, templates

    # -- compilation ---------------------------------------------------------------------------------
    def compile(self, param_types, templates) -> Instance:
        kernel = self.kernel
        # compile records and log (profiler.py); no GC pauses in the middle of a compile
        with gc_paused(), profiler.compiling(kernel.qualname, "cpu"):
            cfg = config.current.for_kernel(fuse=kernel.fuse, graph=kernel.graph)
            place = offline_cache.lookup(kernel, param_types, templates, cfg, "cpu")
            if place is not None:
                with profiler.stage("offline cache load"):
                    loaded = offline_cache.load(place, offline_cache.cpu_rebuild)
                fields = place.hidden_fields(loaded[2]) if loaded is not None else None
                if fields is not None:
                    cres, tasks, _ = loaded
                    return Instance(cres.entry_point, fields, list(tasks), cres, [], None, place.key, kernel)
            return self._compile(param_types, templates, place)

    def _compile(self, param_types, templates, place=None) -> Instance:
        kernel = self.kernel
        task_functions = []
        try:
            state = untyped_compile(kernel, IRTools.for_cpu(), param_types, templates, cpu.CODEGEN_STAGES)
            cfg, runtime_params = state.config, state.runtime_params
            argtypes = [param_types[n] for n in runtime_params] + [cpu.CTX_TYPE]
            typer = TaskTyper(state)    # the Tasks' types come from the typing the lowering does
            with profiler.stage("task split"):
                driver, task_functions = cpu.build_driver(state, cfg.debug)
            with profiler.stage("typing + lowering", llvm=True):
                cres = cpu.compile_driver(driver, argtypes, task_functions, cfg.debug)
            typer.assign(cpu.typed_pieces(cres, task_functions), cres.signature.return_type,
                         cres.typing_context)
            if cfg.amdgpu_compile_check:  # the AMDGPU code path, with the CUDA one from the same lowering
                from .amdgpu.plan import compile_check

                compile_check(kernel, param_types, templates, with_cuda=cfg.cuda_compile_check)
            elif cfg.cuda_compile_check:  # the CUDA code path on GPU-less machines (tests, CI)
                from .cuda.plan import compile_check

                compile_check(kernel, param_types, templates)
        except Exception as e:
            fallback = next((tf.error for tf in task_functions if isinstance(tf.error, QuadrantsError)), None)
            err = compile_error(kernel.name, e, param_types, config.current.raw_errors, fallback)
            if err is None:
                raise
            raise err from None
        kernel.compile_count += 1
        key = artifact_key(kernel, param_types, templates, state.hidden, cfg, "cpu")
        # a gradient kernel with adstacks sizes them from compile-time data: compiled in every process
        hidden_paths = place.hidden_paths(state.hidden) if place is not None and not state.adstacks else None
        if hidden_paths is not None:
            offline_cache.store(place, offline_cache.cpu_payload(cres, state.tasks, hidden_paths),
                                (cres, list(state.tasks), hidden_paths))
        entry = cres.entry_point
        if state.adstacks:  # a gradient kernel with loops inside a task: size the adstacks per launch
            entry = adstack.wrap_cpu_entry(entry, state.adstacks, kernel, state.hidden)
        if cfg.kernel_profiler:  # settled per instance: an unprofiled call path is unchanged
            entry = profiler.timed_cpu_entry(kernel.qualname, entry, cpu.task_clocks(cres, task_functions))
        return Instance(entry, state.hidden, list(state.tasks), cres, task_functions, state, key,
                        kernel)

    # -- introspection ------------------------------------------------------------------------------------
    def tasks(self, args):
        return list(self._instance(self.host_args(args)).tasks)

    def compiled_count(self) -> int:
        return len(self.instances)

    def tasks_and_fields(self, args):
        instance = self._instance(self.host_args(args))
        return instance.tasks, instance.fields
