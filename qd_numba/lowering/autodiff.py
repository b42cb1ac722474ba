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
* ``fwd_item(dual_base, index, value)``: forward mode's tangent of an element of a local vector;
* ``ad_local_open(size)``, ``ad_local_add(buf, index, g, strides, size)``, ``ad_local_get(buf, k)``:
  a zeroed per-thread buffer of ``size`` f64 adjoints of a small field (its address), the
  adjoint ``g`` of a read at ``index`` added to its row-major slot (``strides``; an index outside
  the field adds nothing), and slot ``k`` — a reverse task sums such adjoints per iteration and
  adds them to the ``.grad`` once (passes/autodiff.py).

Intrinsics, not ``@overload``: nothing goes through Numba's dispatcher (see lowering/spaces.py).
"""

from __future__ import annotations

import operator

from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic

from ..typing.matrix import MatrixType
from . import adstack as ad_stack
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


# -- adjoints of vector/matrix operations (rules in ops/matrix_methods.py and ops/math_ops.py) ------

def _float_values(context, builder, ty, val, dtype):
    """The elements of a matrix (or the one scalar) ``val`` of type ``ty``, cast to ``dtype``."""
    return _scalar_values(context, builder, types.unliteral(ty), val, dtype)


def _count(ty) -> int:
    ty = types.unliteral(ty)
    return ty.count if isinstance(ty, MatrixType) else 1


def _as_result(context, builder, rt, values):
    return pack(context, builder, rt, values) if isinstance(rt, MatrixType) else values[0]


def _mul_add(context, builder, dtype, pairs):
    total = context.get_constant(dtype, 0)
    for a, b in pairs:
        total = builder.fadd(total, builder.fmul(a, b))
    return total


def _matmul_shape(ty, left: bool):
    """(rows, columns) of a ``@`` operand: a vector is a row on the left, a column on the right."""
    if ty.ndim == 2:
        return ty.n, ty.m
    return (1, ty.n) if left else (ty.n, 1)


@intrinsic
def ad_matmul_adjoint(typingctx, a, b, g, side):
    """The adjoint of ``a`` (``side`` 0) or ``b`` (``side`` 1) of ``out = a @ b`` from ``out``'s
    adjoint ``g``: ``g @ b^T`` and ``a^T @ g`` on the 2-d views of the operands."""
    a, b, g = types.unliteral(a), types.unliteral(b), types.unliteral(g)
    if not (isinstance(a, MatrixType) and isinstance(b, MatrixType)
            and isinstance(side, types.IntegerLiteral)):
        return None
    which = side.literal_value
    rt = _adjoint_type(a if which == 0 else b)

    def codegen(context, builder, sig, args):
        dtype = rt.dtype
        (ar, ac), (br, bc) = _matmul_shape(a, True), _matmul_shape(b, False)
        av = _float_values(context, builder, a, args[0], dtype)
        bv = _float_values(context, builder, b, args[1], dtype)
        gv = _float_values(context, builder, g, args[2], dtype)
        if which == 0:      # da[i, p] = sum_j g[i, j] * b[p, j]
            out = [_mul_add(context, builder, dtype, [(gv[i * bc + j], bv[p * bc + j]) for j in range(bc)])
                   for i in range(ar) for p in range(ac)]
        else:               # db[p, j] = sum_i a[i, p] * g[i, j]
            out = [_mul_add(context, builder, dtype, [(av[i * ac + p], gv[i * bc + j]) for i in range(ar)])
                   for p in range(br) for j in range(bc)]
        return pack(context, builder, rt, out)

    return rt(a, b, g, side), codegen


@intrinsic
def ad_ctor_part(typingctx, g, k, items):
    """The adjoint of item ``k`` of a vector/matrix constructor's flattened items (scalars and
    vectors, row-major) from the constructed value's adjoint ``g``: its slice of ``g``."""
    g = types.unliteral(g)
    if not (isinstance(items, types.BaseTuple) and isinstance(k, types.IntegerLiteral)):
        return None
    index = k.literal_value
    rt = _adjoint_type(items.types[index])
    offset = sum(_count(t) for t in items.types[:index])

    def codegen(context, builder, sig, args):
        if rt is types.none:
            return context.get_dummy_value()
        dtype = rt.dtype if isinstance(rt, MatrixType) else rt
        if not isinstance(g, MatrixType):
            return _zero(context, builder, rt)
        gv = _float_values(context, builder, g, args[0], dtype)
        return _as_result(context, builder, rt, gv[offset:offset + _count(rt)])

    return rt(g, k, items), codegen


@intrinsic
def ad_eye_like(typingctx, a, g):
    """``g`` times the identity of ``a``'s shape: the adjoint of ``a.trace()``."""
    a = types.unliteral(a)
    if not isinstance(a, MatrixType):
        return None
    rt = _adjoint_type(a)

    def codegen(context, builder, sig, args):
        scale = _float_values(context, builder, sig.args[1], args[1], rt.dtype)[0]
        zero = context.get_constant(rt.dtype, 0)
        return pack(context, builder, rt, [scale if i % (a.m + 1) == 0 else zero for i in range(a.count)])

    return rt(a, g), codegen


@intrinsic
def ad_extreme(typingctx, a, out, g):
    """``g`` at the first element of ``a`` equal to ``out``, zeros elsewhere: the adjoint of
    ``a.max()``/``a.min()``."""
    a = types.unliteral(a)
    if not isinstance(a, MatrixType):
        return None
    rt = _adjoint_type(a)

    def codegen(context, builder, sig, args):
        dtype = rt.dtype
        av = _float_values(context, builder, a, args[0], dtype)
        best = _float_values(context, builder, sig.args[1], args[1], dtype)[0]
        scale = _float_values(context, builder, sig.args[2], args[2], dtype)[0]
        zero = context.get_constant(dtype, 0)
        taken = llir.Constant(llir.IntType(1), 0)
        values = []
        for v in av:
            hit = builder.and_(builder.fcmp_ordered("==", v, best), builder.not_(taken))
            values.append(builder.select(hit, scale, zero))
            taken = builder.or_(taken, hit)
        return pack(context, builder, rt, values)

    return rt(a, out, g), codegen


@intrinsic
def ad_cross_lhs(typingctx, b, g):
    """The adjoint of ``a`` in ``out = a.cross(b)`` from ``out``'s adjoint ``g``: ``b x g`` for 3-d
    vectors, ``g * (b[1], -b[0])`` for 2-d ones (their cross product is a scalar)."""
    b, g = types.unliteral(b), types.unliteral(g)
    if not (isinstance(b, MatrixType) and b.ndim == 1 and b.n in (2, 3)):
        return None
    rt = _adjoint_type(b)

    def codegen(context, builder, sig, args):
        dtype = rt.dtype
        bv = _float_values(context, builder, b, args[0], dtype)
        gv = _float_values(context, builder, g, args[1], dtype)
        if b.n == 2:
            minus = context.get_constant(dtype, -1)        # no fneg: NVVM's IR predates it
            out = [builder.fmul(gv[0], bv[1]), builder.fmul(gv[0], builder.fmul(bv[0], minus))]
        else:
            out = [builder.fsub(builder.fmul(bv[(i + 1) % 3], gv[(i + 2) % 3]),
                                builder.fmul(bv[(i + 2) % 3], gv[(i + 1) % 3])) for i in range(3)]
        return pack(context, builder, rt, out)

    return rt(b, g), codegen


# -- adstack words of vector/matrix values (passes/autodiff.py sizes them from inferred shapes) -----

_UNSIZED = ("kernel.grad: a vector or matrix value that changes inside a loop of a parallel loop, whose shape the "
            "adstack sizer cannot tell from the code (it follows fields, constructors, operators and methods); "
            "use scalar locals there")


def _elementwise_adstack(typingctx, stack, value, words):
    """The element type of a matrix ``value`` pushed as ``words`` words (checked: enough words)."""
    if not isinstance(words, types.IntegerLiteral) or value.count > words.literal_value:
        raise TypingError(_UNSIZED)
    return value.dtype


def _scalar_tuple(ty) -> bool:
    """A tuple of scalars (an index ``(0, c)`` built in a loop): pushed a word per component."""
    return isinstance(ty, types.BaseTuple) and len(ty) > 0 and \
        all(isinstance(t, (types.Integer, types.Float, types.Boolean)) for t in ty)


def _tuple_words(ty, words):
    if not isinstance(words, types.IntegerLiteral) or len(ty) > words.literal_value:
        raise TypingError(_UNSIZED)
    return [types.unliteral(t) for t in ty]


@intrinsic
def ad_push_words(typingctx, stack, top, value, words):
    """``ad_push`` of lowering/adstack.py for any value: a vector/matrix pushes its elements, a
    tuple of scalars its components, one word each (``words``: the words the sizer counted for
    it, at least their count)."""
    value = types.unliteral(value)
    if _scalar_tuple(value):
        parts = _tuple_words(value, words)
        psigs = [ad_stack.ad_push._defn(typingctx, stack, types.int64, t) for t in parts]

        def tuple_codegen(context, builder, s, args):
            t = context.cast(builder, args[1], s.args[1], types.int64)
            for k, (psig, inner) in enumerate(psigs):
                v = context.cast(builder, builder.extract_value(args[2], k), value[k], parts[k])
                t = inner(context, builder, psig, (args[0], t, v))
            return t

        return types.int64(stack, top, value, words), tuple_codegen
    if not isinstance(value, MatrixType):
        sig, inner = ad_stack.ad_push._defn(typingctx, stack, top, value)

        def scalar_codegen(context, builder, s, args):
            return inner(context, builder, sig, args[:3])

        return types.int64(stack, top, value, words), scalar_codegen
    dtype = _elementwise_adstack(typingctx, stack, value, words)
    esig, inner = ad_stack.ad_push._defn(typingctx, stack, types.int64, dtype)

    def codegen(context, builder, s, args):
        t = context.cast(builder, args[1], s.args[1], types.int64)
        for v in elements(builder, args[2], value):
            t = inner(context, builder, esig, (args[0], t, v))
        return t

    return types.int64(stack, top, value, words), codegen


@intrinsic
def ad_pop_top_words(typingctx, top, like, words):
    """The top after popping ``like`` (its element count for a vector/matrix)."""
    like = types.unliteral(like)
    if _scalar_tuple(like):
        count = len(_tuple_words(like, words))

        def tuple_codegen(context, builder, s, args):
            return builder.sub(context.cast(builder, args[0], s.args[0], types.int64), llir.Constant(_I64, count))

        return types.int64(top, like, words), tuple_codegen
    if not isinstance(like, MatrixType):
        sig, inner = ad_stack.ad_pop_top._defn(typingctx, top, like)

        def scalar_codegen(context, builder, s, args):
            return inner(context, builder, sig, args[:2])

        return types.int64(top, like, words), scalar_codegen
    _elementwise_adstack(typingctx, None, like, words)

    def codegen(context, builder, s, args):
        t = context.cast(builder, args[0], s.args[0], types.int64)
        return builder.sub(t, llir.Constant(llir.IntType(64), like.count))

    return types.int64(top, like, words), codegen


@intrinsic
def ad_pop_words(typingctx, stack, top, like, words):
    """The value of ``like``'s type at ``top`` (its elements at ``top``, ``top + 1``, ...)."""
    like = types.unliteral(like)
    if _scalar_tuple(like):
        parts = _tuple_words(like, words)
        psigs = [ad_stack.ad_pop._defn(typingctx, stack, types.int64, t) for t in parts]

        def tuple_codegen(context, builder, s, args):
            t = context.cast(builder, args[1], s.args[1], types.int64)
            values = []
            for k, (psig, inner) in enumerate(psigs):
                cur = context.cast(builder, builder.extract_value(args[2], k), like[k], parts[k])
                got = inner(context, builder, psig, (args[0], builder.add(t, llir.Constant(_I64, k)), cur))
                values.append(context.cast(builder, got, parts[k], like[k]))
            return context.make_tuple(builder, like, values)

        return like(stack, top, like, words), tuple_codegen
    if not isinstance(like, MatrixType):
        sig, inner = ad_stack.ad_pop._defn(typingctx, stack, top, like)

        def scalar_codegen(context, builder, s, args):
            return inner(context, builder, sig, args[:3])

        return like(stack, top, like, words), scalar_codegen
    dtype = _elementwise_adstack(typingctx, stack, like, words)
    esig, inner = ad_stack.ad_pop._defn(typingctx, stack, types.int64, dtype)

    def codegen(context, builder, s, args):
        t = context.cast(builder, args[1], s.args[1], types.int64)
        values = [inner(context, builder, esig, (args[0], builder.add(t, llir.Constant(llir.IntType(64), k)), v))
                  for k, v in enumerate(elements(builder, args[2], like))]
        return pack(context, builder, like, values)

    return like(stack, top, like, words), codegen


# -- per-thread sums of the adjoints of a small field (passes/autodiff.py) ---------------------------

_F64 = llir.DoubleType()
_I64 = llir.IntType(64)


@intrinsic
def ad_local_open(typingctx, size):
    if not isinstance(size, types.IntegerLiteral):
        return None
    arrty = llir.ArrayType(_F64, size.literal_value)

    def codegen(context, builder, sig, args):
        buf = cgutils.alloca_once(builder, arrty)
        builder.store(llir.Constant(arrty, None), buf)
        return builder.ptrtoint(buf, _I64)

    return types.int64(size), codegen


def _int_parts(builder, context, ty, value):
    if isinstance(ty, types.Integer):
        return [context.cast(builder, value, ty, types.int64)]
    return [context.cast(builder, builder.extract_value(value, k), t, types.int64) for k, t in enumerate(ty)]


@intrinsic
def ad_local_add(typingctx, buf, index, g, strides, size):
    index, g = types.unliteral(index), types.unliteral(g)
    parts = [index] if isinstance(index, types.Integer) else list(index) if isinstance(index, types.BaseTuple) else []
    if not parts or not all(isinstance(t, types.Integer) for t in parts) or not isinstance(g, types.Number):
        return None

    def codegen(context, builder, sig, args):
        flat = _I64(0)
        for k, v in zip(_int_parts(builder, context, sig.args[3], args[3]),
                        _int_parts(builder, context, sig.args[1], args[1])):
            flat = builder.add(flat, builder.mul(k, v))
        size_v = context.cast(builder, args[4], sig.args[4], types.int64)
        with builder.if_then(builder.icmp_unsigned("<", flat, size_v)):
            ptr = builder.gep(builder.inttoptr(args[0], _F64.as_pointer()), [flat])
            builder.store(builder.fadd(builder.load(ptr), context.cast(builder, args[2], g, types.float64)), ptr)
        return context.get_dummy_value()

    return types.none(buf, index, g, strides, size), codegen


@intrinsic
def ad_local_get(typingctx, buf, k):
    def codegen(context, builder, sig, args):
        slot = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.load(builder.gep(builder.inttoptr(args[0], _F64.as_pointer()), [slot]))

    return types.float64(buf, k), codegen
