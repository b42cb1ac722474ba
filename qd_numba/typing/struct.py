"""The Numba type of struct values (``qd.types.struct``, ``@qd.dataclass``) and its typing rules.

* :class:`StructType` — a struct type: named members, each a scalar type, a vector/matrix type
  (:class:`~qd_numba.typing.matrix.MatrixType`) or another ``StructType``, in declaration order;
  ``@qd.dataclass`` types also carry methods (``@qd.func`` functions, inlined where called, see
  passes/structs.py). Like vectors, struct values are immutable and flat (an LLVM struct of the
  member values, lowering/struct.py): ``s.a = x`` on a local becomes ``s = with_member(s, "a", x)``
  before typing. The type object is also what users hold: calling it builds a value, in Python
  scope (``qd_numba/struct.py`` sets :attr:`StructType.python_class`) and in compiled code, where
  keyword arguments were already put in member order by passes/structs.py.
* A member read ``s.a`` types as the member's type; an unknown member is a typing error naming it.

Registrations go through Numba's generic registries; numba-cuda's ``typeof`` learns the type in
targets/cuda/compile.py.
"""

from __future__ import annotations

from numba.core import errors, types
from numba.core.typing.templates import AbstractTemplate, AttributeTemplate, infer_getattr, signature
from numba.core.typing.typeof import typeof_impl

from .matrix import MatrixType


class StructType(types.Type):
    """A struct type: ``members`` maps each name to its Numba type (scalar, MatrixType or
    StructType); ``methods`` maps names to ``@qd.func`` functions (``@qd.dataclass``)."""

    python_class: type | None = None   # the Python-scope value class (qd_numba/struct.py sets it)

    def __init__(self, members: dict, methods: dict | None = None, type_name: str = "struct"):
        self.members = dict(members)
        self.methods = dict(methods or {})
        self.type_name = type_name
        inner = ", ".join(f"{k}={v}" for k, v in self.members.items())
        super().__init__(name=f"{type_name}({inner})")

    @property
    def key(self):
        return self.type_name, tuple(self.members.items()), tuple((k, id(f)) for k, f in self.methods.items())

    def __call__(self, *args, **kwargs):
        # ``T(f32, f32)`` would be a Numba signature; anything else builds a Python-scope value
        if args and not kwargs and all(isinstance(a, types.Type) for a in args):
            return signature(self, *args)
        return self.python_class.of_type(self, args, kwargs)

    def field(self, shape=None, name=None, needs_grad=False, needs_dual=False, offset=None, layout=None):
        """A struct field of this type (``qd_numba/struct.py``)."""
        return self.python_class.make_field(self, shape, name=name, needs_grad=needs_grad,
                                            needs_dual=needs_dual, offset=offset, layout=layout)

    def leaves(self, prefix=()):
        """``(path, type)`` of every non-struct member, depth first (``path`` a tuple of names)."""
        for k, t in self.members.items():
            if isinstance(t, StructType):
                yield from t.leaves((*prefix, k))
            else:
                yield (*prefix, k), t

    def can_convert_to(self, typingctx, other):
        if isinstance(other, StructType) and list(other.members) == list(self.members):
            convs = [typingctx.can_convert(a, b) for a, b in zip(self.members.values(), other.members.values())]
            if all(c is not None for c in convs):
                return max(convs)
        return None


class StructTypeRef(types.TypeRef):
    """``typeof(T)`` for a struct type ``T``: calling it in compiled code builds a value (lowered
    under this class, as Numba lowers calls of non-function types)."""


@typeof_impl.register(StructType)
def _typeof_struct_type(val, c):
    return StructTypeRef(val)


def member_value_ok(member: types.Type, value: types.Type) -> bool:
    """Whether a value of type ``value`` may initialise (or be assigned to) a member of type
    ``member``: numbers convert to numbers; a vector/matrix takes one of the same shape or a scalar
    (filling it); a struct takes one with the same member names or a scalar (filling every leaf)."""
    value = types.unliteral(value)
    scalar = isinstance(value, (types.Number, types.Boolean))
    if isinstance(member, StructType):
        return scalar or (isinstance(value, StructType) and list(value.members) == list(member.members)
                          and all(member_value_ok(m, v) for m, v in zip(member.members.values(),
                                                                        value.members.values())))
    if isinstance(member, MatrixType):
        return scalar or (isinstance(value, MatrixType) and value.shape == member.shape)
    return scalar


def check_member_values(st: StructType, args) -> None:
    if len(args) != len(st.members):
        raise errors.TypingError(f"{st} takes {len(st.members)} member values, got {len(args)}")
    for (name, mt), at in zip(st.members.items(), args):
        if not member_value_ok(mt, at):
            raise errors.TypingError(f"{st}: member '{name}' is {mt}, got a value of type {at}")


_CALL_TYPES: dict = {}


def constructor_type(st: StructType) -> types.Function:
    """The function type of ``T(...)`` (one per struct type: inference must get the same one)."""
    fnty = _CALL_TYPES.get(st)
    if fnty is None:
        class StructCall(AbstractTemplate):
            key = st

            def generic(self, args, kws):
                if kws:
                    raise errors.TypingError(f"{st}(...): keyword arguments are put in order before typing; "
                                             f"unexpected {sorted(kws)}")
                check_member_values(st, args)
                return signature(st, *args)

        fnty = _CALL_TYPES[st] = types.Function(StructCall)
    return fnty


def unknown_member(st: StructType, attr: str) -> str:
    return f"{st.type_name} has no member '{attr}' (members: {', '.join(st.members)})"


@infer_getattr
class StructAttribute(AttributeTemplate):
    key = StructType

    def generic_resolve(self, st, attr):
        if attr in st.members:
            return st.members[attr]
        if attr in st.methods:   # calls of methods are inlined before typing (passes/structs.py)
            raise errors.TypingError(
                f"cannot call the method '{attr}' of {st.type_name} here: its receiver's struct type must be known "
                f"before typing (a value built by {st.type_name}(...), read from a struct field, a struct parameter "
                f"or member, or returned by a qd.func annotated '-> {st.type_name}')")
        raise errors.TypingError(unknown_member(st, attr))

    def resolve___call__(self, st):
        return constructor_type(st)
