"""``@qd.kernel`` and ``@qd.func``: argument specs, compilation, and the call path.

A kernel is compiled once per *instance key*: the Numba types of its ndarray arguments and
the values of its template arguments. The call path (:meth:`Kernel._make_caller`) is the
kernel's own ``__call__``, generated per kernel (each kernel is an instance of its own
``Kernel`` subclass): its parameters carry the kernel's names and defaults, so CPython binds
keyword arguments; it converts ``qd.ndarray`` objects to their buffers, looks the key up and
calls the compiled driver's native entry point with the runtime arguments plus the hidden field
buffers (on a GPU arch it hands the arguments to the CUDA launcher's generated call instead).
Everything else — argument validation, error messages, compilation — happens on a miss, in
:meth:`Kernel._slow_call`, or for a bad call in :meth:`Kernel._bad_call`. ``qd.init`` drops
every kernel's compiled instances (:func:`forget_compiled`).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import threading
import weakref

import numpy as np
from numba import _dispatcher
from numba.core import errors as numba_errors
from numba.core import types

from . import config, dtypes, profiler
from .errors import (
    QuadrantsCompilationError,
    QuadrantsError,
    QuadrantsNameError,
    QuadrantsRuntimeError,
    QuadrantsSyntaxError,
    QuadrantsTypeError,
    located,
    take_pending,
)
from .field import ArrayData, Field, Ndarray, element_shape
from .frontend.keys import artifact_key
from .generated_code import exec_generated
from .matrix import matrix_argument
from .passes.base import CompileState, IRTools, copy_ir
from .passes.check_writes import is_readonly
from .passes.pipeline import run_untyped_pipeline
from .typing.field import FieldType
from .typing.matrix import MatrixType

# -- annotations -------------------------------------------------------------------------------


class Template:
    """``qd.template()`` / ``qd.Template``: the argument is bound at compile time (one compiled
    instance per distinct value: fields by identity, Python values by value)."""

    def __repr__(self):
        return "qd.template()"


def template() -> Template:
    return Template()


class NdarraySpec:
    """``qd.types.ndarray(dtype=, ndim=)`` / ``qd.types.NDArray[dtype, ndim]``."""

    def __init__(self, dtype=None, ndim=None):
        self.elem_type = dtype if hasattr(dtype, "ndim") and hasattr(dtype, "n") else None
        self.dtype = None if dtype is None else (self.elem_type.dtype if self.elem_type else dtypes.to_numba(dtype))
        self.ndim = ndim

    def __repr__(self):
        return f"qd.types.ndarray(dtype={self.elem_type or self.dtype}, ndim={self.ndim})"


class _NDArrayAlias:
    def __getitem__(self, item):
        dtype, ndim = item if isinstance(item, tuple) else (item, None)
        return NdarraySpec(dtype, ndim)

    def __call__(self, dtype=None, ndim=None):
        return NdarraySpec(dtype, ndim)


NDArray = _NDArrayAlias()


def _param_kind(annotation):
    if annotation is inspect.Parameter.empty:
        return None
    if annotation is Template or isinstance(annotation, Template):
        return "template"
    if isinstance(annotation, NdarraySpec):
        return "ndarray"
    if annotation is NDArray or annotation is np.ndarray:
        return "ndarray"
    if isinstance(annotation, (types.Number, types.Boolean)) or annotation in (int, float, bool):
        return "scalar"
    if isinstance(annotation, MatrixType):  # qd.types.vector/matrix: passed by value, like a scalar
        return "matrix"
    return None


def _evaluate_annotation(fn, kernel_name: str, what: str, annotation):
    """A string annotation (``from __future__ import annotations``, or written in quotes)
    evaluated as ``typing.get_type_hints`` does — in the function's globals — plus the
    function's closure cells, so annotations naming enclosing-scope values work too."""
    if not isinstance(annotation, str):
        return annotation
    local_ns = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            local_ns[name] = cell.cell_contents
        except ValueError:  # an empty cell: the name is not bound yet
            pass
    try:
        return eval(annotation, fn.__globals__, local_ns)
    except Exception as e:
        hint = ""
        if isinstance(e, NameError) and "<locals>" in fn.__qualname__:
            hint = ("; names of an enclosing function are visible only if the kernel body uses them "
                    "(Python keeps no other) - define the type at module level")
        raise QuadrantsSyntaxError(
            f"kernel '{kernel_name}': cannot evaluate the annotation {annotation!r} of {what}: "
            f"{type(e).__name__}: {e}{hint}") from None


class Param:
    def __init__(self, name, annotation, kind):
        self.name, self.annotation, self.kind = name, annotation, kind
        if kind == "ndarray" and not isinstance(annotation, NdarraySpec):
            self.annotation = NdarraySpec()
        self._nbtype = annotation if kind == "matrix" else \
            dtypes.to_numba(annotation) if kind == "scalar" and annotation not in (int, float) else None

    @property
    def nbtype(self):
        """The Numba type of a scalar parameter; ``int``/``float`` annotations follow
        ``qd.init(default_ip=/default_fp=)`` as set when the kernel compiles, not when decorated."""
        if self._nbtype is not None:
            return self._nbtype
        return config.current.default_ip if self.annotation is int else config.current.default_fp


# -- funcs -------------------------------------------------------------------------------------------


class QdFunc:
    """``@qd.func``: inlined into its callers at compile time."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__qualname__
        self._ir = {}

    def frontend_ir(self, tools):
        key = id(tools.ir)
        if key not in self._ir:
            self._ir[key] = _frontend(tools, self.fn, self.name)
        return self._ir[key]

    def __call__(self, *args, **kwargs):
        raise QuadrantsSyntaxError(f"qd.func '{self.name}' can only be called from a kernel or another qd.func")

    def __deepcopy__(self, memo):
        return self


def func(fn=None, *, is_real_function=False):
    """Decorator: a function inlined into kernels (arguments, return values, templates)."""
    if fn is None:
        return lambda f: QdFunc(f)
    return QdFunc(fn)


def _frontend(tools, fn, name):
    try:
        return tools.run_frontend(fn)
    except numba_errors.UnsupportedError as e:
        raise QuadrantsSyntaxError(f"in '{name}': unsupported Python construct: {e}") from None
    except Exception as e:
        if not is_numba_error(e):  # Numba's or numba-cuda's
            raise
        if _is_numba_error_class(e, "NotDefinedError"):
            loc = e.loc or _first_read(fn, e.name)   # numba-cuda's frontend gives no location
            raise located(QuadrantsNameError, f"in '{name}': {_unbound_local(fn, e.name)}", loc=loc) from None
        raise QuadrantsSyntaxError(f"in '{name}': {e}") from None


def _first_read(fn, name: str):
    """The location of the first instruction of ``fn`` that reads the local ``name``, or None."""
    import dis

    from numba.core import ir as numba_ir

    line = None
    for ins in dis.get_instructions(fn):
        current = getattr(ins, "line_number", None)     # Python >= 3.13
        if current is None and not isinstance(ins.starts_line, bool):
            current = ins.starts_line                   # Python <= 3.12: the line it starts, or None
        line = current or line
        if ins.opname.startswith("LOAD_FAST") and name in (ins.argval if isinstance(ins.argval, tuple)
                                                         else (ins.argval,)):
            return numba_ir.Loc(fn.__code__.co_filename, line) if line else None
    return None


def _unbound_local(fn, name: str) -> str:
    """What to write instead, when the frontend finds ``name`` read before any assignment: mostly
    ``x += ...`` on a global 0-d field, which Python makes a local variable of the kernel."""
    value = fn.__globals__.get(name)
    if isinstance(value, Field) and value.shape == ():
        return (f"'{name}' is a 0-d field: read and write its value as {name}[None] "
                f"(e.g. {name}[None] += ...); assigning to '{name}' itself makes it a local variable")
    if isinstance(value, ArrayData):
        return (f"assigning to '{name}' makes it a local variable of the kernel; "
                f"write to the elements of the field instead: {name}[i] = ...")
    return (f"local variable '{name}' is read before it is assigned; assigning to a global or enclosing "
            f"variable makes it local to the kernel (for a 0-d field write {name}[None] += ...; kernels "
            "cannot rebind Python variables)")


# -- kernels ---------------------------------------------------------------------------------------------


class Instance:
    """One compiled kernel instance (per argument types and template values)."""

    __slots__ = ("entry", "hidden", "tasks", "cres", "task_functions", "state", "artifact_key")

    def __init__(self, entry, hidden, tasks, cres, task_functions, state, artifact_key):
        self.entry, self.hidden, self.tasks = entry, hidden, tasks
        self.cres, self.task_functions, self.state = cres, task_functions, state
        self.artifact_key = artifact_key    # content key of the compiled code (frontend/keys.py)


_KERNELS: weakref.WeakSet = weakref.WeakSet()
_MISSING_ARG = object()  # a kernel parameter without a value in a call


def forget_compiled() -> None:
    """Drop every kernel's compiled instances and launch plans (``qd.init`` does: a new
    configuration, e.g. ``debug`` or another arch, changes the code kernels compile to)."""
    for kernel in list(_KERNELS):
        with kernel._lock:
            kernel._instances.clear()
            kernel.last_instance = None
            kernel.__dict__.pop("_gpu_kernel", None)


class Kernel:
    def __init__(self, fn, *, graph: bool = False, fuse=None):
        self.fn = fn
        self.name = fn.__name__
        self.qualname = f"{fn.__module__}.{fn.__qualname__}"
        self.graph = graph
        self.fuse = fuse
        sig = inspect.signature(fn)
        self.params = []
        for p in sig.parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise QuadrantsSyntaxError(f"kernel '{self.name}': *args/**kwargs parameters are not supported")
            annotation = _evaluate_annotation(fn, self.name, f"parameter '{p.name}'", p.annotation)
            kind = _param_kind(annotation)
            if kind is None:
                raise QuadrantsSyntaxError(
                    f"kernel '{self.name}': parameter '{p.name}' needs a type annotation "
                    "(a scalar dtype, qd.types.vector/matrix(...), qd.types.ndarray(...), or qd.template())"
                    + (f", got {annotation!r}" if annotation is not inspect.Parameter.empty else ""))
            self.params.append(Param(p.name, annotation, kind))
        self.return_type = None
        returns = _evaluate_annotation(fn, self.name, "the return value", sig.return_annotation)
        if returns is not inspect.Signature.empty and returns is not None:
            self.return_type = dtypes.to_numba(returns)
        self._instances = {}
        self._lock = threading.RLock()
        self._ir = {}
        self.compile_count = 0
        self.last_instance = None
        # the call path: a subclass per kernel whose __call__ is generated for its parameters
        self.__class__ = type(Kernel)(f"Kernel[{self.name}]", (Kernel,), {"__call__": self._make_caller()})
        _KERNELS.add(self)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    # -- the call path ---------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """The generic call (every kernel's class overrides it with :meth:`_make_caller`'s)."""
        args = self._bind(args, kwargs)
        if config.current.arch != "cpu":
            return self._gpu().caller(*args)
        return self._slow_call(*args)

    def _gpu(self):
        """The kernel's launch plans on the current GPU target (targets/cuda.py)."""
        gpu = self.__dict__.get("_gpu_kernel")
        if gpu is None:
            from .targets.cuda import CudaKernel

            gpu = self._gpu_kernel = CudaKernel(self)
        return gpu

    def _bind(self, args, kwargs):
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise QuadrantsTypeError(f"kernel '{self.name}': {e}") from None
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def _make_caller(self):
        """Generate the kernel's ``__call__`` (see the module docstring).

        Its parameters carry the kernel's own names and defaults, so CPython binds keyword
        arguments; a missing or unknown argument takes :meth:`_bind`, which raises our error.
        On the CPU it keys the compiled instance on each ndarray's type fingerprint and each
        template value and calls the native entry point: one Python frame per call."""
        names = [f"a{k}" for k in range(len(self.params))]
        ns = {"Ndarray": Ndarray, "fingerprint": _dispatcher.compute_fingerprint, "template_key": template_key,
              "matrix_argument": matrix_argument, "instances": self._instances, "runtime_error": self._runtime_error,
              "config": config, "MISSING": _MISSING_ARG, "ndarray": np.ndarray, "host_array": host_array}
        sig = inspect.signature(self.fn)
        params = []
        for name, p in zip(names, sig.parameters.values()):
            if p.default is inspect.Parameter.empty:
                params.append(f"{p.name}=MISSING")
            else:
                ns[f"default_{name}"] = p.default
                params.append(f"{p.name}=default_{name}")
        real = [p.name for p in sig.parameters.values()]
        lines = [f"def __call__(__qd_self, {''.join(f'{p}, ' for p in params)}*__qd_extra, **__qd_unknown):",
                 f"    if __qd_extra or __qd_unknown{''.join(f' or {r} is MISSING' for r in real)}:",
                 f"        return __qd_self._bad_call(({''.join(f'{r}, ' for r in real)}), __qd_extra, __qd_unknown)"]
        lines += [f"    {n} = {r}" for n, r in zip(names, real)]
        lines += ["    if config.current.arch != 'cpu':",
                  f"        return __qd_self._gpu().caller({', '.join(names)})",
                  "    try:"]
        key_items, runtime = [], []
        for name, p in zip(names, self.params):
            if p.kind == "ndarray":
                # numpy arrays pass with one type check; anything else becomes the numpy view
                # of its memory (host_array)
                ns[f"where_{name}"] = _where(self, p)
                lines.append(f"        if type({name}) is not ndarray: "
                             f"{name} = {name}._arr if type({name}) is Ndarray else host_array({name}, where_{name})")
                key_items.append(f"fingerprint({name})")
                runtime.append(name)
            elif p.kind == "template":
                key_items.append(f"template_key({name})")
            elif p.kind == "matrix":  # a qd.Vector/Matrix of the annotated type (else TypeError)
                ns[f"type_{name}"] = p.nbtype
                lines.append(f"        {name} = matrix_argument({name}, type_{name})")
                runtime.append(name)
            else:
                # exact-type membership: anything else takes the slow path, which validates
                ns[f"ok_{name}"] = _INT_TYPES if isinstance(p.nbtype, types.Integer) else _NUMBER_TYPES
                lines.append(f"        if type({name}) not in ok_{name}: raise KeyError")
                runtime.append(name)
        key = "(" + "".join(f"{k}, " for k in key_items) + ")"
        lines += [f"        inst = instances[{key}]",
                  "    except (KeyError, TypeError, ValueError, NotImplementedError):",
                  f"        return __qd_self._slow_call({', '.join(names)})",
                  "    try:",
                  f"        return inst.entry({''.join(f'{r}, ' for r in runtime)}*inst.hidden)",
                  "    except Exception as e:",
                  f"        raise runtime_error(e, ({', '.join(names)}{',' if names else ''})) from None"]
        exec_generated("\n".join(lines) + "\n", f"call {self.qualname}", ns)
        return ns["__call__"]

    def _bad_call(self, values, extra, unknown):
        """A call with a missing, surplus or unknown argument: raise what binding says."""
        args = [v for v in values if v is not _MISSING_ARG] + list(extra)
        kwargs = dict(unknown)
        if len(args) < len(values) and not extra:   # keep keyword arguments CPython bound
            args = []
            kwargs.update({p.name: v for p, v in zip(self.params, values) if v is not _MISSING_ARG})
        return Kernel.__call__(self, *args, **kwargs)

    def _slow_call(self, *args):
        """A call the generated caller did not serve: check the arguments, compile if needed, run.
        It runs inside the caller's ``except KeyError`` (the cache miss): our errors leave without
        that KeyError as their context, so no "During handling of the above exception" precedes them."""
        try:
            with self._lock:
                args = self._host_args(args)
                types_, templates = self._argument_types(args)
                key = tuple(_dispatcher.compute_fingerprint(a) if p.kind == "ndarray" else template_key(a)
                            for p, a in zip(self.params, args) if p.kind in ("ndarray", "template"))
                args = tuple(matrix_argument(a, p.nbtype) if p.kind == "matrix" else a
                             for p, a in zip(self.params, args))
                inst = self._instances.get(key)
                if inst is None:
                    inst = self._compile(types_, templates)
                    self._instances[key] = inst
                self.last_instance = inst
        except QuadrantsError as e:
            e.__context__ = None
            raise
        runtime = [a for p, a in zip(self.params, args) if p.kind != "template"]
        try:
            return inst.entry(*runtime, *inst.hidden)
        except Exception as e:
            raise self._runtime_error(e, args) from None

    def _runtime_error(self, exc, args):
        if isinstance(exc, QuadrantsError):
            return exc
        if isinstance(exc, IndexError):
            return QuadrantsRuntimeError(f"kernel '{self.name}': out-of-bounds access: {exc}")
        if isinstance(exc, (TypeError, ValueError, OverflowError)):
            try:
                self._argument_types(self._host_args(args))
            except QuadrantsError as e:
                return e
            return QuadrantsTypeError(f"kernel '{self.name}': bad argument: {exc}")
        return QuadrantsRuntimeError(f"kernel '{self.name}' failed: {type(exc).__name__}: {exc}")

    # -- argument checks ------------------------------------------------------------------------------
    def _host_args(self, args):
        """The arguments with each ndarray argument as the numpy array the CPU target uses."""
        return tuple(host_array(a, _where(self, p)) if p.kind == "ndarray" else a for p, a in zip(self.params, args))

    def _argument_types(self, args):
        """(runtime param name -> Numba type, template name -> value); raises on bad arguments."""
        types_, templates = {}, {}
        debug = config.current.debug
        for p, a in zip(self.params, args):
            where = _where(self, p)
            if p.kind == "template":
                templates[p.name] = a
            elif p.kind == "scalar":
                if not isinstance(a, (int, float, bool, np.number, np.bool_)):
                    raise QuadrantsTypeError(f"{where}: expected a {p.nbtype} scalar, got {type(a).__name__}")
                if isinstance(p.nbtype, types.Integer) and isinstance(a, (float, np.floating)):
                    raise QuadrantsTypeError(f"{where}: expected an integer ({p.nbtype}), got float {a!r}")
                types_[p.name] = p.nbtype
            elif p.kind == "matrix":
                try:
                    matrix_argument(a, p.nbtype)
                except QuadrantsTypeError as e:
                    raise QuadrantsTypeError(f"{where}: {e}") from None
                types_[p.name] = p.nbtype
            else:
                if isinstance(a, Field):
                    raise QuadrantsTypeError(field_for_ndarray_message(where, a))
                types_[p.name] = _ndarray_type(where, p.annotation, a, debug)
        return types_, templates

    # -- compilation ---------------------------------------------------------------------------------
    def frontend_ir(self, tools):
        """The bytecode frontend's IR, per IR flavour (numba.core for CPU, numba.cuda.core)."""
        key = id(tools.ir)
        if key not in self._ir:
            self._ir[key] = _frontend(tools, self.fn, self.name)
        return self._ir[key]

    def _compile(self, param_types, templates) -> Instance:
        with profiler.compiling(self.qualname, "cpu"):  # compile records and log (profiler.py)
            return self._compile_cpu(param_types, templates)

    def _compile_cpu(self, param_types, templates) -> Instance:
        from .targets import cpu

        cfg = config.current.for_kernel(fuse=self.fuse, graph=self.graph)
        tools = IRTools.for_cpu()
        runtime_params = [p.name for p in self.params if p.kind != "template"]
        with profiler.stage("frontend"):
            func_ir = copy_ir(tools.ir, self.frontend_ir(tools))
        state = CompileState(tools=tools, func_ir=func_ir, kernel_name=self.name,
                             config=cfg, runtime_params=runtime_params, param_types=param_types,
                             template_values=templates, kernel_qualname=self.qualname,
                             returns_value=self.return_type is not None)
        take_pending()
        task_functions = []
        try:
            with profiler.stage("untyped passes"):
                run_untyped_pipeline(state, codegen_stages=cpu.CODEGEN_STAGES)
            with profiler.stage("task split"):
                driver, task_functions = cpu.build_driver(state, cfg.debug)
            argtypes = [param_types[n] for n in runtime_params] + [
                field_type(f, cfg.debug) for f in state.hidden]
            with profiler.stage("typing + lowering", llvm=True):
                cres = cpu.compile_driver(driver, argtypes, task_functions, cfg.debug)
            if cfg.cuda_compile_check:  # the CUDA code path on GPU-less machines (tests, CI)
                from .targets.cuda import compile_check

                compile_check(self, param_types, templates)
        except Exception as e:
            fallback = next((tf.error for tf in task_functions if isinstance(tf.error, QuadrantsError)), None)
            err = compile_error(self.name, e, param_types, cfg.raw_errors, fallback)
            if err is None:
                raise
            raise err from None
        self.compile_count += 1
        hidden = tuple(f._arr for f in state.hidden)
        key = artifact_key(self, param_types, templates, state.hidden, cfg, "cpu")
        entry = cres.entry_point
        if cfg.kernel_profiler:  # settled per instance: an unprofiled call path is unchanged
            entry = profiler.timed_cpu_entry(self.qualname, entry, cpu.task_clocks(cres, task_functions))
        return Instance(entry, hidden, list(state.tasks), cres, task_functions, state, key)

    # -- introspection ------------------------------------------------------------------------------------
    def tasks(self, *args, **kwargs):
        """The Tasks of the instance these arguments select (compiling it if needed)."""
        if kwargs or len(args) != len(self.params):
            args = self._bind(args, kwargs)
        if config.current.arch != "cpu":
            return list(self._gpu().plan_for(args).tasks)
        args = self._host_args(args)
        types_, templates = self._argument_types(args)
        key = tuple(_dispatcher.compute_fingerprint(a) if p.kind == "ndarray" else template_key(a)
                    for p, a in zip(self.params, args) if p.kind in ("ndarray", "template"))
        with self._lock:
            inst = self._instances.get(key)
            if inst is None:
                inst = self._instances[key] = self._compile(types_, templates)
        return list(inst.tasks)

    def __repr__(self):
        return f"<qd.kernel {self.qualname}>"

    def __deepcopy__(self, memo):
        return self


_INT_TYPES = frozenset({int, bool, np.bool_, np.int8, np.int16, np.int32, np.int64,
                        np.uint8, np.uint16, np.uint32, np.uint64})
_NUMBER_TYPES = _INT_TYPES | {float, np.float16, np.float32, np.float64}


def template_key(value):
    if isinstance(value, (int, float, bool, str, type(None))):
        return (type(value), value)
    return id(value)


def field_type(f: ArrayData, debug: bool) -> FieldType:
    return FieldType(f.dtype, len(f.shape), f.elem_type, "C", checked=debug,
                     kind="field" if not isinstance(f, Ndarray) else "ndarray")


def field_for_ndarray_message(where: str, field) -> str:
    return (f"{where}: got the field {field!r}, but a qd.types.ndarray() parameter takes a numpy array or a "
            "qd.ndarray; fields are global: use the field in the kernel directly, or declare the parameter "
            "as qd.template() to pass fields")


def _where(kernel, param) -> str:
    return f"kernel '{kernel.name}', argument '{param.name}'"


_DL_CPU = 1  # DLPack device type of host memory


def host_array(a, where: str) -> np.ndarray:
    """An ndarray argument as the numpy array a CPU kernel uses, sharing its memory, so that
    the kernel's writes are visible in ``a``: a numpy array itself, a qd.ndarray's buffer, a CPU
    torch tensor's numpy view, and for any other object the numpy array over the memory its
    ``__array_interface__`` or DLPack capsule describes (read-only memory stays read-only).
    Anything else, or memory that is not on the CPU, is our error naming the argument."""
    if isinstance(a, np.ndarray):
        return a
    if isinstance(a, Ndarray):
        return a._arr
    if type(a).__module__.startswith("torch") and isinstance(a, sys.modules["torch"].Tensor):
        try:
            return a.numpy()            # the common case first: a CPU tensor without autograd
        except (TypeError, RuntimeError):
            return _torch_host_array(a, where)
    if hasattr(a, "__array_interface__"):
        return np.asarray(a)
    if hasattr(a, "__dlpack__"):
        device = a.__dlpack_device__()[0] if hasattr(a, "__dlpack_device__") else _DL_CPU
        if int(device) != _DL_CPU:
            raise QuadrantsTypeError(f"{where}: a DLPack array on device type {int(device)} (not the CPU) cannot "
                                     "be passed to a kernel on qd.cpu; use qd.init(arch=qd.cuda)")
        try:
            return np.from_dlpack(a)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            raise QuadrantsTypeError(f"{where}: cannot use this DLPack array as an ndarray ({e})") from None
    if hasattr(a, "__cuda_array_interface__"):
        raise QuadrantsTypeError(f"{where}: a CUDA array ({type(a).__name__}) cannot be passed to a kernel on "
                                 "qd.cpu; use qd.init(arch=qd.cuda)")
    if isinstance(a, Field):
        raise QuadrantsTypeError(field_for_ndarray_message(where, a))
    raise QuadrantsTypeError(f"{where}: expected an ndarray (numpy array, qd.ndarray, CPU torch tensor, or an "
                             f"object with __array_interface__ or __dlpack__), got {type(a).__name__}")


def _torch_host_array(a, where: str) -> np.ndarray:
    """A torch tensor ``.numpy()`` refused: one that requires grad (its data is used, as for
    any tensor), or one that cannot be a CPU kernel's argument."""
    if a.device.type != "cpu":
        raise QuadrantsTypeError(f"{where}: a torch tensor on '{a.device}' cannot be passed to a kernel on "
                                 "qd.cpu; use qd.init(arch=qd.cuda) or pass tensor.cpu()")
    try:
        return a.detach().numpy()
    except (TypeError, RuntimeError) as e:
        raise QuadrantsTypeError(f"{where}: this torch tensor has no numpy view ({e})") from None


def _ndarray_type(where, spec, a, debug):
    """The Numba type of a (host) ndarray argument; raises our error on a dtype, ndim or element
    shape that does not match the annotation ``spec``."""
    from numba.np.numpy_support import from_dtype

    try:
        dtype = from_dtype(a.dtype)
    except NotImplementedError:
        raise QuadrantsTypeError(f"{where}: unsupported dtype {a.dtype}") from None
    elem = spec.elem_type
    eshape = element_shape(elem)
    ndim = a.ndim - len(eshape)
    if eshape and a.shape[ndim:] != eshape:
        raise QuadrantsTypeError(f"{where}: expected elements of shape {eshape}, got array of shape {a.shape}")
    if spec.dtype is not None and dtype != spec.dtype:
        raise QuadrantsTypeError(f"{where}: expected dtype {spec.dtype}, got {dtype}; convert a numpy array "
                                 f"with .astype(np.{np.dtype(str(spec.dtype)).type.__name__})")
    if spec.ndim is not None and ndim != spec.ndim:
        raise QuadrantsTypeError(f"{where}: expected ndim={spec.ndim}, got an array with ndim={ndim}")
    layout = "C" if a.flags.c_contiguous else "A"
    readonly = not a.flags.writeable
    if elem is not None:
        return FieldType(dtype, ndim, elem, layout, readonly=readonly, checked=debug, kind="ndarray")
    return types.Array(dtype, ndim, layout, readonly=readonly)


def _source_loc(exc):
    """The innermost user statement Numba was typing or lowering when ``exc`` (not a Numba error,
    so Numba let it through without a location) was raised: the ``loc`` local of its constraint-
    propagation frames, or the statement (``inst``) of its lowering frames (Numba's or numba-cuda's),
    skipping statements of qd_numba's, Numba's and numba-cuda's own code."""
    import os

    import numba
    from numba.core import lowering, typeinfer

    compiler_files = {typeinfer.__file__: "loc", lowering.__file__: "inst"}
    internal = [os.path.dirname(numba.__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep]
    if "numba.cuda.core.typeinfer" in sys.modules:
        compiler_files[sys.modules["numba.cuda.core.typeinfer"].__file__] = "loc"
        internal.append(os.path.dirname(sys.modules["numba.cuda"].__file__) + os.sep)
    if "numba.cuda.core.lowering" in sys.modules:
        compiler_files[sys.modules["numba.cuda.core.lowering"].__file__] = "inst"
    loc = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        local = compiler_files.get(frame.f_code.co_filename)
        if local is not None:
            candidate = frame.f_locals.get(local)
            candidate = getattr(candidate, "loc", None) if local == "inst" else candidate
            filename = getattr(candidate, "filename", None)
            if filename and hasattr(candidate, "line") \
                    and not os.path.abspath(filename).startswith(tuple(internal)):
                loc = candidate
        tb = tb.tb_next
    return loc


def _raised_by_codegen(exc) -> bool:
    """Raised by qd_numba's typing or lowering code (our Numba extensions), which knows no kernel
    or source line, rather than by a pass (whose errors are located where they are raised)."""
    import os

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    here = os.path.dirname(os.path.abspath(__file__))
    where = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return where.startswith((os.path.join(here, "lowering") + os.sep, os.path.join(here, "typing") + os.sep))


_REPORTED_FILE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _reported_loc(text: str):
    """The user's source location that a Numba report names (numba-cuda's reports carry it only
    in their text): the last ``File "...", line N`` outside Numba and qd_numba, or None."""
    import numba
    from numba.core import ir as numba_ir

    internal = (os.path.dirname(numba.__file__), os.path.dirname(os.path.abspath(__file__)))
    found = None
    for m in _REPORTED_FILE.finditer(_ANSI_ESCAPE.sub("", text)):
        path = m.group("file")
        if not os.path.abspath(path).startswith(internal) and "site-packages" not in path:
            found = numba_ir.Loc(path, int(m.group("line")))
    return found


def is_numba_error(e) -> bool:
    """A Numba error, from Numba's CPU pipeline or numba-cuda's own copy of it."""
    if isinstance(e, numba_errors.NumbaError):
        return True
    cuda_errors = sys.modules.get("numba.cuda.core.errors")
    return cuda_errors is not None and isinstance(e, cuda_errors.NumbaError)


def _is_numba_error_class(e, name: str) -> bool:
    """``e`` is an instance of Numba's error class ``name`` (of either copy of Numba's errors)."""
    return is_numba_error(e) and any(c.__name__ == name for c in type(e).__mro__)


def compile_error(kernel_name, e, param_types, raw_errors: bool, pending_fallback=None):
    """The exception to raise for ``e``, raised while compiling ``kernel_name`` on any target,
    or None to let ``e`` through unchanged. Our errors raised inside Numba's typing or lowering get
    the kernel name and source line; Numba's become ours (``QD_RAW_ERRORS`` keeps them)."""
    if isinstance(e, QuadrantsError):
        # raised inside Numba's typing, which let it through, or by our lowering: not located yet
        if take_pending() is e or _raised_by_codegen(e):
            return located(type(e), str(e), kernel_name, _source_loc(e))
        return None
    if raw_errors or not is_numba_error(e):
        return None
    return _wrap_numba_error(kernel_name, e, take_pending() or pending_fallback, param_types)


def _wrap_numba_error(kernel_name, e, pending, param_types=None):
    text = str(e)
    loc = getattr(e, "loc", None) or _reported_loc(text) or _source_loc(e)
    if pending is not None:
        return located(type(pending), str(pending), kernel_name, loc)
    readonly = [name for name, ty in (param_types or {}).items() if is_readonly(ty)]
    if readonly and "readonly array" in text:  # a write the CheckReadonlyWrites pass cannot see (a callee)
        names = ", ".join(f"'{n}'" for n in readonly)
        return located(QuadrantsTypeError, f"read-only array argument {names} (numpy flags.writeable is False) "
                       "is written to", kernel_name, loc)
    report = numba_report(text)
    if "qd.field(" in report and "ndim=0" in report:
        report += "\n(a 0-d field holds one value: read and write it as x[None], e.g. x[None] += 1)"
    if _is_numba_error_class(e, "TypingError"):
        err = located(QuadrantsTypeError, report, kernel_name, loc)
    elif _is_numba_error_class(e, "UnsupportedError"):
        err = located(QuadrantsSyntaxError, f"unsupported construct: {report}", kernel_name, loc)
    else:
        err = located(QuadrantsCompilationError, report, kernel_name, loc)
    return type(err)(f"{err}\n(set QD_RAW_ERRORS=1 for Numba's full report)")


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_NUMBA_NOISE = re.compile(r"(Failed in .* mode pipeline|During: |raised from |<source elided>)")
_NUMBA_SOURCE = re.compile(r'File ".*", line \d+:$')
_NUMBA_NO_IMPL = re.compile(r"No implementation of function .* found for signature:\s*>>> (.*?)\s*There are \d+ "
                            r"candidate implementations", re.S)
_NUMBA_REASON = re.compile(r"raised a specific error:\s*\n\s*(?:\w+(?:Error|Exception): )?(.*)")


def numba_report(text: str) -> str:
    """The part of a Numba error report that speaks about the user's code: without the pipeline
    stages, the compiler's statements and Numba's source excerpt (ours replaces it); a failed
    overload resolution becomes "cannot call f(types): innermost reason". Terminal colours
    (numba-cuda highlights its reports) are removed first."""
    lines, in_source = [], False
    for line in _ANSI_ESCAPE.sub("", text).splitlines():
        stripped = line.strip()
        if _NUMBA_SOURCE.match(stripped):
            in_source = True
        elif in_source:
            in_source = bool(stripped)
        elif not _NUMBA_NOISE.match(stripped):
            lines.append(line.rstrip())
    core = "\n".join(lines).strip()
    core = re.sub(r"(Type of variable '.*' cannot be determined), operation: .*", r"\1", core)
    no_impl = _NUMBA_NO_IMPL.search(core)
    if no_impl is None:
        return re.sub(r"\n\s*\n+", "\n", core) or "type error"
    reasons = _NUMBA_REASON.findall(core)
    reason = f": {reasons[-1].strip()}" if reasons else ""
    return f"cannot call {no_impl.group(1).strip()}{reason}"


def kernel(fn=None, *, graph: bool = False, fuse=None):
    """Decorator: a kernel whose top-level for loops run in parallel."""
    if fn is None:
        return lambda f: Kernel(f, graph=graph, fuse=fuse)
    return Kernel(fn, graph=graph, fuse=fuse)
