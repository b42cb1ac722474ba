"""Compiled helpers of reverse-mode autodiff (passes/autodiff.py emits calls to them).

The transform runs on untyped IR, so it cannot know whether a value is a float, an integer, a
vector or a tuple; these intrinsics decide from the types, at typing time:

* ``zero_like(x)``: the zero adjoint of ``x`` — a zero of ``x``'s float type, of its vector/matrix
  type (float elements), ``0.0`` (float64) for integers and booleans (their adjoints are never
  read: integer casts stop gradients), ``None`` for anything else (tuples, arrays, ranges);
* ``ad_acc(adj, c)``: ``adj + c`` kept in ``adj``'s type; a vector contribution to a scalar
  adjoint is summed (broadcasting in the forward code); ``None`` adjoints stay ``None``;
* ``ad_item_adjoint(base, index, g)``: the contribution of ``base[index]``'s adjoint ``g`` to a
  local vector/matrix ``base`` (``g`` at ``index``, zeros elsewhere), ``None`` for other bases;
* ``stop_grad(x)``: ``x`` (the transform gives it no adjoint);
* ``fwd_item(dual_base, index, value)``: forward mode's tangent of an element of a local vector.

Intrinsics, not ``@overload``: nothing goes through Numba's dispatcher (see lowering/spaces.py).
"""

from __future__ import annotations

import operator

from numba.core import types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic

from ..typing.matrix import MatrixType
from .matrix import elements, matrix_with_item, pack


def _adjoint_type(ty):
    ty = types.unliteral(ty)
    if isinstance(ty, types.Float):
        return ty
    if isinstance(ty, (types.Integer, types.Boolean)):
        return types.float64
    if isinstance(ty, MatrixType):
        return ty if isinstance(ty.dtype, types.Float) else ty.with_dtype(types.float64)
    return types.none


def _zero(context, builder, ty):
    if isinstance(ty, MatrixType):
        return pack(context, builder, ty, [context.get_constant(ty.dtype, 0)] * ty.count)
    if isinstance(ty, types.Float):
        return context.get_constant(ty, 0)
    return context.get_dummy_value()


@intrinsic
def zero_like(typingctx, x):
    rt = _adjoint_type(x)

    def codegen(context, builder, sig, args):
        return _zero(context, builder, rt)

    return rt(x), codegen


def _scalar_values(context, builder, ty, val, dtype):
    """Elements of ``val`` (a matrix or a scalar) cast to ``dtype``."""
    if isinstance(ty, MatrixType):
        return [context.cast(builder, v, ty.dtype, dtype) for v in elements(builder, val, ty)]
    return [context.cast(builder, val, types.unliteral(ty), dtype)]


@intrinsic
def ad_acc(typingctx, adj, c):
    adj, c = types.unliteral(adj), types.unliteral(c)
    numeric = (types.Number, types.Boolean, MatrixType)
    if not isinstance(adj, (types.Float, MatrixType)) or not isinstance(c, numeric):
        keep = adj if isinstance(adj, (types.Float, MatrixType)) else types.none

        def keep_codegen(context, builder, sig, args):
            return args[0] if keep is not types.none else context.get_dummy_value()

        return keep(adj, c), keep_codegen
    if isinstance(c, MatrixType) and isinstance(adj, MatrixType) and c.shape != adj.shape:
        return None

    def codegen(context, builder, sig, args):
        dtype = adj.dtype if isinstance(adj, MatrixType) else adj
        mine = _scalar_values(context, builder, adj, args[0], dtype)
        theirs = _scalar_values(context, builder, c, args[1], dtype)
        if len(mine) == 1 and len(theirs) > 1:            # broadcast in the forward code: sum
            total = theirs[0]
            for v in theirs[1:]:
                total = builder.fadd(total, v)
            theirs = [total]
        elif len(theirs) == 1 and len(mine) > 1:
            theirs = theirs * len(mine)
        out = [builder.fadd(a, b) for a, b in zip(mine, theirs)]
        return pack(context, builder, adj, out) if isinstance(adj, MatrixType) else out[0]

    return adj(adj, c), codegen


@intrinsic
def ad_item_adjoint(typingctx, base, index, g):
    base, g = types.unliteral(base), types.unliteral(g)
    if not (isinstance(base, MatrixType) and isinstance(g, (types.Number, MatrixType))):
        def none_codegen(context, builder, sig, args):
            return context.get_dummy_value()

        return types.none(base, index, g), none_codegen
    rt = _adjoint_type(base)
    inner_sig, inner_codegen = matrix_with_item._defn(typingctx, rt, index, g)

    def codegen(context, builder, sig, args):
        zero = _zero(context, builder, rt)
        return inner_codegen(context, builder, inner_sig, (zero, args[1], args[2]))

    return rt(base, index, g), codegen


@intrinsic
def stop_grad(typingctx, x):
    """``qd.stop_grad(x)``: ``x``, with no gradient flowing through it."""

    def codegen(context, builder, sig, args):
        return impl_ret_borrowed(context, builder, x, args[0])

    return x(x), codegen


@intrinsic
def fwd_item(typingctx, dual_base, index, value):
    """Forward mode: the tangent of ``base[index]`` from ``base``'s tangent ``dual_base`` — its
    element when the tangent is a vector/matrix, else a zero of ``value``'s adjoint type."""
    rt = _adjoint_type(value)
    dual_base = types.unliteral(dual_base)
    item_sig = typingctx.resolve_function_type(operator.getitem, (dual_base, index), {}) \
        if isinstance(dual_base, MatrixType) else None
    if item_sig is None:
        def zero_codegen(context, builder, sig, args):
            return _zero(context, builder, rt)

        return rt(dual_base, index, value), zero_codegen

    def codegen(context, builder, sig, args):
        impl = context.get_function(operator.getitem, item_sig)
        item = impl(builder, (args[0], args[1]))
        return context.cast(builder, item, item_sig.return_type, rt)

    return rt(dual_base, index, value), codegen
