"""Data model and lowering of struct values (:class:`~qd_numba.typing.struct.StructType`).

* The data model: an LLVM struct of the member values, in declaration order (Numba's
  ``StructModel``); values are immutable and live in registers, as vectors do.
* Lowering of the constructor ``T(a, b, ...)`` (member values in order; a number converts to a
  scalar member, fills a vector/matrix member, or fills every leaf of a struct member), member
  reads ``s.a``, casts between struct types with the same member names, and the function the
  rewrite of passes/structs.py calls: :func:`member_store` (``s.a = x`` is
  ``s = member_store(s, "a", x)``; on a vector, ``v.x = y`` is ``v[0] = y``).
* Unboxing a kernel argument (a ``qd.Struct``, CPU): its leaves as one flat tuple, in the order
  of :func:`leaf_scalar_types` (the order of a CUDA kernel's parameter slots too).
"""

from __future__ import annotations

from llvmlite import ir as llir
from numba.core import types
from numba.core.datamodel import models
from numba.core.imputils import lower_builtin, lower_cast, lower_constant, lower_getattr_generic
from numba.core.typing.templates import signature
from numba.extending import NativeValue, intrinsic, overload, register_model, unbox

from ..errors import QuadrantsTypeError, typing_error
from ..typing.matrix import SWIZZLE, MatrixType
from ..typing.struct import StructType, StructTypeRef, member_value_ok, unknown_member
from .matrix import matrix_with_item, pack


@register_model(StructType)
class StructValueModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, list(fe_type.members.items()))


register_model(StructTypeRef)(models.OpaqueModel)


@lower_constant(StructTypeRef)
def _constant_struct_type(context, builder, ty, pyval):
    return context.get_dummy_value()


def convert_member(context, builder, value, from_ty, to_ty):
    """``value`` (of ``from_ty``) as a value of the member type ``to_ty`` (see
    :func:`~qd_numba.typing.struct.member_value_ok`)."""
    from_ty = types.unliteral(from_ty)
    scalar = not isinstance(from_ty, (MatrixType, StructType))
    if isinstance(to_ty, StructType):
        if scalar:
            return pack_struct(context, builder, to_ty, [
                convert_member(context, builder, value, from_ty, t) for t in to_ty.members.values()])
        return context.cast(builder, value, from_ty, to_ty)
    if isinstance(to_ty, MatrixType) and scalar:
        element = context.cast(builder, value, from_ty, to_ty.dtype)
        return pack(context, builder, to_ty, [element] * to_ty.count)
    return context.cast(builder, value, from_ty, to_ty)


def pack_struct(context, builder, st: StructType, values) -> llir.Value:
    """A struct value from its member values (already of the member types)."""
    out = llir.Constant(context.get_value_type(st), llir.Undefined)
    for k, v in enumerate(values):
        out = builder.insert_value(out, v, k)
    return out


def member_values(builder, st: StructType, value) -> list:
    return [builder.extract_value(value, k) for k in range(len(st.members))]


@lower_builtin(StructTypeRef, types.VarArg(types.Any))
def _lower_construct(context, builder, sig, args):
    st = sig.return_type
    return pack_struct(context, builder, st, [
        convert_member(context, builder, v, t, mt) for v, t, mt in zip(args, sig.args, st.members.values())])


@lower_getattr_generic(StructType)
def _lower_member(context, builder, st, value, attr):
    return builder.extract_value(value, list(st.members).index(attr))


@lower_cast(StructType, StructType)
def _lower_struct_cast(context, builder, from_ty, to_ty, value):
    return pack_struct(context, builder, to_ty, [
        convert_member(context, builder, v, ft, tt) for v, ft, tt in
        zip(member_values(builder, from_ty, value), from_ty.members.values(), to_ty.members.values())])


def member_store(target, name, value):
    """``target`` with its member (on a vector: component) ``name`` replaced by ``value``."""
    raise NotImplementedError("compiled code only")


@overload(member_store, prefer_literal=True)
def _member_store(target, name, value):
    if not isinstance(name, types.StringLiteral):
        return None
    attr = name.literal_value
    if isinstance(target, MatrixType):
        if attr not in SWIZZLE:
            raise typing_error(QuadrantsTypeError(
                f"cannot assign '{attr}' of a {target}: only components ({', '.join(SWIZZLE)}) can be assigned"))
        k = SWIZZLE[attr]
        return lambda target, name, value: matrix_with_item(target, k, value)
    if not isinstance(target, StructType):
        raise typing_error(QuadrantsTypeError(f"cannot assign to '.{attr}' of a {target} value"))
    if attr not in target.members:
        raise typing_error(QuadrantsTypeError(unknown_member(target, attr)))
    if not member_value_ok(target.members[attr], value):
        raise typing_error(QuadrantsTypeError(
            f"{target.type_name}: member '{attr}' is {target.members[attr]}, cannot assign a value of type {value}"))
    k = list(target.members).index(attr)
    return lambda target, name, value: _with_member(target, k, value)


@intrinsic(prefer_literal=True)
def _with_member(typingctx, target, index, value):
    """``target`` with member number ``index`` (a constant) replaced by ``value``."""
    if not isinstance(index, types.IntegerLiteral):
        return None
    k = index.literal_value
    member = list(target.members.values())[k]

    def codegen(context, builder, sig, args):
        return builder.insert_value(args[0], convert_member(context, builder, args[2], sig.args[2], member), k)

    return signature(target, target, index, value), codegen


def leaf_scalar_types(st: StructType) -> list:
    """The scalar types of a struct's leaves, depth first, vectors/matrices row-major (the order of
    ``Struct._flat_tuple`` and of a CUDA kernel's parameter slots)."""
    out = []
    for _, t in st.leaves():
        out += [t.dtype] * t.count if isinstance(t, MatrixType) else [t]
    return out


def _from_leaves(context, builder, st: StructType, leaves) -> llir.Value:
    values = []
    for t in st.members.values():
        if isinstance(t, StructType):
            values.append(_from_leaves(context, builder, t, leaves))
        elif isinstance(t, MatrixType):
            values.append(pack(context, builder, t, [leaves.pop(0) for _ in range(t.count)]))
        else:
            values.append(leaves.pop(0))
    return pack_struct(context, builder, st, values)


@unbox(StructType)
def _unbox_struct(typ, obj, c):
    # the call path converted the argument to a qd.Struct of this type (struct_argument)
    flat = c.pyapi.call_method(obj, "_flat_tuple", ())
    tuple_type = types.Tuple(leaf_scalar_types(typ))
    native = c.unbox(tuple_type, flat)
    c.pyapi.decref(flat)
    leaves = [c.builder.extract_value(native.value, k) for k in range(len(tuple_type))]
    return NativeValue(_from_leaves(c.context, c.builder, typ, leaves), is_error=native.is_error)
