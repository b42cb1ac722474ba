"""``@qd.real_func``: a function that kernels call instead of inlining, so it may recurse.

Where a ``@qd.func`` is inlined into its callers (passes/inline_funcs.py), a real function is
compiled once per target as a function of its own, with the signature its annotations give:

* CPU: a Numba function (``numba.njit``) compiled for exactly that signature;
* CUDA: a numba-cuda device function compiled for it (a call, not inlined code; recursion needs
  the device stack, whose size ``qd.init(cuda_stack_limit=...)`` sets).

Numba types the name of a real function, wherever it appears (a kernel, another real function,
its own body), as that compiled function: ``typeof`` gives the target's dispatcher (CPU here;
CUDA in ``targets/cuda/compile.install_cuda_extensions``). Compiling is disabled after the one
signature, so a call converts its arguments to the parameter types (``qd.i32`` given 1.5 gets 1)
and the returned value is converted to the return annotation, as Quadrants does.

Rules (Quadrants'): every parameter is annotated with a scalar type, a vector/matrix type,
``qd.template()`` (a field, or any field/ndarray) or ``qd.types.ndarray(...)``; the return
annotation is a scalar or vector/matrix type or absent (no value). A field or ndarray parameter is
passed by reference: the function reads and writes the caller's data (``x[i] = v`` in the body is
a plain store, ``qd.atomic_*`` is not available there). A function with such parameters is
compiled once per type of its data arguments (the scalars are converted, so they never add a
compile); an ndarray argument whose dtype or ndim differs from the annotation is our error. The
body is compiled by Numba as a ``@numba.njit`` function is: it may use arithmetic, ``math``,
qd_numba's math functions, other real functions and njit functions; global fields, ``@qd.func``
calls and ``qd.static`` belong to kernels and inlined funcs. A real function is not
differentiated (a gradient kernel calling one is an error). Mutual recursion compiles on the
CPU; numba-cuda cannot link a call to a function still being compiled other than itself, so on
CUDA it is our error.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types as pytypes
import weakref

from numba.core import types
from numba.core.typing.typeof import typeof_impl
from numba.extending import overload

from .. import config
from ..errors import QuadrantsError, QuadrantsSyntaxError, QuadrantsTypeError, typing_error
from ..field import Field
from ..typing.field import FieldType
from ..typing.matrix import MatrixType
from .args import NdarraySpec, evaluate_annotation, param_kind
from .diagnostics import is_numba_error, numba_report

_REAL_FUNCS: weakref.WeakSet = weakref.WeakSet()
_DATA_KINDS = ("template", "ndarray")    # parameters passed by reference (fields, ndarrays)


def _value_type(annotation, default_ip, default_fp):
    """The Numba type a real function's parameter or return annotation stands for, or None."""
    if annotation is int:
        return default_ip
    if annotation is float:
        return default_fp
    if annotation is bool:
        return types.boolean
    if isinstance(annotation, (types.Number, types.Boolean, MatrixType)):
        return annotation
    return None


class QdRealFunc:
    """``@qd.real_func``: compiled once per target and called (recursion allowed)."""

    targetoptions = {"inline": "always"}    # Numba's IR inliner inlines ``py_func`` (the adapter)

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__qualname__
        sig = inspect.signature(fn)
        self.params = []
        for p in sig.parameters.values():
            annotation = evaluate_annotation(fn, self.name, f"parameter '{p.name}'", p.annotation)
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) \
                    or (_value_type(annotation, types.int32, types.float32) is None
                        and param_kind(annotation) not in _DATA_KINDS):
                raise QuadrantsSyntaxError(
                    f"qd.real_func '{self.name}': parameter '{p.name}' needs a scalar, vector/matrix, "
                    f"qd.template() or qd.types.ndarray() annotation (e.g. {p.name}: qd.f32)"
                    + (f", got {annotation!r}" if annotation is not inspect.Parameter.empty else ""))
            if param_kind(annotation) == "ndarray" and not isinstance(annotation, NdarraySpec):
                annotation = NdarraySpec()
            self.params.append((p.name, annotation))
        self.takes_data = any(param_kind(a) in _DATA_KINDS for _, a in self.params)
        returns = evaluate_annotation(fn, self.name, "the return value", sig.return_annotation)
        if returns is inspect.Signature.empty:
            returns = None
        if returns is not None and _value_type(returns, types.int32, types.float32) is None:
            raise QuadrantsSyntaxError(
                f"qd.real_func '{self.name}': return annotation {returns!r} is not a type qd can return "
                "(a scalar type such as qd.f32, or qd.types.vector/matrix(...))")
        self.returns = returns
        self._dispatchers = {}
        self._adapter = None
        self._data_checks = None
        self._compiled_marker = CompiledRealFunc(self)
        _REAL_FUNCS.add(self)

    def signature(self) -> types.Signature:
        """The Numba signature of the annotations, ``int``/``float`` as the current config says;
        a field/ndarray parameter is ``types.Any`` (its type comes with each call)."""
        cfg = config.current
        args = [types.Any if param_kind(a) in _DATA_KINDS else _value_type(a, cfg.default_ip, cfg.default_fp)
                for _, a in self.params]
        ret = types.none if self.returns is None else _value_type(self.returns, cfg.default_ip, cfg.default_fp)
        return ret(*args)

    @property
    def py_func(self):
        """The adapter: converts each argument to its parameter type and calls the compiled
        function. Numba's IR inliner (``targetoptions`` says "always") puts it in place of every
        call, on both targets, so that a recursive call is a call of the function itself."""
        if self._adapter is None:
            sig = self.signature()
            names = [name for name, _ in self.params]
            ns = {"impl": self._compiled_marker}
            converted = []
            checks = self.data_checks()
            for k, (name, ty) in enumerate(zip(names, sig.args)):
                ns[f"T{k}"] = ty
                if name in checks:      # a field or ndarray: by reference, its type checked
                    ns[f"T{k}"] = checks[name]
                    converted.append(f"T{k}({name})")
                else:
                    converted.append(name if isinstance(ty, MatrixType) else f"T{k}({name})")
            src = f"def {self.fn.__name__}({', '.join(names)}):\n    return impl({', '.join(converted)})\n"
            exec(compile(src, f"<qd.real_func {self.name}>", "exec"), ns)
            self._adapter = ns[self.fn.__name__]
        return self._adapter

    def data_checks(self) -> dict:
        """Parameter name -> a function returning its argument whose compiled form checks it is a
        field or ndarray of the annotation (our error otherwise), for each field/ndarray
        parameter. The adapter applies them; passes/inline_funcs.py also applies them at a
        kernel's call, so that the error names the calling line."""
        if self._data_checks is None:
            self._data_checks = {name: _data_argument_check(f"qd.real_func '{self.name}', argument '{name}'", a)
                                 for name, a in self.params if param_kind(a) in _DATA_KINDS}
        return self._data_checks

    def dispatcher(self, target: str):
        """What this function's name types as on ``target`` ("cpu" or "cuda") where the adapter
        was not inlined: the adapter as a Numba function of that target."""
        key = ("adapter", target)
        if key not in self._dispatchers:
            self._dispatchers[key] = _make_dispatcher(target, self.py_func, inline="always")
        return self._dispatchers[key]

    def compiled(self, target: str):
        """The function compiled on ``target`` for the annotations' signature (once; further
        compiles are disabled, so calls must convert their arguments: the adapter does)."""
        impl = self._dispatchers.get(target)
        if impl is None:
            sig = self.signature()
            # stored before compiling: the body's recursive calls reach it through the adapter
            impl = self._dispatchers[target] = _make_dispatcher(target, self._body(sig.return_type))
            if self.takes_data:
                return impl     # compiled at each call's typing, once per type of the data arguments
            try:
                if target == "cuda":
                    impl._can_compile = False
                    impl.compile_device(sig.args, sig.return_type)
                else:
                    impl.compile(sig)
                    impl.disable_compile()
            except Exception as e:
                del self._dispatchers[target]
                if target == "cuda" and "insert_unresolved_ref" in str(e):
                    # numba-cuda links a call only to a compiled function or to the function itself
                    raise typing_error(QuadrantsSyntaxError(
                        f"qd.real_func '{self.name}' calls a real function that is still compiling: mutual "
                        "recursion between real functions is not supported on CUDA (a function may call "
                        "itself)")) from None
                # numba-cuda's typing of a global it cannot type (a field) fails with an AttributeError
                cuda_global = target == "cuda" and isinstance(e, AttributeError)
                if isinstance(e, QuadrantsError) or not (is_numba_error(e) or cuda_global):
                    raise
                # raised inside the caller's typing, which would report an untyped global
                reason = numba_report(str(e))
                if cuda_global:     # numba-cuda's message does not say which global
                    fields = [n for n in self.fn.__code__.co_names if isinstance(self.fn.__globals__.get(n), Field)]
                    reason = f"global {', '.join(map(repr, fields))} is a qd field ({e})" if fields else reason
                raise typing_error(QuadrantsTypeError(
                    f"qd.real_func '{self.name}' does not compile: {reason}\n(its body may use "
                    "what @numba.njit code may: no fields, qd.func calls or qd.static)")) from None
        return impl

    def _body(self, return_type):
        """The function Numba compiles: the user's, each ``return v`` made ``return R(v)`` for the
        return type R. Numba types a recursive call by the body's other return values, so they
        must have the declared type already (``n`` and ``fib(n-1) + fib(n-2)``: i32 and i64
        otherwise). Without source (``exec``'d code) the function is compiled as written."""
        if return_type is types.none or isinstance(return_type, MatrixType):
            return _in_a_module(self.fn)
        try:
            source = textwrap.dedent(inspect.getsource(self.fn))
        except (OSError, TypeError):
            return _in_a_module(self.fn)
        tree = ast.parse(source)
        fdef = tree.body[0]
        if not isinstance(fdef, ast.FunctionDef):
            return _in_a_module(self.fn)
        # renamed: under its own name the body's recursive calls would reach this copy, not us
        fdef.name, fdef.decorator_list, fdef.returns = "__qd_body", [], None
        for a in fdef.args.args:
            a.annotation = None
        _CastReturns().visit(fdef)
        freevars = self.fn.__code__.co_freevars
        make = ast.FunctionDef(
            name="__qd_make", body=[fdef, ast.Return(ast.Name(fdef.name, ast.Load()))], decorator_list=[],
            args=ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in ("__qd_return_type", *freevars)],
                               kwonlyargs=[], kw_defaults=[], defaults=[]))
        module = ast.fix_missing_locations(ast.Module(body=[ast.copy_location(make, fdef)], type_ignores=[]))
        ast.increment_lineno(module, self.fn.__code__.co_firstlineno - 1)
        ns = {}
        exec(compile(module, self.fn.__code__.co_filename, "exec"), self.fn.__globals__, ns)
        cells = [c.cell_contents for c in self.fn.__closure__ or ()]
        return _in_a_module(ns["__qd_make"](return_type, *cells))

    def forget(self) -> None:
        """Drop the compiled functions (``qd.init``: another default_fp/default_ip or arch)."""
        self._dispatchers = {}
        self._adapter = None

    def __call__(self, *args, **kwargs):
        raise QuadrantsSyntaxError(f"qd.real_func '{self.name}' can only be called from a kernel, a qd.func or "
                                   "another qd.real_func")

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return f"<qd.real_func {self.name}>"


def _in_a_module(fn):
    """``fn``, or a copy of it named as being of this module when its own module is not imported
    (code exec'd in a plain namespace): numba-cuda names such a function "<dynamic>" in one place
    and by ``__module__`` in another, and a recursive call would not find itself."""
    if fn.__module__ in sys.modules:
        return fn
    copy = pytypes.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__module__ = __name__
    return copy


class _CastReturns(ast.NodeTransformer):
    def visit_Return(self, node):
        if node.value is not None:
            node.value = ast.copy_location(
                ast.Call(ast.Name("__qd_return_type", ast.Load()), [node.value], []), node.value)
        return node

    def visit_FunctionDef(self, node):   # the outer def only: nested functions keep their returns
        if getattr(self, "_seen", False):
            return node
        self._seen = True
        self.generic_visit(node)
        return node

    visit_Lambda = visit_AsyncFunctionDef = lambda self, node: node


class CompiledRealFunc:
    """The adapter's name for the compiled function: typed per target (CPU here, CUDA in
    ``targets/cuda/compile.install_cuda_extensions``)."""

    def __init__(self, func: QdRealFunc):
        self.func = func
        self.fn = func.fn       # the body the offline cache keys on


@typeof_impl.register(QdRealFunc)
def _typeof_real_func(val, c):
    return types.Dispatcher(val.dispatcher("cpu"))


@typeof_impl.register(CompiledRealFunc)
def _typeof_compiled(val, c):
    return types.Dispatcher(val.func.compiled("cpu"))


def _data_argument_check(where: str, spec):
    """A function returning its argument (a field or ndarray), whose compiled form checks the
    argument's type against the parameter's annotation ``spec`` (our error naming ``where``)."""
    def check(value):
        return value

    @overload(check)
    def _check(value):
        if not isinstance(value, (types.Array, FieldType)):
            raise typing_error(QuadrantsTypeError(f"{where}: expected a field or ndarray, got {value}"))
        if isinstance(spec, NdarraySpec):
            dtype = value.value_dtype if isinstance(value, FieldType) else value.dtype
            if spec.dtype is not None and dtype != spec.dtype:
                raise typing_error(QuadrantsTypeError(f"{where}: expected dtype {spec.dtype}, got {dtype}"))
            if spec.ndim is not None and value.ndim != spec.ndim:
                raise typing_error(QuadrantsTypeError(f"{where}: expected ndim={spec.ndim}, got {value.ndim}"))
        return lambda value: value

    return check


def _make_dispatcher(target: str, fn, **options):
    if target == "cuda":
        from numba.cuda.dispatcher import CUDADispatcher

        return CUDADispatcher(fn, {"device": True, "debug": False, "opt": True, **options})
    from numba import njit

    return njit(**options)(fn)


def forget_real_funcs() -> None:
    for f in list(_REAL_FUNCS):
        f.forget()


def real_func(fn):
    """Decorator: a function kernels call (not inlined): typed parameters and return, recursion
    allowed. See the module docstring for what its body may use."""
    return QdRealFunc(fn)
