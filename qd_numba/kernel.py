"""``@qd.kernel``: the kernel object, its parameters, and how a call reaches a target.

A kernel knows no target. Its parameters come from its annotations (frontend/args.py); a call
goes to the current arch's :class:`~qd_numba.targets.base.KernelBackend`, which owns the
kernel's compiled instances there. Each kernel is an instance of its own ``Kernel`` subclass,
whose ``__call__`` is the backend's generated call path (named as the kernel's parameters, so
CPython binds keyword arguments and defaults; one Python frame to the launch). Until a backend
is installed, and whenever the generated path meets a call it does not serve, the generic
:meth:`Kernel.__call__` binds the arguments and hands them to the backend's checked path.
``qd.init`` drops every kernel's backend (:func:`forget_compiled`): a new arch or configuration
compiles anew.
"""

from __future__ import annotations

import inspect
import threading
import weakref

from . import config, dtypes, runtime, streams
from . import graph as graph_rules
from .errors import QuadrantsError, QuadrantsRuntimeError, QuadrantsSyntaxError, QuadrantsTypeError
from .field import Ndarray
from .frontend.args import Param, evaluate_annotation, grad_parameter, param_kind, return_type_of
from .frontend.objects import KernelObject, QdFunc, cached_frontend_ir, func  # noqa: F401  (qd.func lives with the objects passes see)
from .frontend.real_func import forget_real_funcs
from .targets.base import target_for

_KERNELS: weakref.WeakSet = weakref.WeakSet()
MISSING_ARG = object()  # a kernel parameter without a value in a call
_call_wrapper = None    # qd.ad.Tape: wraps each kernel's call path while it records (ad.py)


def wrap_calls(wrapper) -> None:
    """Wrap every kernel's call path with ``wrapper(kernel, call) -> call`` (None: unwrap).
    Outside a Tape no call pays for it: the wrapper is installed on the kernels' classes."""
    global _call_wrapper
    _call_wrapper = wrapper
    for kernel in list(_KERNELS):
        kernel._install_caller()


def forget_compiled() -> None:
    """Drop every kernel's compiled instances and launch plans (``qd.init`` does: a new
    configuration, e.g. ``debug`` or another arch, changes the code kernels compile to)."""
    for kernel in list(_KERNELS):
        kernel._forget()
    forget_real_funcs()


runtime.on_init(forget_compiled)


def compiled_count() -> int:
    """Compiled kernel instances held now, on the current arch (``qd.init`` drops them all)."""
    return sum(k._backend.compiled_count() for k in list(_KERNELS) if k._backend is not None)


class Kernel(KernelObject):
    def __init__(self, fn, *, graph: bool = False, fuse=None):
        self.fn = fn
        self.name = fn.__name__
        self.qualname = f"{fn.__module__}.{fn.__qualname__}"
        self.graph = graph
        self.fuse = fuse
        sig = self.signature = inspect.signature(fn)
        self.params = []
        for p in sig.parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise QuadrantsSyntaxError(f"kernel '{self.name}': *args/**kwargs parameters are not supported")
            annotation = evaluate_annotation(fn, self.name, f"parameter '{p.name}'", p.annotation)
            kind = param_kind(annotation)
            if kind is None and not self.params and p.name == "self" and annotation is inspect.Parameter.empty:
                kind = "template"   # a method of a @qd.data_oriented class: the object is a template
            if kind is None:
                raise QuadrantsSyntaxError(
                    f"kernel '{self.name}': parameter '{p.name}' needs a type annotation "
                    "(a scalar dtype, qd.types.vector/matrix(...), qd.types.ndarray(...), or qd.template())"
                    + (f", got {annotation!r}" if annotation is not inspect.Parameter.empty else ""))
            self.params.append(Param(p.name, annotation, kind))
        self._returns = None
        returns = evaluate_annotation(fn, self.name, "the return value", sig.return_annotation)
        if returns is not inspect.Signature.empty and returns is not None:
            self._returns = returns if returns in (int, float) else return_type_of(self.name, returns)
        if graph:
            graph_rules.check_returns(self.name, self._returns)
        self._lock = threading.RLock()
        self._ir = {}
        self._backend = None
        self._caller = None             # the backend's generated __call__, once installed
        self.autodiff_mode = None       # "reverse": the gradient kernel (kernel.grad); "forward": qd.ad.FwdMode's
        self._grad = None
        self._forward_mode = None
        self._with_grads = {}           # a gradient kernel: its variants taking ndarray gradients, by argument set
        self.grad_arguments = ()        # such a variant: the ndarray parameters whose .grad follow the parameters
        self.compile_count = 0
        self.last_instance = None       # the CPU target's last instance (introspection)
        self.adstacks = []              # a gradient kernel: the adstacks of its last compiled instance (adstack.py)
        # each kernel has its own class, so that its __call__ can be generated for its parameters
        self.__class__ = type(Kernel)(f"Kernel[{self.name}]", (Kernel,), {})
        _KERNELS.add(self)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def return_type(self):
        """The Numba type of the return value (None: returns nothing); ``-> int``/``-> float``
        follow ``qd.init(default_ip=/default_fp=)`` as set when the kernel compiles."""
        if self._returns in (int, float):
            return dtypes.to_numba(self._returns)
        return self._returns

    # -- the call path ---------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """The generic call: bind the arguments, then the backend's checked path (which compiles
        on a miss). The first call installs the backend's generated ``__call__``. ``qd_stream=``
        (streams.py) comes here: the generated ``__call__`` sends unknown keywords to :meth:`_bad_call`."""
        if "qd_stream" in kwargs:
            stream = kwargs.pop("qd_stream")
            return streams.call_on_stream(self, stream, self._bind(args, kwargs))
        args = self._bind(args, kwargs)
        return self.backend().call(*args)

    def backend(self):
        """This kernel on the current arch's target (targets/base.py), made on first use."""
        backend = self._backend
        if backend is None:
            with self._lock:
                backend = self._backend
                if backend is None:
                    backend = target_for(config.current.arch).kernel_backend(self)
                    self._caller = backend.make_caller()
                    self._backend = backend
                    self._install_caller()
        return backend

    def _install_caller(self) -> None:
        call = self._caller or Kernel.__call__
        if self.autodiff_mode == "reverse" and not self.grad_arguments \
                and any(p.kind == "ndarray" for p in self.params):
            call = _ndarray_gradients(self, call)
        type(self).__call__ = call if _call_wrapper is None else _call_wrapper(self, call)

    def _forget(self) -> None:
        with self._lock:
            self._backend = None
            self._caller = None
            self.last_instance = None
            self._install_caller()

    # -- reverse mode ----------------------------------------------------------------------------------
    @property
    def grad(self) -> Kernel:
        """The gradient kernel (passes/autodiff.py): same parameters; it accumulates into the
        ``.grad`` fields the adjoints of what this kernel read, from the ``.grad`` of what it wrote."""
        if self.autodiff_mode is not None:
            raise QuadrantsSyntaxError(f"kernel '{self.name}' is already a gradient kernel")
        if self.return_type is not None:
            raise QuadrantsSyntaxError(f"kernel '{self.name}': a kernel that returns a value cannot be "
                                       "differentiated (kernel.grad)")
        return self._derivative("_grad", "grad", "reverse")

    @property
    def forward_mode(self) -> Kernel:
        """The forward-mode kernel (passes/forward_mode.py) that ``qd.ad.FwdMode`` runs instead of
        this one: the same writes, plus the ``.dual`` of what it writes from the ``.dual`` of what
        it reads."""
        if self.autodiff_mode is not None:
            raise QuadrantsSyntaxError(f"kernel '{self.name}' is already a derivative kernel")
        return self._derivative("_forward_mode", "forward_mode", "forward")

    def _derivative(self, attr: str, suffix: str, mode: str) -> Kernel:
        """The derivative kernel kept in ``attr`` (made once): the same function compiled with
        ``autodiff_mode = mode``, named ``<kernel>.<suffix>``."""
        if getattr(self, attr) is None:
            with self._lock:
                if getattr(self, attr) is None:
                    derived = Kernel(self.fn, graph=self.graph, fuse=self.fuse)
                    derived.name, derived.qualname = f"{self.name}.{suffix}", f"{self.qualname}.{suffix}"
                    derived.autodiff_mode = mode
                    derived.primal = self
                    derived._install_caller()
                    setattr(self, attr, derived)
        return getattr(self, attr)

    def _grad_variant(self, positions: tuple) -> Kernel:
        """The gradient kernel taking the ``.grad`` of the ndarray parameters at ``positions`` as
        hidden parameters after its own (made once per set of positions): ``kernel.grad``'s
        name, and the annotation of the ndarray each gradient belongs to (their default only
        keeps the signature valid after parameters with defaults: a call always passes them)."""
        variant = self._with_grads.get(positions)
        if variant is None:
            with self._lock:
                variant = self._with_grads.get(positions)
                if variant is None:
                    variant = Kernel(self.fn, graph=self.graph, fuse=self.fuse)
                    variant.name, variant.qualname = self.name, self.qualname
                    variant.autodiff_mode, variant.primal = "reverse", self.primal
                    variant.grad_arguments = tuple(self.params[k].name for k in positions)
                    extra = [Param(grad_parameter(self.params[k].name), self.params[k].annotation, "ndarray")
                             for k in positions]
                    variant.params = self.params + extra
                    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
                    variant.signature = self.signature.replace(parameters=[
                        *self.signature.parameters.values(),
                        *(inspect.Parameter(p.name, kind, default=MISSING_ARG) for p in extra)])
                    variant._install_caller()
                    self._with_grads[positions] = variant
        return variant

    def _bind(self, args, kwargs):
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise QuadrantsTypeError(f"kernel '{self.name}': {e}") from None
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def caller_prologue(self, ns: dict) -> tuple[list[str], list[str]]:
        """The first lines of a generated ``__call__`` (every target's): a ``def`` with the
        kernel's parameter names and defaults, a missing or surplus argument to
        :meth:`_bad_call`, then each argument bound to ``a<k>``. Returns (lines, ``a<k>`` names)."""
        names = [f"a{k}" for k in range(len(self.params))]
        ns["MISSING"] = MISSING_ARG
        sig = self.signature
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
        return lines, names

    def _bad_call(self, values, extra, unknown):
        """A call with a missing, surplus or unknown argument: raise what binding says."""
        args = [v for v in values if v is not MISSING_ARG] + list(extra)
        kwargs = dict(unknown)
        if len(args) < len(values) and not extra:   # keep keyword arguments CPython bound
            args = []
            kwargs.update({p.name: v for p, v in zip(self.params, values) if v is not MISSING_ARG})
        return Kernel.__call__(self, *args, **kwargs)

    def runtime_error(self, exc, check_arguments=None):
        """Our exception for ``exc``, raised while the kernel ran; ``check_arguments()`` raises
        our error for bad arguments (a TypeError from the entry point may mean one)."""
        if isinstance(exc, QuadrantsError):
            return exc
        if isinstance(exc, IndexError):
            return QuadrantsRuntimeError(f"kernel '{self.name}': out-of-bounds access: {exc}")
        if isinstance(exc, (TypeError, ValueError, OverflowError)):
            if check_arguments is not None:
                try:
                    check_arguments()
                except QuadrantsError as e:
                    return e
            return QuadrantsTypeError(f"kernel '{self.name}': bad argument: {exc}")
        return QuadrantsRuntimeError(f"kernel '{self.name}' failed: {type(exc).__name__}: {exc}")

    # -- compilation ---------------------------------------------------------------------------------
    def frontend_ir(self, tools):
        """The bytecode frontend's IR, per IR flavour (numba.core for CPU, numba.cuda.core), read
        again after each qd.init (it binds the globals the kernel reads)."""
        return cached_frontend_ir(self, tools)

    # -- introspection ------------------------------------------------------------------------------------
    def tasks(self, *args, **kwargs):
        """The Tasks of the instance these arguments select (compiling it if needed); the same
        list on every target (passes/plan_tasks.py)."""
        if kwargs or len(args) != len(self.params):
            args = self._bind(args, kwargs)
        return self.backend().tasks(args)

    def __get__(self, obj, cls=None):
        """``obj.step`` for a kernel method: the kernel with ``obj`` as its ``self`` argument."""
        return self if obj is None else BoundKernel(self, obj)

    def __repr__(self):
        return f"<qd.kernel {self.qualname}>"

    def __deepcopy__(self, memo):
        return self


class BoundKernel:
    """A kernel method read from an object (``@qd.data_oriented``): calls pass the object as
    ``self``; ``.grad`` is the gradient kernel bound the same way."""

    def __init__(self, kernel: Kernel, obj):
        self.kernel, self.obj = kernel, obj

    def __call__(self, *args, **kwargs):
        return self.kernel(self.obj, *args, **kwargs)

    @property
    def grad(self) -> BoundKernel:
        return BoundKernel(self.kernel.grad, self.obj)

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def _ndarray_gradients(kernel, call):
    """The gradient kernel's call: when ndarray arguments have a ``.grad`` (``qd.ndarray(...,
    needs_grad=True)``), the call goes to the variant of the gradient kernel that takes those
    gradients as hidden ndarray parameters after the kernel's own (:meth:`Kernel._grad_variant`);
    other ndarray arguments (numpy arrays, torch tensors, ndarrays without a gradient) are constants."""
    positions = [k for k, p in enumerate(kernel.params) if p.kind == "ndarray"]

    def checked(self, *args, **kwargs):
        if "qd_stream" in kwargs:   # refused for gradient kernels (streams.py)
            return Kernel.__call__(self, *args, **kwargs)
        bound = args if not kwargs and len(args) == len(self.params) else self._bind(args, kwargs)
        with_grad = tuple(k for k in positions if isinstance(bound[k], Ndarray) and bound[k].grad is not None)
        if not with_grad:
            return call(self, *bound)
        return self._grad_variant(with_grad)(*bound, *(bound[k].grad for k in with_grad))

    return checked


def kernel(fn=None, *, graph: bool = False, fuse=None):
    """Decorator: a kernel whose top-level for loops run in parallel (``graph=True``: qd/graph.py)."""
    def make(f):
        return graph_rules.prepare(f, graph, lambda g: Kernel(g, graph=graph, fuse=fuse))

    return make if fn is None else make(fn)
