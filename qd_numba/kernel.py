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
import sys
import threading
import weakref

import numpy as np
from numba import _dispatcher
from numba.core import errors as numba_errors
from numba.core import types

from . import config, dtypes
from .errors import (
    QuadrantsCompilationError,
    QuadrantsError,
    QuadrantsRuntimeError,
    QuadrantsSyntaxError,
    QuadrantsTypeError,
    located,
    take_pending,
)
from .field import ArrayData, Ndarray, element_shape
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
    except numba_errors.NumbaError as e:
        raise QuadrantsSyntaxError(f"in '{name}': {e}") from None


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
              "config": config, "MISSING": _MISSING_ARG}
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
                lines.append(f"        if type({name}) is Ndarray: {name} = {name}._arr")
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
                  "    except (KeyError, TypeError, ValueError):",
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
        with self._lock:
            args = tuple(a._arr if isinstance(a, Ndarray) else a for a in args)
            types_, templates = self._argument_types(args)
            key = tuple(_dispatcher.compute_fingerprint(a) if p.kind == "ndarray" else template_key(a)
                        for p, a in zip(self.params, args) if p.kind in ("ndarray", "template"))
            args = tuple(matrix_argument(a, p.nbtype) if p.kind == "matrix" else a for p, a in zip(self.params, args))
            inst = self._instances.get(key)
            if inst is None:
                inst = self._compile(types_, templates)
                self._instances[key] = inst
            self.last_instance = inst
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
                self._argument_types(tuple(a._arr if isinstance(a, Ndarray) else a for a in args))
            except QuadrantsError as e:
                return e
            return QuadrantsTypeError(f"kernel '{self.name}': bad argument: {exc}")
        return QuadrantsRuntimeError(f"kernel '{self.name}' failed: {type(exc).__name__}: {exc}")

    # -- argument checks ------------------------------------------------------------------------------
    def _argument_types(self, args):
        """(runtime param name -> Numba type, template name -> value); raises on bad arguments."""
        types_, templates = {}, {}
        debug = config.current.debug
        for p, a in zip(self.params, args):
            where = f"kernel '{self.name}', argument '{p.name}'"
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
        from .targets import cpu

        cfg = config.current.for_kernel(fuse=self.fuse, graph=self.graph)
        tools = IRTools.for_cpu()
        runtime_params = [p.name for p in self.params if p.kind != "template"]
        func_ir = copy_ir(tools.ir, self.frontend_ir(tools))
        state = CompileState(tools=tools, func_ir=func_ir, kernel_name=self.name,
                             config=cfg, runtime_params=runtime_params, param_types=param_types,
                             template_values=templates, kernel_qualname=self.qualname,
                             returns_value=self.return_type is not None)
        take_pending()
        task_functions = []
        try:
            run_untyped_pipeline(state, codegen_stages=cpu.CODEGEN_STAGES)
            driver, task_functions = cpu.build_driver(state, cfg.debug)
            argtypes = [param_types[n] for n in runtime_params] + [
                field_type(f, cfg.debug) for f in state.hidden]
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
        return Instance(cres.entry_point, hidden, list(state.tasks), cres, task_functions, state, key)

    # -- introspection ------------------------------------------------------------------------------------
    def tasks(self, *args, **kwargs):
        """The Tasks of the instance these arguments select (compiling it if needed)."""
        if kwargs or len(args) != len(self.params):
            args = self._bind(args, kwargs)
        if config.current.arch != "cpu":
            return list(self._gpu().plan_for(args).tasks)
        args = tuple(a._arr if isinstance(a, Ndarray) else a for a in args)
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


def _ndarray_type(where, spec, a, debug):
    if not isinstance(a, np.ndarray):
        raise QuadrantsTypeError(f"{where}: expected an ndarray (numpy array or qd.ndarray), got {type(a).__name__}")
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
        raise QuadrantsTypeError(f"{where}: expected dtype {spec.dtype}, got {dtype}")
    if spec.ndim is not None and ndim != spec.ndim:
        raise QuadrantsTypeError(f"{where}: expected ndim={spec.ndim}, got an array with ndim={ndim}")
    layout = "C" if a.flags.c_contiguous else "A"
    readonly = not a.flags.writeable
    if elem is not None:
        return FieldType(dtype, ndim, elem, layout, readonly=readonly, checked=debug, kind="ndarray")
    return types.Array(dtype, ndim, layout, readonly=readonly)


def _typing_loc(exc):
    """The innermost statement Numba's type inference was resolving when ``exc`` (not a Numba
    error, so Numba let it through without a location) was raised: the ``loc`` local of its
    constraint-propagation frames (Numba's or numba-cuda's), skipping statements of qd_numba's,
    Numba's and numba-cuda's own code."""
    import os

    import numba
    from numba.core import typeinfer

    typeinfer_files = {typeinfer.__file__}
    internal = [os.path.dirname(numba.__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep]
    cuda_typeinfer = sys.modules.get("numba.cuda.core.typeinfer")
    if cuda_typeinfer is not None:
        typeinfer_files.add(cuda_typeinfer.__file__)
        internal.append(os.path.dirname(sys.modules["numba.cuda"].__file__) + os.sep)
    loc = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename in typeinfer_files:
            candidate = frame.f_locals.get("loc")
            filename = getattr(candidate, "filename", None)
            if filename and hasattr(candidate, "line") \
                    and not os.path.abspath(filename).startswith(tuple(internal)):
                loc = candidate
        tb = tb.tb_next
    return loc


def is_numba_error(e) -> bool:
    """A Numba error, from Numba's CPU pipeline or numba-cuda's own copy of it."""
    if isinstance(e, numba_errors.NumbaError):
        return True
    cuda_errors = sys.modules.get("numba.cuda.core.errors")
    return cuda_errors is not None and isinstance(e, cuda_errors.NumbaError)


def compile_error(kernel_name, e, param_types, raw_errors: bool, pending_fallback=None):
    """The exception to raise for ``e``, raised while compiling ``kernel_name`` on any target,
    or None to let ``e`` through unchanged. Our errors raised inside Numba's typing get the
    kernel name and source line; Numba's become ours (``QD_RAW_ERRORS`` keeps them)."""
    if isinstance(e, QuadrantsError):
        if take_pending() is e:  # raised inside Numba's typing, which let it through: not located yet
            return located(type(e), str(e), kernel_name, _typing_loc(e))
        return None
    if raw_errors or not is_numba_error(e):
        return None
    return _wrap_numba_error(kernel_name, e, take_pending() or pending_fallback, param_types)


def _wrap_numba_error(kernel_name, e, pending, param_types=None):
    text = str(e)
    loc = getattr(e, "loc", None)
    if pending is not None:
        return located(type(pending), str(pending), kernel_name, loc)
    readonly = [name for name, ty in (param_types or {}).items() if is_readonly(ty)]
    if readonly and "readonly array" in text:  # a write the CheckReadonlyWrites pass cannot see (a callee)
        names = ", ".join(f"'{n}'" for n in readonly)
        return QuadrantsTypeError(f"in kernel '{kernel_name}': read-only array argument {names} "
                                  f"(numpy flags.writeable is False) is written to\n{text}")
    if isinstance(e, numba_errors.TypingError):
        first = text.strip().splitlines()[0] if text.strip() else "type error"
        return QuadrantsTypeError(f"in kernel '{kernel_name}': {first}\n{text}")
    if isinstance(e, numba_errors.UnsupportedError):
        return QuadrantsSyntaxError(f"in kernel '{kernel_name}': unsupported construct: {text}")
    return QuadrantsCompilationError(f"in kernel '{kernel_name}': {text}")


def kernel(fn=None, *, graph: bool = False, fuse=None):
    """Decorator: a kernel whose top-level for loops run in parallel."""
    if fn is None:
        return lambda f: Kernel(f, graph=graph, fuse=fuse)
    return Kernel(fn, graph=graph, fuse=fuse)
