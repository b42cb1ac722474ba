"""Structs and classes in Python scope: ``qd.types.struct``, ``qd.Struct``, struct fields,
``@qd.dataclass`` and ``@qd.data_oriented``.

* A struct type (:class:`~qd_numba.typing.struct.StructType`) is made by :func:`struct` from
  member types (a ``dict`` member is a nested struct) or by :func:`dataclass` from an annotated
  class, whose ``@qd.func`` methods become the type's methods (``p.area()`` in a kernel).
* :class:`Struct` is a struct value in Python scope (``T(a=1, v=...)``, ``S[i]``): members as
  attributes, as Quadrants' ``qd.Struct``.
* :class:`StructField` (``T.field(shape=...)``, ``qd.Struct.field({...}, shape=...)``) is one
  field per member (SoA; a nested struct member is a nested StructField), so ``S.a`` is an
  ordinary field everywhere. In kernels, passes/structs.py turns ``S[i].a`` into ``S.a[i]`` and
  ``S[i]`` into a struct value built from the members; ``to_numpy()`` gives a dict of arrays.
* ``@qd.data_oriented`` marks a class whose ``@qd.kernel`` methods take ``self`` as a template
  (kernel.py binds it) and whose ``@qd.func`` methods are called as ``self.f(...)``.
"""

from __future__ import annotations

import sys

import numpy as np
from numba.core import types
from numba.core.typing.typeof import typeof_impl

from . import dtypes
from .errors import QuadrantsSyntaxError, QuadrantsTypeError
from .field import Field
from .frontend.objects import QdFunc
from .matrix import Matrix
from .typing.matrix import MatrixType
from .typing.struct import StructType


def member_type(dtype):
    """The Numba type of a member declaration: a scalar dtype, a vector/matrix or struct type, or a
    dict (a nested struct)."""
    if isinstance(dtype, (StructType, MatrixType)):
        return dtype
    if isinstance(dtype, dict):
        return struct(**dtype)
    try:
        return dtypes.to_numba(dtype)
    except TypeError:
        raise QuadrantsTypeError(f"not a struct member type: {dtype!r}") from None


def struct(**members) -> StructType:
    """``qd.types.struct(a=qd.f32, v=vec3, ...)``: a struct type."""
    return StructType({k: member_type(v) for k, v in members.items()})


def _member_value(ty, value):
    """A Python-scope member value of type ``ty`` (Quadrants' conversions: a number fills a
    vector/matrix or every leaf of a struct)."""
    if isinstance(ty, StructType):
        if isinstance(value, Struct):
            return Struct.of_type(ty, (), value.to_dict())
        if isinstance(value, dict):
            return Struct.of_type(ty, (), value)
        return Struct.of_type(ty, (), {k: value for k in ty.members})
    if isinstance(ty, MatrixType):
        arr = np.asarray(value.to_numpy() if isinstance(value, Matrix) else value, dtype=dtypes.to_numpy(ty.dtype))
        return ty.from_elements(tuple(np.broadcast_to(arr, ty.shape).reshape(-1).tolist()))
    return int(value) if isinstance(ty, (types.Integer, types.Boolean)) else float(value)


class Struct:
    """A struct value in Python scope: ``qd.Struct(a=1.0, v=...)``, ``T(...)``, ``S[i]``."""

    def __init__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            entries = dict(args[0])
        elif not args:
            entries = kwargs
        else:
            raise QuadrantsSyntaxError("qd.Struct takes a dict or keyword arguments")
        object.__setattr__(self, "_entries", entries)
        object.__setattr__(self, "_type", None)

    @classmethod
    def of_type(cls, st: StructType, args, kwargs) -> Struct:
        """``T(*args, **kwargs)``: members in order from ``args``, then by name, missing ones 0."""
        if len(args) > len(st.members):
            raise QuadrantsTypeError(f"{st.type_name} has {len(st.members)} members, got {len(args)} values")
        unknown = set(kwargs) - set(st.members)
        if unknown:
            raise QuadrantsTypeError(f"{st.type_name} has no member {sorted(unknown)[0]!r}")
        values = dict(zip(st.members, args))
        entries = {k: _member_value(t, values[k] if k in values else kwargs.get(k, 0)) for k, t in st.members.items()}
        out = cls(entries)
        object.__setattr__(out, "_type", st)
        return out

    @staticmethod
    def make_field(st: StructType, shape=None, name=None, needs_grad=False, needs_dual=False, offset=None,
                   layout=None) -> StructField:
        if offset is not None:
            raise QuadrantsTypeError("a struct field: 'offset' is not supported by qd_numba")
        return StructField(st, shape, name=name, needs_grad=needs_grad, needs_dual=needs_dual)

    @staticmethod
    def field(members: dict, methods=None, shape=None, name=None, offset=None, needs_grad=False, needs_dual=False,
              layout=None) -> StructField:
        """``qd.Struct.field({"a": qd.f32, ...}, shape=...)``: a struct field; without a shape, one to
        place in an SNode tree (``qd.root.dense(qd.i, n).place(s)`` places every member there)."""
        st = StructType({k: member_type(v) for k, v in members.items()}, methods)
        return Struct.make_field(st, shape, name=name, needs_grad=needs_grad, needs_dual=needs_dual, offset=offset)

    @property
    def keys(self) -> list:
        return list(self._entries)

    @property
    def items(self):
        return self._entries.items()

    def to_dict(self) -> dict:
        """The members as a dict (nested structs as dicts, vectors as numpy arrays)."""
        return {k: v.to_dict() if isinstance(v, Struct) else v.to_numpy() if isinstance(v, Matrix) else v
                for k, v in self._entries.items()}

    def __getattr__(self, name):
        entries = object.__getattribute__(self, "_entries")
        if name in entries:
            return entries[name]
        raise AttributeError(f"struct has no member '{name}' (members: {', '.join(entries)})")

    def __setattr__(self, name, value):
        if name not in self._entries:
            raise AttributeError(f"struct has no member '{name}'")
        st = self._type
        self._entries[name] = _member_value(st.members[name], value) if st is not None else value

    def __getitem__(self, key):
        return self._entries[key]

    def _flat_tuple(self) -> tuple:
        """The leaf values, depth first, vectors/matrices row-major (unboxing a kernel argument)."""
        out = []
        for v in self._entries.values():
            if isinstance(v, Struct):
                out += v._flat_tuple()
            elif isinstance(v, Matrix):
                out += v.to_numpy().reshape(-1).tolist()
            else:
                out.append(v)
        return tuple(out)

    def __eq__(self, other):
        return isinstance(other, Struct) and _equal(self.to_dict(), other.to_dict())

    def __repr__(self):
        return f"qd.Struct({self.to_dict()})"


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        _equal(x, y) if isinstance(x, dict) else np.array_equal(x, y) for x, y in zip(a.values(), b.values()))


StructType.python_class = Struct


@typeof_impl.register(Struct)
def _typeof_struct(val, c):
    return val._type


def struct_argument(value, st: StructType) -> Struct:
    """The argument of a kernel parameter annotated with the struct type ``st``: a ``qd.Struct``
    of that type, from one (of any struct type with these members) or a dict. Raises
    QuadrantsTypeError."""
    if isinstance(value, Struct) and value._type is st:
        return value
    if isinstance(value, (Struct, dict)):
        entries = value.to_dict() if isinstance(value, Struct) else value
        if set(entries) == set(st.members):
            try:
                return Struct.of_type(st, (), entries)
            except (TypeError, ValueError) as e:
                raise QuadrantsTypeError(f"expected a {st.type_name} value: {e}") from None
    raise QuadrantsTypeError(f"expected a {st.type_name} value (members {', '.join(st.members)}), got {value!r}")


class StructField:
    """A field of structs: one field per member (``S.a`` is that field), same shape."""

    holds_global_data = True   # its elements are never compile-time values (passes/base.py)

    def __init__(self, st: StructType, shape=(), name=None, needs_grad=False, needs_dual=False):
        self.dtype = st
        self.name = name
        members = {}
        for k, t in st.members.items():
            member_name = f"{name}.{k}" if name else k
            if isinstance(t, StructType):
                members[k] = StructField(t, shape, member_name, needs_grad, needs_dual)
            else:
                real = isinstance(t.dtype if isinstance(t, MatrixType) else t, types.Float)
                members[k] = Field(t, shape, needs_grad=needs_grad and real, name=member_name,
                                   needs_dual=needs_dual and real)
        self.field_dict = members

    @property
    def shape(self):
        """The members' shape (None until a struct field declared without one is placed)."""
        return next(iter(self.field_dict.values())).shape if self.field_dict else ()

    def __getattr__(self, name):
        members = self.__dict__.get("field_dict", {})
        if name in members:
            return members[name]
        raise AttributeError(f"struct field has no member '{name}' (members: {', '.join(members)})")

    @property
    def keys(self) -> list:
        return list(self.field_dict)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def leaf_fields(self) -> list:
        out = []
        for f in self.field_dict.values():
            out += f.leaf_fields() if isinstance(f, StructField) else [f]
        return out

    def __getitem__(self, key):
        return Struct.of_type(self.dtype, (), {k: f[key] for k, f in self.field_dict.items()})

    def __setitem__(self, key, value):
        value = _member_value(self.dtype, value)
        for k, f in self.field_dict.items():
            v = value[k]
            f[key] = v.to_numpy() if isinstance(v, Matrix) else v

    def to_numpy(self) -> dict:
        """A dict of numpy arrays, one per member (nested structs: nested dicts)."""
        return {k: f.to_numpy() for k, f in self.field_dict.items()}

    def from_numpy(self, arrays: dict) -> None:
        missing = set(self.field_dict) - set(arrays)
        if missing:
            raise QuadrantsTypeError(f"from_numpy: a struct field needs an array for member {sorted(missing)[0]!r}")
        for k, f in self.field_dict.items():
            f.from_numpy(arrays[k])

    def fill(self, value) -> None:
        for f in self.field_dict.values():
            f.fill(value)

    def copy_from(self, other: StructField) -> None:
        self.from_numpy(other.to_numpy())

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return f"<qd.StructField {self.dtype} shape={self.shape}>"


def dataclass(cls) -> StructType:
    """``@qd.dataclass``: a struct type from a class's annotations; its ``@qd.func`` methods
    are the struct's methods (``p.area()`` in kernels)."""
    annotations = cls.__dict__.get("__annotations__", {})
    for k in annotations:
        if k in cls.__dict__:
            raise QuadrantsSyntaxError(f"@qd.dataclass {cls.__name__}: default values are not supported ('{k}')")
    methods = {k: v for k, v in cls.__dict__.items() if isinstance(v, QdFunc)}
    members = {k: member_type(_annotation(cls, methods, k, v)) for k, v in annotations.items()}
    return StructType(members, methods, type_name=cls.__name__)


def _annotation(cls, methods, name, value):
    """A member annotation; a string one (``from __future__ import annotations``) is evaluated in
    the class's module (or, for code run by ``exec``, the globals its methods see)."""
    if not isinstance(value, str):
        return value
    module = sys.modules.get(cls.__module__)
    namespace = next((f.fn.__globals__ for f in methods.values()), None) or (vars(module) if module else {})
    try:
        return eval(value, namespace, dict(vars(cls)))
    except Exception as e:
        raise QuadrantsSyntaxError(f"@qd.dataclass {cls.__name__}: cannot evaluate the annotation {value!r} of "
                                   f"member '{name}': {type(e).__name__}: {e}") from None


def data_oriented(cls):
    """``@qd.data_oriented``: a class whose ``@qd.kernel`` methods take ``self`` as a template (one
    compiled instance per object) and read its fields as ``self.x``."""
    cls._qd_data_oriented = True
    return cls

