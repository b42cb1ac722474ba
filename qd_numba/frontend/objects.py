"""What the compiler recognises in kernel code besides data: ``@qd.func`` functions (inlined
into their callers) and kernels (which kernel code may not call). Passes test for these classes;
they live below the passes, so passes never import the kernel module.
"""

from __future__ import annotations

import inspect

from numba.core import types

from .. import config
from ..errors import QuadrantsSyntaxError
from ..typing.matrix import MatrixType
from .args import evaluate_annotation
from .diagnostics import run_frontend
from .real_func import real_func


class KernelObject:
    """Base class of ``@qd.kernel`` objects (kernel.py), for passes to recognise them."""

    name: str


def cached_frontend_ir(obj, tools):
    """``obj.fn``'s IR from the bytecode frontend for ``tools``' IR flavour (numba.core for the CPU,
    numba.cuda.core), kept in ``obj._ir`` for the qd.init in force: the frontend binds the global
    names the function reads to their values (fields among them), and a ``qd.init`` releases the
    fields of the previous one, so the function is read again after each."""
    runtime = config.current
    cached = obj._ir.get(id(tools.ir))
    if cached is None or cached[0] is not runtime:
        cached = obj._ir[id(tools.ir)] = (runtime, run_frontend(tools, obj.fn, obj.name))
    return cached[1]


class QdFunc:
    """``@qd.func``: inlined into its callers at compile time."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__qualname__
        self._ir = {}
        # a return annotation promises a value on every path (passes/inline_funcs.py checks)
        returns = inspect.signature(fn).return_annotation
        self.return_type = None if returns in (inspect.Signature.empty, None) else returns

    def value_type(self, cfg):
        """The Numba type the return annotation converts the returned value to (a scalar or
        vector/matrix type; ``int``/``float`` as ``cfg`` says), or None: no conversion."""
        if self.return_type is None:
            return None
        annotation = evaluate_annotation(self.fn, self.name, "the return value", self.return_type)
        if annotation is int:
            return cfg.default_ip
        if annotation is float:
            return cfg.default_fp
        if annotation is bool or isinstance(annotation, (types.Number, types.Boolean, MatrixType)):
            return types.boolean if annotation is bool else annotation
        return None

    def frontend_ir(self, tools):
        return cached_frontend_ir(self, tools)

    def __call__(self, *args, **kwargs):
        raise QuadrantsSyntaxError(f"qd.func '{self.name}' can only be called from a kernel or another qd.func")

    def __get__(self, obj, cls=None):
        # ``self.helper`` in a method of a data-oriented object: the func with ``self`` bound
        return self if obj is None else BoundQdFunc(self, obj)

    def __deepcopy__(self, memo):
        return self


class BoundQdFunc:
    """A ``@qd.func`` method read from an object (``self.helper``): passes/structs.py calls the
    func with the object as its first argument."""

    def __init__(self, func: QdFunc, obj):
        self.func, self.obj = func, obj

    def __call__(self, *args, **kwargs):
        raise QuadrantsSyntaxError(f"qd.func '{self.func.name}' can only be called from a kernel or another qd.func")

    def __deepcopy__(self, memo):
        return self


def func(fn=None, *, is_real_function=False):
    """Decorator: a function inlined into kernels (arguments, return values, templates);
    ``is_real_function=True`` is ``@qd.real_func`` (frontend/real_func.py)."""
    make = real_func if is_real_function else QdFunc
    if fn is None:
        return make
    return make(fn)
