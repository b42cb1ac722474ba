"""Kernel parameters: annotations, argument specs, and the checks and conversions of argument
values that every target shares (one module for both: the CPU call path and the CUDA launcher).

* :func:`param_kind` classifies an annotation: ``"scalar"``, ``"matrix"`` (a vector/matrix
  value), ``"ndarray"`` or ``"template"``; :class:`Param` is one parameter.
* :func:`ndarray_type` is the Numba type of an ndarray argument (dtype, ndim, layout, element
  shape checked against the annotation); :func:`host_array` turns any CPU array-like
  (qd.ndarray, torch tensor, ``__array_interface__``, DLPack) into the numpy array a CPU kernel
  uses; :func:`template_key` keys compiled instances on template values (identity for objects).
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
from numba.core import types

from .. import config, dtypes
from ..errors import QuadrantsSyntaxError, QuadrantsTypeError
from ..field import ArrayData, Field, Ndarray, element_shape
from ..typing.field import FieldType
from ..typing.matrix import MatrixType
from ..typing.struct import StructType


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
        self._dtype = None if dtype is None else (self.elem_type.dtype if self.elem_type else
                                                  dtype if dtype in (int, float) else dtypes.to_numba(dtype))
        self.ndim = ndim

    @property
    def dtype(self):
        """The element dtype; ``int``/``float`` follow ``qd.init(default_ip=/default_fp=)`` as set
        when the kernel compiles (as scalar parameters do)."""
        return None if self._dtype is None else dtypes.to_numba(self._dtype)

    def __repr__(self):
        return f"qd.types.ndarray(dtype={self.elem_type or self.dtype}, ndim={self.ndim})"


class _NDArrayAlias:
    def __getitem__(self, item):
        dtype, ndim = item if isinstance(item, tuple) else (item, None)
        return NdarraySpec(dtype, ndim)

    def __call__(self, dtype=None, ndim=None):
        return NdarraySpec(dtype, ndim)


NDArray = _NDArrayAlias()


def param_kind(annotation):
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
    if isinstance(annotation, StructType):  # qd.types.struct / @qd.dataclass: by value, as a vector
        return "struct"
    return None


def evaluate_annotation(fn, kernel_name: str, what: str, annotation):
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


def return_type_of(kernel_name: str, annotation):
    """The Numba type of a kernel's return annotation: a scalar type (``int``/``float``/``bool``
    included) or ``qd.types.vector/matrix(...)``; anything else is our error."""
    if isinstance(annotation, MatrixType):
        return annotation
    if isinstance(annotation, (types.Number, types.Boolean)) or annotation in (int, float, bool):
        return dtypes.to_numba(annotation)
    raise QuadrantsSyntaxError(
        f"kernel '{kernel_name}': the return annotation {annotation!r} is not a type a kernel can return "
        "(a scalar type such as qd.f32, or qd.types.vector/matrix(...))")


class Param:
    def __init__(self, name, annotation, kind):
        self.name, self.annotation, self.kind = name, annotation, kind
        if kind == "ndarray" and not isinstance(annotation, NdarraySpec):
            self.annotation = NdarraySpec()
        self._nbtype = annotation if kind in ("matrix", "struct") else \
            dtypes.to_numba(annotation) if kind == "scalar" and annotation not in (int, float) else None

    @property
    def nbtype(self):
        """The Numba type of a scalar parameter; ``int``/``float`` annotations follow
        ``qd.init(default_ip=/default_fp=)`` as set when the kernel compiles, not when decorated."""
        if self._nbtype is not None:
            return self._nbtype
        return config.current.default_ip if self.annotation is int else config.current.default_fp


def grad_parameter(name: str) -> str:
    """The hidden parameter of a gradient kernel that takes the ``.grad`` of ndarray parameter
    ``name`` (passes/autodiff.py accumulates into it)."""
    return f"__qd_grad_{name}"


# -- funcs -------------------------------------------------------------------------------------------


INT_TYPES = frozenset({int, bool, np.bool_, np.int8, np.int16, np.int32, np.int64,
                        np.uint8, np.uint16, np.uint32, np.uint64})


NUMBER_TYPES = INT_TYPES | {float, np.float16, np.float32, np.float64}


def template_argument(where: str, param, value):
    """``value`` for template parameter ``param``; an annotation that restricts its values
    (``qd.types.sparse_matrix_builder()``) checks it with its ``check_argument(where, value)``."""
    check = getattr(param.annotation, "check_argument", None)
    if check is not None:
        check(where, value)
    return value


def template_key(value):
    if isinstance(value, (int, float, bool, str, type(None))):
        return (type(value), value)
    return id(value)


def field_type(f: ArrayData, debug: bool) -> FieldType:
    """The type of a field's buffer: ``"A"`` layout for a strided view (an SNode tree's field)."""
    return FieldType(f.dtype, len(f.shape), f.elem_type, "C" if f._arr.flags.c_contiguous else "A", checked=debug,
                     kind="field" if not isinstance(f, Ndarray) else "ndarray", offset=f.offset,
                     levels=getattr(f, "_levels", None))


def field_for_ndarray_message(where: str, field) -> str:
    return (f"{where}: got the field {field!r}, but a qd.types.ndarray() parameter takes a numpy array or a "
            "qd.ndarray; fields are global: use the field in the kernel directly, or declare the parameter "
            "as qd.template() to pass fields")


def argument_where(kernel, param) -> str:
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


def ndarray_type(where, spec, a, debug):
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


def scalar_argument(where: str, param, value):
    """``value`` as the scalar parameter ``param`` takes it, or our error. A float given to an
    integer parameter is truncated toward zero (``qd.i32`` given 1.5 is 1, as the issue asks;
    Quadrants 1.4's launcher rejects it), then checked to fit like an int. The call paths come
    here only for values their fast path does not take as they are (exact types that fit)."""
    if not isinstance(value, (int, float, bool, np.number, np.bool_)):
        raise QuadrantsTypeError(f"{where}: expected a {param.nbtype} scalar, got {type(value).__name__}")
    if isinstance(param.nbtype, types.Integer) and isinstance(value, (float, np.floating)):
        try:
            value = int(value)
        except (OverflowError, ValueError):
            raise QuadrantsTypeError(f"{where}: cannot convert {value!r} to {param.nbtype}") from None
    if isinstance(param.nbtype, types.Integer) and not isinstance(value, (bool, np.bool_)):
        lo, hi = int_range(param.nbtype)
        if not lo <= value <= hi:
            raise QuadrantsTypeError(f"{where}: {value!r} does not fit in {param.nbtype} (range {lo} to {hi}); "
                                     "annotate the parameter with a wider type, e.g. qd.i64")
    return value


def int_range(nbtype) -> tuple[int, int]:
    """The smallest and largest value of an integer type (the call paths check int arguments)."""
    info = np.iinfo(str(nbtype))
    return int(info.min), int(info.max)
