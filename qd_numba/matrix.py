"""Python-scope small vectors and matrices: ``qd.Vector``, ``qd.Matrix``, ``vector(n, dtype)``,
``matrix(n, m, dtype)``.

Responsibilities:

* :class:`Matrix` / :class:`Vector` — user-facing classes. In Python scope an instance holds a
  numpy array (``entries``; shape ``(n,)`` or ``(n, m)``) and supports indexing, arithmetic, the
  methods of compiled code (the numpy column of ``qd_numba/ops/matrix_methods.py``) and
  ``to_numpy()``. It is ``MatrixType.python_class``: what compiled values box to. Inside compiled code the same names
  build register values (``qd.Vector([a, b], dt=qd.f64)``, ``qd.Matrix.identity(qd.f32, 3)``).
* ``typeof`` of an instance is its :class:`~qd_numba.typing.matrix.MatrixType`, so instances are
  compile-time constants when captured as globals and are boxed/unboxed as arguments.
* :func:`vector` / :func:`matrix` return the (interned, hashable) ``MatrixType``; calling it with
  values builds a vector/matrix, in Python scope and in compiled code.

The dtype rules live in one place, ``qd_numba/typing/matrix.py``; Python-scope results follow
them exactly (numpy computes, then the result is cast to the rule's dtype).
"""

from __future__ import annotations

import inspect
import operator

import numpy as np
from numba.core import errors as nb_errors
from numba.core import types
from numba.core.typing.typeof import typeof_impl
from numba.np.numpy_support import from_dtype

from .dtypes import f32, to_numba, to_numpy
from .errors import QuadrantsTypeError
from .field import Ndarray
from .field import field as make_field
from .ops.matrix_methods import MATRIX_METHODS, method_type
from .typing.matrix import (
    SWIZZLE,
    MatrixClass,
    MatrixType,
    VectorClass,
    binop_dtypes,
    constructor_dtype,
    matmul_type,
    swizzle_indices,
)


def vector(n: int, dtype=f32) -> MatrixType:
    """The type of an ``n``-vector of ``dtype`` (``qd.types.vector``); call it to build one."""
    return MatrixType(to_numba(dtype), n, 1, 1)


def matrix(n: int, m: int, dtype=f32) -> MatrixType:
    """The type of an ``n`` x ``m`` matrix of ``dtype`` (``qd.types.matrix``); call it to build one."""
    return MatrixType(to_numba(dtype), n, m, 2)


def _scalar_nb_type(x) -> types.Type:
    """Numba type of a Python-scope scalar, as compiled code would see it."""
    if isinstance(x, (bool, np.bool_)):
        return types.boolean
    if isinstance(x, int):
        return types.int64
    if isinstance(x, float):
        return types.float64
    if isinstance(x, np.generic):
        return from_dtype(x.dtype)
    raise QuadrantsTypeError(f"not a scalar: {x!r}")


def _element_nb_type(x) -> types.Type:
    """Like :func:`_scalar_nb_type`, but Python float constants count as f32 (constructor rule)."""
    if type(x) is float:
        return types.float32
    return _scalar_nb_type(x)


def _nb_type(x) -> types.Type:
    return x.type if isinstance(x, Matrix) else _scalar_nb_type(x)


def _flatten(values) -> list:
    if isinstance(values, Matrix):
        return list(values.entries.reshape(-1))
    if isinstance(values, np.ndarray):
        return list(values.reshape(-1))
    if isinstance(values, (list, tuple)):
        return [e for v in values for e in _flatten(v)]
    return [values]


def _wrap(arr: np.ndarray) -> Matrix:
    obj = object.__new__(Vector if arr.ndim == 1 else Matrix)
    obj.entries = arr
    return obj


def _as_matrix_array(values, dt) -> np.ndarray:
    if isinstance(values, Matrix):
        values = values.entries
    if dt is not None:
        dtype = to_numba(dt)
    elif isinstance(values, np.ndarray):
        dtype = constructor_dtype([from_dtype(values.dtype)])
    else:
        dtype = constructor_dtype([_element_nb_type(e) for e in _flatten(values)])
    rows = values
    if not isinstance(values, np.ndarray):
        rows = [r.entries if isinstance(r, Matrix) else r for r in values]
    arr = np.array(rows, dtype=to_numpy(dtype))
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise QuadrantsTypeError(f"a vector/matrix needs a non-empty 1-D or 2-D list, got shape {arr.shape}")
    return arr


class _MatrixMeta(type):
    """Metaclass of Vector/Matrix: lets compiled code type the classes themselves."""

    _qd_matrix_constructor = True


@typeof_impl.register(_MatrixMeta)
def _typeof_matrix_class(val, c):
    return VectorClass if issubclass(val, Vector) else MatrixClass


class Matrix(metaclass=_MatrixMeta):
    """A small ``n`` x ``m`` matrix (or, built from a flat list, a vector)."""

    __slots__ = ("entries",)
    __hash__ = None  # == is elementwise
    __array_ufunc__ = None  # numpy scalars defer to our operators (np.float32(2) * v is a Matrix)

    def __init__(self, values, dt=None):
        self.entries = _as_matrix_array(values, dt)
        if self.entries.ndim == 1:
            self.__class__ = Vector

    # --- type and conversion -----------------------------------------------------------------
    @property
    def type(self) -> MatrixType:
        arr = self.entries
        dtype = types.boolean if arr.dtype == np.bool_ else from_dtype(arr.dtype)
        if arr.ndim == 1:
            return MatrixType(dtype, arr.shape[0], 1, 1)
        return MatrixType(dtype, arr.shape[0], arr.shape[1], 2)

    @property
    def dtype(self) -> types.Type:
        return self.type.dtype

    @property
    def n(self) -> int:
        return self.entries.shape[0]

    @property
    def m(self) -> int:
        return 1 if self.entries.ndim == 1 else self.entries.shape[1]

    @property
    def ndim(self) -> int:
        return self.entries.ndim

    def to_numpy(self) -> np.ndarray:
        return self.entries.copy()

    def tolist(self) -> list:
        return self.entries.tolist()

    def _flat_tuple(self) -> tuple:
        return tuple(self.entries.reshape(-1).tolist())

    def __array__(self, dtype=None, copy=None):
        return self.entries if dtype is None else self.entries.astype(dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.entries.tolist()}, dt={self.dtype})"

    # --- indexing ----------------------------------------------------------------------------
    def __getitem__(self, idx):
        out = self.entries[idx]
        return _wrap(out.copy()) if isinstance(out, np.ndarray) else out

    def __setitem__(self, idx, value):
        self.entries[idx] = value.entries if isinstance(value, Matrix) else value

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return (self[i] for i in range(self.n))

    # --- operators ---------------------------------------------------------------------------
    def _binop(self, op, a, b):
        try:
            ta, tb = _nb_type(a), _nb_type(b)
        except QuadrantsTypeError:  # not a number: Python's fallback (== is identity, + a TypeError)
            return NotImplemented
        try:
            res = binop_dtypes(op, ta, tb)
        except nb_errors.TypingError as e:
            raise QuadrantsTypeError(str(e)) from None
        if res is None:
            return NotImplemented
        operand, rt = res
        calc = to_numpy(rt.dtype if op is operator.truediv else operand)
        x = np.asarray(a.entries if isinstance(a, Matrix) else a).astype(calc)
        y = np.asarray(b.entries if isinstance(b, Matrix) else b).astype(calc)
        with np.errstate(over="ignore"):
            out = op(x, y)
        return _wrap(np.asarray(out).astype(to_numpy(rt.dtype)))

    def __matmul__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        try:
            rt = matmul_type(self.type, other.type)
        except nb_errors.TypingError as e:
            raise QuadrantsTypeError(str(e)) from None
        dtype = rt.dtype if isinstance(rt, MatrixType) else rt
        out = self.entries.astype(to_numpy(dtype)) @ other.entries.astype(to_numpy(dtype))
        return _wrap(out) if isinstance(rt, MatrixType) else out[()]

    def __neg__(self):
        return _wrap(-self.entries)

    def __pos__(self):
        return _wrap(self.entries.copy())

    def __abs__(self):
        return _wrap(np.abs(self.entries))

    # --- methods: added from the table of compiled code's methods, below (same result dtypes) ---
    def _call_method(self, row, args):
        try:
            rt = method_type(self.type, row.name, [_nb_type(a) for a in args])
        except nb_errors.TypingError as e:
            raise QuadrantsTypeError(str(e)) from None
        value = row.numpy(self.entries, *[a.entries if isinstance(a, Matrix) else a for a in args])
        if isinstance(rt, MatrixType):
            return _wrap(np.asarray(value).astype(to_numpy(rt.dtype)))
        return to_numpy(rt).type(value)

    # --- constructors ------------------------------------------------------------------------
    @staticmethod
    def of_type(mt: MatrixType, args) -> Matrix:
        """Python-scope ``mt(*args)``: scalars, sequences and vectors flattened, or one scalar to fill."""
        flat = _flatten(list(args))
        if len(flat) == 1 and mt.count > 1:
            flat = flat * mt.count
        if len(flat) != mt.count:
            raise QuadrantsTypeError(f"{mt} takes {mt.count} values (or one scalar to fill), got {len(flat)}")
        return _wrap(np.array(flat, dtype=to_numpy(mt.dtype)).reshape(mt.shape))

    @staticmethod
    def from_elements(mt: MatrixType, values: tuple) -> Matrix:
        """The value of type ``mt`` with these elements, row-major (boxing compiled values)."""
        return _wrap(np.array(values, dtype=to_numpy(mt.dtype)).reshape(mt.shape))

    @staticmethod
    def zero(dtype, n, m):
        return _wrap(np.zeros((n, m), dtype=to_numpy(dtype)))

    @staticmethod
    def identity(dtype, n):
        return _wrap(np.eye(n, dtype=to_numpy(dtype)))

    # --- fields and ndarrays of matrices (qd_numba/field.py owns these types) ------------------
    @staticmethod
    def field(n, m, dtype, shape=None, order=None, name=None, offset=None, needs_grad=False, needs_dual=False):
        """A field of n x m matrices (Quadrants' signature); without a shape, to be placed."""
        return make_field(dtype, shape, needs_grad, name, offset, order, needs_dual, elem_type=matrix(n, m, dtype))

    @staticmethod
    def ndarray(n, m, dtype, shape, needs_grad=False, *, fill=None):
        """An ndarray of ``shape`` whose elements are n x m matrices (Quadrants' signature)."""
        return _filled(Ndarray(matrix(n, m, dtype), shape, needs_grad=needs_grad), fill)


def _add_methods():
    for row in MATRIX_METHODS.values():
        def method(self, *args, row=row, **kwargs):
            if kwargs:  # v.norm(eps=1e-6): keywords named as the numpy column's parameters
                args = inspect.signature(row.numpy).bind(self.entries, *args, **kwargs).args[1:]
            return self._call_method(row, args)

        method.__name__, method.__qualname__ = row.name, f"Matrix.{row.name}"
        method.__doc__ = f"``{row.name}`` as in compiled code (qd_numba/ops/matrix_methods.py)."
        setattr(Matrix, row.name, method)


def _add_binops():
    names = {
        operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "truediv",
        operator.floordiv: "floordiv", operator.mod: "mod", operator.pow: "pow",
    }
    for op, name in names.items():
        setattr(Matrix, f"__{name}__", lambda self, other, op=op: self._binop(op, self, other))
        setattr(Matrix, f"__r{name}__", lambda self, other, op=op: self._binop(op, other, self))
    for op in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne):
        setattr(Matrix, f"__{op.__name__}__", lambda self, other, op=op: self._binop(op, self, other))


_add_binops()
_add_methods()


class Vector(Matrix):
    """A small ``n``-vector (``qd.Vector([x, y, z])``)."""

    __slots__ = ()

    def __init__(self, values, dt=None):
        super().__init__(values, dt)
        if self.entries.ndim != 1:
            raise QuadrantsTypeError(f"qd.Vector needs a flat list, got shape {self.entries.shape}")

    @staticmethod
    def zero(dtype, n):
        return _wrap(np.zeros((n,), dtype=to_numpy(dtype)))

    @staticmethod
    def unit(n, i, dt=None):
        out = np.zeros((n,), dtype=to_numpy(dt or f32))
        out[i] = 1
        return _wrap(out)

    @staticmethod
    def field(n, dtype, shape=None, order=None, name=None, offset=None, needs_grad=False, needs_dual=False):
        """A field of n-vectors (Quadrants' signature); without a shape, to be placed."""
        return make_field(dtype, shape, needs_grad, name, offset, order, needs_dual, elem_type=vector(n, dtype))

    @staticmethod
    def ndarray(n, dtype, shape, needs_grad=False, *, fill=None):
        """An ndarray of ``shape`` whose elements are n-vectors (Quadrants' signature)."""
        return _filled(Ndarray(vector(n, dtype), shape, needs_grad=needs_grad), fill)


def _filled(array: Ndarray, fill) -> Ndarray:
    if fill is not None:
        array.fill(fill)
    return array


def _component(k: int) -> property:
    return property(lambda self: self.entries[k], lambda self, v: self.entries.__setitem__(k, v))


for _name, _k in SWIZZLE.items():  # v.x, v.r, v.s ... (the names compiled code accepts)
    setattr(Vector, _name, _component(_k))


def _swizzle(self, attr):
    """``v.zyx``, ``v.rg``: a new Vector of the picked components (read only, as in kernels)."""
    indices = swizzle_indices(attr)
    if indices is None or max(indices) >= len(self.entries):
        raise AttributeError(f"{type(self).__name__} has no attribute {attr!r}")
    return Vector([self.entries[k] for k in indices], dt=self.dtype)


Vector.__getattr__ = _swizzle


@typeof_impl.register(Matrix)
def _typeof_matrix(val, c):
    return val.type


def matrix_argument(value, mt: MatrixType) -> Matrix:
    """The argument of a kernel parameter annotated ``mt``: ``value`` itself when it is a
    qd.Vector/qd.Matrix of that type, else a new one from a qd.Vector/qd.Matrix, tuple, list or
    numpy array of the same shape (elements converted to ``mt.dtype``; float elements for an
    integer type are refused, as for scalar parameters). Raises QuadrantsTypeError."""
    dtype = to_numpy(mt.dtype)
    if isinstance(value, Matrix) and value.entries.dtype == dtype and value.entries.shape == mt.shape:
        return value
    try:
        arr = np.asarray(value.entries if isinstance(value, Matrix) else value)
    except (TypeError, ValueError):  # a ragged list
        arr = None
    if arr is None or arr.shape != mt.shape or arr.dtype.kind not in "biuf":
        got = f"of shape {arr.shape}" if arr is not None and arr.ndim and arr.dtype.kind in "biuf" else repr(value)
        raise QuadrantsTypeError(f"expected a {mt} (a qd.{'Vector' if mt.is_vector else 'Matrix'}, tuple, list or "
                                 f"numpy array of shape {mt.shape}), got {type(value).__name__} {got}")
    if arr.dtype.kind == "f" and dtype.kind != "f":
        raise QuadrantsTypeError(f"expected integer elements for {mt}, got {arr.dtype} values {value!r}")
    return _wrap(arr.astype(dtype))


MatrixType.python_class = Matrix     # what MatrixType values are in Python scope


__all__ = ["Matrix", "Vector", "vector", "matrix", "MatrixType"]
