"""Numba types and typing rules for small vectors and matrices (``qd.Vector``, ``qd.Matrix``).

Responsibilities:

* :class:`MatrixType` — the type of a small vector (``ndim == 1``, ``n`` elements) or matrix
  (``ndim == 2``, ``n`` rows by ``m`` columns) with a scalar element ``dtype``. Values are
  immutable and flat (same LLVM layout as ``UniTuple(dtype, n * m)``, row-major; see
  ``qd_numba/lowering/matrix.py``). Calling a ``MatrixType`` instance builds a vector, both in
  Python scope and in compiled code (``vec3 = vector(3, f32); vec3(1, 2, 3)``).
* :class:`MatrixClassType` — the type of the ``qd.Vector`` / ``qd.Matrix`` classes themselves, so
  ``qd.Vector([a, b])`` and ``qd.Matrix.identity(f32, 3)`` type-check inside compiled code.
* The dtype rules (one place, shared by compiled code and the Python-scope classes):

  - **Element dtype of a constructor** (``qd.Vector([...])`` without ``dt=``): integers and
    bools give ``i32``; if any element is a float, the widest float element. Python float
    *constants* count as ``f32`` (the literal-list rewrite below turns them into ``float32``
    constants), so ``qd.Vector([x, 1.5])`` is ``f32`` unless ``x`` is ``f64``.
  - **Two matrices**: the operand dtype is :func:`promote` of both (float beats int; wider wins;
    at equal width, signed wins; bool counts as ``i32``).
  - **A matrix and a scalar** (either side): the matrix dtype wins, except that an integer matrix
    with a float scalar uses the scalar's float type. Numba types Python float constants as
    ``f64``, so this keeps ``vec_f32 * 0.5`` in ``f32``.
  - **Result dtype**: the operand dtype for ``+ - * // % **`` and unary ops (no widening of
    ``i32 + i32`` to ``i64`` as Numba does for scalars); ``/`` of integers gives ``f32``;
    comparisons give ``i32`` (0 or 1).
  - Math functions on integers compute in ``f32``, except
    ``abs floor ceil round min max clamp`` which keep the integer type.
  - Methods (``v.dot(w)``, ``m.inverse()`` ...): each row of ``qd_numba/ops/matrix_methods.py``
    states its result type with these helpers.

* The literal-list rewrite: ``qd.Vector([a, b])`` would otherwise build a heap list (unusable on
  GPU); a before-inference rewrite turns literal list arguments of ``qd.Vector``/``qd.Matrix``/
  ``MatrixType(...)`` calls into tuples.

Registrations go through Numba's generic registries (no ``target="cpu"``); lowering is in
``qd_numba/lowering/matrix.py``.
"""

from __future__ import annotations

import operator

import numpy as np
from numba.core import errors, ir, types
from numba.core.rewrites import Rewrite, register_rewrite
from numba.core.typing.templates import (
    AbstractTemplate,
    AttributeTemplate,
    infer_getattr,
    infer_global,
    make_callable_template,
    signature,
)
from numba.core.typing.typeof import typeof_impl

from ..dtypes import f32, i32


class MatrixType(types.Type):
    """A small vector (``ndim=1``: ``n`` elements) or ``n`` x ``m`` matrix (``ndim=2``)."""

    def __init__(self, dtype: types.Type, n: int, m: int = 1, ndim: int = 2):
        if ndim not in (1, 2):
            raise ValueError(f"ndim must be 1 or 2, got {ndim}")
        if ndim == 1:
            m = 1
        self.dtype = types.unliteral(dtype)
        self.n, self.m, self.ndim = int(n), int(m), int(ndim)
        name = f"vector({n}, {self.dtype})" if ndim == 1 else f"matrix({n}, {m}, {self.dtype})"
        super().__init__(name=name)

    @property
    def key(self):
        return self.dtype, self.n, self.m, self.ndim

    @property
    def count(self) -> int:
        return self.n * self.m

    @property
    def shape(self) -> tuple:
        return (self.n,) if self.ndim == 1 else (self.n, self.m)

    @property
    def is_vector(self) -> bool:
        return self.ndim == 1

    def with_dtype(self, dtype) -> MatrixType:
        return MatrixType(dtype, self.n, self.m, self.ndim)

    # The class of these values in Python scope (qd.Matrix). It lives above typing, in
    # qd_numba/matrix.py, which sets this when it defines the class.
    python_class: type | None = None

    def __call__(self, *args):
        # ``vec3(f32, f32)`` stays a Numba signature; ``vec3(1, 2, 3)`` builds a python vector.
        if args and all(isinstance(a, types.Type) for a in args):
            return signature(self, *args)
        return self.python_class.of_type(self, args)

    def from_elements(self, values: tuple):
        """The Python-scope value of this type with these elements, row-major (boxing, and the
        return value of a CUDA kernel)."""
        return self.python_class.from_elements(self, values)

    def unify(self, typingctx, other):
        if isinstance(other, MatrixType) and other.shape == self.shape:
            return self.with_dtype(promote(self.dtype, other.dtype))
        return None

    def can_convert_to(self, typingctx, other):
        if isinstance(other, MatrixType) and other.shape == self.shape:
            return typingctx.can_convert(self.dtype, other.dtype)
        return None


class MatrixTypeRef(types.TypeRef):
    """``typeof(vector(3, f32))``: a TypeRef of its own class, so that calling it in compiled
    code is lowered by our constructor (Numba lowers a TypeRef call under the callee's type class,
    and the generic ``TypeRef`` one redirects to ``numba_typeref_ctor``)."""


@typeof_impl.register(MatrixType)
def _typeof_matrix_type(val, c):
    return MatrixTypeRef(val)


class MatrixClassType(types.Opaque):
    """The type of the ``qd.Vector`` / ``qd.Matrix`` classes (``kind`` is "Vector" or "Matrix")."""

    def __init__(self, kind: str):
        self.kind = kind
        super().__init__(name=f"qd.{kind}")

    @property
    def key(self):
        return self.kind


VectorClass = MatrixClassType("Vector")
MatrixClass = MatrixClassType("Matrix")


# ---------------------------------------------------------------------------------------------
# dtype rules
# ---------------------------------------------------------------------------------------------


def arith_dtype(t: types.Type) -> types.Type:
    """The dtype arithmetic on ``t`` computes in: bools count as i32."""
    t = types.unliteral(t)
    return i32 if isinstance(t, types.Boolean) else t


def is_scalar(t) -> bool:
    return isinstance(types.unliteral(t), (types.Integer, types.Float, types.Boolean))


def promote(a: types.Type, b: types.Type) -> types.Type:
    """Operand dtype of two matrix element types (see the module docstring)."""
    a, b = arith_dtype(a), arith_dtype(b)
    if a == b:
        return a
    fa, fb = isinstance(a, types.Float), isinstance(b, types.Float)
    if fa != fb:
        return a if fa else b
    if a.bitwidth != b.bitwidth:
        return a if a.bitwidth > b.bitwidth else b
    if fa:
        return a
    return a if a.signed else b


def broadcast_dtype(mat_dtype: types.Type, scalar: types.Type) -> types.Type:
    """Operand dtype of a matrix with dtype ``mat_dtype`` and a scalar of type ``scalar``."""
    mat_dtype, scalar = arith_dtype(mat_dtype), arith_dtype(scalar)
    if isinstance(scalar, types.Float) and isinstance(mat_dtype, types.Integer):
        return scalar
    return mat_dtype


def default_float(t: types.Type) -> types.Type:
    """The float type math on ``t`` computes in: floats keep their type, integers and bools use
    f32 (Quadrants' default float; Numba's int64 loop indices would otherwise force f64)."""
    t = arith_dtype(t)
    return t if isinstance(t, types.Float) else f32


def constructor_dtype(elem_types) -> types.Type:
    """Element dtype of ``qd.Vector([...])`` without ``dt=`` (see the module docstring)."""
    floats = [types.unliteral(t) for t in elem_types if isinstance(types.unliteral(t), types.Float)]
    if not floats:
        return i32
    return max(floats, key=lambda t: t.bitwidth)


ARITH_OPS = {
    operator.add: operator.iadd,
    operator.sub: operator.isub,
    operator.mul: operator.imul,
    operator.truediv: operator.itruediv,
    operator.floordiv: operator.ifloordiv,
    operator.mod: operator.imod,
    operator.pow: operator.ipow,
}
INPLACE_TO_OP = {v: k for k, v in ARITH_OPS.items()}
COMPARE_OPS = (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne)
UNARY_OPS = (operator.neg, operator.pos, abs)


def binop_result_dtype(op, operand: types.Type) -> types.Type:
    """Element dtype of ``op`` applied to two elements of dtype ``operand``."""
    op = INPLACE_TO_OP.get(op, op)
    if op in COMPARE_OPS:
        return i32
    if op is operator.truediv:
        return default_float(operand)
    return operand


def binop_dtypes(op, a: types.Type, b: types.Type):
    """``(operand dtype, result MatrixType)`` of ``a op b`` where a or b is a MatrixType.

    Raises ``TypingError`` naming both shapes when they differ."""
    if isinstance(a, MatrixType) and isinstance(b, MatrixType):
        if a.shape != b.shape or a.ndim != b.ndim:
            raise errors.TypingError(
                f"shape mismatch in '{_op_symbol(op)}': {shape_str(a)} and {shape_str(b)}"
            )
        operand, shape_of = promote(a.dtype, b.dtype), a
    elif isinstance(a, MatrixType) and is_scalar(b):
        operand, shape_of = broadcast_dtype(a.dtype, b), a
    elif isinstance(b, MatrixType) and is_scalar(a):
        operand, shape_of = broadcast_dtype(b.dtype, a), b
    else:
        return None
    return operand, shape_of.with_dtype(binop_result_dtype(op, operand))


def shape_str(t: MatrixType) -> str:
    """``vector(3, float32) of shape (3,)``: a type and its shape, for error messages."""
    shape = f"({t.n},)" if t.ndim == 1 else f"({t.n}, {t.m})"
    return f"{t} of shape {shape}"


_SYMBOLS = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
    operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=", operator.eq: "==",
    operator.ne: "!=",
}


def _op_symbol(op) -> str:
    op = INPLACE_TO_OP.get(op, op)
    return _SYMBOLS.get(op, getattr(op, "__name__", str(op)))


def matmul_type(a: MatrixType, b: MatrixType):
    """Result type of ``a @ b``: mat@mat, mat@vec, vec@mat, vec@vec (the dot product)."""
    ka = a.n if a.ndim == 1 else a.m
    kb = b.n
    if ka != kb:
        raise errors.TypingError(
            f"shape mismatch in '@': {shape_str(a)} and {shape_str(b)} (inner sizes {ka} != {kb})"
        )
    dtype = promote(a.dtype, b.dtype)
    if a.ndim == 1 and b.ndim == 1:
        return dtype
    if a.ndim == 1:
        return MatrixType(dtype, b.m, 1, 1)
    if b.ndim == 1:
        return MatrixType(dtype, a.n, 1, 1)
    return MatrixType(dtype, a.n, b.m, 2)


# ---------------------------------------------------------------------------------------------
# constructor arguments: flattening scalars, tuples and vectors
# ---------------------------------------------------------------------------------------------


def flat_element_types(ty) -> list:
    """Scalar element types of a constructor argument, row-major; raises TypingError otherwise."""
    ty = types.unliteral(ty) if not isinstance(ty, types.BaseTuple) else ty
    if isinstance(ty, MatrixType):
        return [ty.dtype] * ty.count
    if isinstance(ty, types.BaseTuple):
        return [e for t in ty.types for e in flat_element_types(t)]
    if is_scalar(ty):
        return [ty]
    if isinstance(ty, types.List):
        raise errors.TypingError(
            "qd.Vector/qd.Matrix need a literal list or a tuple of values, not a list variable"
        )
    raise errors.TypingError(f"cannot build a vector/matrix from a value of type {ty}")


def literal_shape(ty):
    """Shape ``(n,)`` or ``(n, m)`` of a nested tuple argument of ``qd.Matrix``/``qd.Vector``."""
    if isinstance(ty, MatrixType):
        return ty.shape
    if isinstance(ty, types.BaseTuple):
        rows = [literal_shape(t) for t in ty.types]
        if not rows:
            raise errors.TypingError("cannot build an empty vector/matrix")
        if all(r == () for r in rows):
            return (len(rows),)
        if all(len(r) == 1 for r in rows) and len(set(rows)) == 1:
            return (len(rows), rows[0][0])
        raise errors.TypingError(f"ragged or too deeply nested matrix literal: {ty}")
    return ()


def dtype_arg(ty, what="dt"):
    """The element dtype given by a ``dt=`` / ``dtype`` argument type, or None when omitted."""
    if ty is None or isinstance(ty, (types.Omitted, types.NoneType)):
        return None
    if isinstance(ty, types.NumberClass):
        return ty.instance_type
    if isinstance(ty, types.TypeRef) and is_scalar(ty.instance_type):
        return ty.instance_type
    if isinstance(ty, types.DType):
        return ty.dtype
    raise errors.TypingError(f"{what} must be a qd dtype such as qd.f32, got {ty}")


def int_literal_arg(ty, what: str) -> int:
    if isinstance(ty, types.IntegerLiteral):
        return ty.literal_value
    if isinstance(ty, types.Omitted) and isinstance(ty.value, int):
        return ty.value
    raise errors.TypingError(f"{what} must be a compile-time integer constant, got {ty}")


def construct_type(kind: str, values, dt) -> MatrixType:
    """Result type of ``qd.Vector(values, dt)`` / ``qd.Matrix(values, dt)``."""
    shape = literal_shape(values)
    if shape == ():
        raise errors.TypingError(f"qd.{kind} needs a list or tuple of values, got {values}")
    dtype = dtype_arg(dt) or constructor_dtype(flat_element_types(values))
    if kind == "Vector" or len(shape) == 1:
        if kind == "Vector" and len(shape) != 1:
            raise errors.TypingError(f"qd.Vector needs a flat list of values, got {values}")
        return MatrixType(dtype, shape[0], 1, 1)
    return MatrixType(dtype, shape[0], shape[1], 2)


def type_call_check(mt: MatrixType, args) -> None:
    """Check the arguments of ``mt(*args)``: exactly ``mt.count`` scalars after flattening, or
    one scalar (fill)."""
    flat = [e for a in args for e in flat_element_types(a)]
    if len(flat) == mt.count or (len(args) == 1 and is_scalar(args[0])):
        return
    raise errors.TypingError(f"{mt} takes {mt.count} values (or one scalar to fill), got {len(flat)}")


# ---------------------------------------------------------------------------------------------
# typing templates: constructors
# ---------------------------------------------------------------------------------------------


class ConstructorKeys:
    """Keys under which the lowering registers the constructors (stable, hashable objects).

    ``qd.Vector(...)``/``qd.Matrix(...)`` and ``vec3(...)`` are lowered under their callee types
    (``MatrixClassType``, ``MatrixType``), as Numba does for calls of non-function types."""

    vector = "qd.Vector"
    matrix = "qd.Matrix"
    type_call = "qd.MatrixType.__call__"
    zero = "qd.Matrix.zero"
    identity = "qd.Matrix.identity"
    unit = "qd.Vector.unit"


_FUNCTION_TYPES: dict = {}


def _function_type(cache_key, impl_key, typer) -> types.Function:
    """One ``types.Function`` per ``cache_key``: type inference re-resolves attributes and must
    get an identical type each time."""
    fnty = _FUNCTION_TYPES.get(cache_key)
    if fnty is None:
        fnty = types.Function(make_callable_template(key=impl_key, typer=typer))
        _FUNCTION_TYPES[cache_key] = fnty
    return fnty


@infer_getattr
class MatrixClassAttribute(AttributeTemplate):
    key = MatrixClassType

    def resolve___call__(self, classty):
        kind = classty.kind

        def typer(values, dt=None):
            return construct_type(kind, values, dt)

        key = ConstructorKeys.vector if kind == "Vector" else ConstructorKeys.matrix
        return _function_type((kind, "__call__"), key, typer)

    def resolve_zero(self, classty):
        if classty.kind == "Vector":

            def typer(dtype, n):
                return MatrixType(dtype_arg(dtype, "dtype"), int_literal_arg(n, "n"), 1, 1)

        else:

            def typer(dtype, n, m):
                return MatrixType(dtype_arg(dtype, "dtype"), int_literal_arg(n, "n"),
                                  int_literal_arg(m, "m"), 2)

        return _function_type((classty.kind, "zero"), ConstructorKeys.zero, typer)

    def resolve_identity(self, classty):
        def typer(dtype, n):
            n = int_literal_arg(n, "n")
            return MatrixType(dtype_arg(dtype, "dtype"), n, n, 2)

        return _function_type((classty.kind, "identity"), ConstructorKeys.identity, typer)

    def resolve_unit(self, classty):
        def typer(n, i, dt=None):
            if not isinstance(types.unliteral(i), types.Integer):
                raise errors.TypingError(f"Vector.unit index must be an integer, got {i}")
            return MatrixType(dtype_arg(dt) or f32, int_literal_arg(n, "n"), 1, 1)

        return _function_type((classty.kind, "unit"), ConstructorKeys.unit, typer)


# ---------------------------------------------------------------------------------------------
# typing templates: operators
# ---------------------------------------------------------------------------------------------


def _register_binop(op):
    class BinOp(AbstractTemplate):
        key = op

        def generic(self, args, kws):
            if len(args) != 2 or kws:
                return None
            a, b = args
            if not (isinstance(a, MatrixType) or isinstance(b, MatrixType)):
                return None
            res = binop_dtypes(op, a, b)
            if res is None:
                return None
            return signature(res[1], types.unliteral(a), types.unliteral(b))

    infer_global(op)(BinOp)


for _op in (*ARITH_OPS, *ARITH_OPS.values(), *COMPARE_OPS):
    _register_binop(_op)


def _register_matmul(op):
    class MatMul(AbstractTemplate):
        key = op

        def generic(self, args, kws):
            if len(args) == 2 and all(isinstance(a, MatrixType) for a in args):
                return signature(matmul_type(*args), *args)
            return None

    infer_global(op)(MatMul)


_register_matmul(operator.matmul)
_register_matmul(operator.imatmul)


def _register_unary(op):
    class Unary(AbstractTemplate):
        key = op

        def generic(self, args, kws):
            if len(args) == 1 and isinstance(args[0], MatrixType):
                return signature(args[0].with_dtype(arith_dtype(args[0].dtype)), *args)
            return None

    infer_global(op)(Unary)


for _op in UNARY_OPS:
    _register_unary(_op)


@infer_global(len)
class MatrixLen(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 1 and isinstance(args[0], MatrixType):
            return signature(types.intp, *args)
        return None


def getitem_type(mt: MatrixType, idx):
    """Result type of ``mt[idx]``: an element, or a row vector for ``matrix[i]``."""
    if isinstance(idx, types.BaseTuple):
        if mt.ndim != 2 or len(idx) != 2 or not all(isinstance(types.unliteral(t), types.Integer)
                                                     for t in idx.types):
            raise errors.TypingError(f"cannot index {mt} with {idx}")
        return mt.dtype
    if isinstance(types.unliteral(idx), types.Integer):
        return mt.dtype if mt.ndim == 1 else MatrixType(mt.dtype, mt.m, 1, 1)
    raise errors.TypingError(f"cannot index {mt} with {idx}")


@infer_global(operator.getitem)
class MatrixGetItem(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 2 and isinstance(args[0], MatrixType):
            mt, idx = args
            return signature(getitem_type(mt, idx), mt, idx)
        return None


@infer_global(operator.setitem)
class MatrixSetItem(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 3 and isinstance(args[0], MatrixType):
            raise errors.TypingError(
                f"{args[0]} values are immutable: write 'v = matrix_with_item(v, i, x)' instead of "
                "'v[i] = x'"
            )
        return None


# ---------------------------------------------------------------------------------------------
# typing templates: attributes (the methods are a table: qd_numba/ops/matrix_methods.py)
# ---------------------------------------------------------------------------------------------

# component names of a vector, as in Quadrants (GLSL): v.x / v.r / v.s is v[0], ...
SWIZZLE = {name: k for group in ("xyzw", "rgba", "stpq") for k, name in enumerate(group)}
_SWIZZLE_GROUPS = ("xyzw", "rgba", "stpq")


def swizzle_indices(attr: str) -> tuple | None:
    """``v.zyx``, ``v.rg``, ``v.xxyy``: the component indices of a swizzle of 2 to 4 letters of one
    set (xyzw, rgba or stpq), or None when ``attr`` is not one."""
    if not 2 <= len(attr) <= 4:
        return None
    for group in _SWIZZLE_GROUPS:
        if all(ch in group for ch in attr):
            return tuple(group.index(ch) for ch in attr)
    return None


@infer_getattr
class MatrixAttribute(AttributeTemplate):
    key = MatrixType

    def generic_resolve(self, mt, attr):
        if attr in SWIZZLE:
            if mt.ndim != 1 or SWIZZLE[attr] >= mt.n:
                raise errors.TypingError(f"{mt} has no component '{attr}'")
            return mt.dtype
        indices = swizzle_indices(attr)
        if indices is not None:
            if mt.ndim != 1 or max(indices) >= mt.n:
                raise errors.TypingError(f"{mt} has no swizzle '{attr}'")
            return MatrixType(mt.dtype, len(indices), ndim=1)
        if attr == "n":
            return types.IntegerLiteral(mt.n)
        if attr == "m":
            return types.IntegerLiteral(mt.m)
        return None

    def resolve___call__(self, mt):
        """``vec3(a, b, c)`` where ``vec3 = vector(3, f32)`` is a global: Numba types a call of
        ``TypeRef(vec3)`` as a call of the instance type."""
        fnty = _FUNCTION_TYPES.get(mt)
        if fnty is None:

            class TypeCall(AbstractTemplate):
                key = ConstructorKeys.type_call

                def generic(self, args, kws):
                    if kws:
                        raise errors.TypingError(f"{mt}(...) takes no keyword arguments")
                    type_call_check(mt, args)
                    return signature(mt, *args)

            fnty = _FUNCTION_TYPES[mt] = types.Function(TypeCall)
        return fnty


# ---------------------------------------------------------------------------------------------
# before-inference rewrite: literal lists given to constructors become tuples
# ---------------------------------------------------------------------------------------------


def _resolve_callee(ir_mod, func_ir, var, depth=0):
    """The Python object a call's function variable names (globals and module attributes)."""
    if depth > 4:
        return None
    try:
        defn = func_ir.get_definition(var)
    except KeyError:
        return None
    if isinstance(defn, (ir_mod.Global, ir_mod.FreeVar)):
        return defn.value
    if isinstance(defn, ir_mod.Expr) and defn.op == "getattr":
        base = _resolve_callee(ir_mod, func_ir, defn.value, depth + 1)
        return getattr(base, defn.attr, None) if base is not None else None
    return None


def _is_constructor(obj) -> bool:
    return isinstance(obj, MatrixType) or getattr(obj, "_qd_matrix_constructor", False)


def matrix_literal_rewrite(ir_mod, rewrite_base):
    """The ``RewriteMatrixLiteralLists`` rewrite for one IR flavour (``numba.core.ir`` with
    Numba's ``Rewrite``; numba-cuda registers its twin, targets/cuda/compile.py)."""

    class RewriteMatrixLiteralLists(rewrite_base):
        """``qd.Vector([a, 1.5])`` -> ``qd.Vector((a, float32(1.5)))``.

        A literal list argument (nested lists included) of a matrix constructor becomes a tuple,
        so no heap list is built; without ``dt=`` (and for ``qd.Vector``/``qd.Matrix`` only)
        Python float constants become ``float32`` constants, the default float of Quadrants."""

        def match(self, func_ir, block, typemap, calltypes):
            self._func_ir = func_ir
            self._block = block
            self._todo = []
            for stmt in block.body:
                if not (isinstance(stmt, ir_mod.Assign) and isinstance(stmt.value, ir_mod.Expr)
                        and stmt.value.op == "call"):
                    continue
                callee = _resolve_callee(ir_mod, func_ir, stmt.value.func)
                if callee is None or not _is_constructor(callee):
                    continue
                narrow = not isinstance(callee, MatrixType) and not any(k == "dt" for k, _ in stmt.value.kws)
                lists = []
                for arg in stmt.value.args:
                    self._collect_lists(arg, lists, 0)
                if lists:
                    self._todo.append((stmt, lists, narrow))
            return bool(self._todo)

        def _collect_lists(self, var, out, depth):
            if depth > 2 or not var.name.startswith("$"):
                return
            try:
                defn = self._func_ir.get_definition(var)
            except KeyError:
                return
            if not (isinstance(defn, ir_mod.Expr) and defn.op == "build_list"):
                return
            if not any(isinstance(s, ir_mod.Assign) and s.value is defn for s in self._block.body):
                return  # built in another block: leave it (typing then reports a list argument)
            out.append(defn)
            for item in defn.items:
                self._collect_lists(item, out, depth + 1)

        def apply(self):
            block = self._block
            todo_lists = {id(lst) for _, lists, _ in self._todo for lst in lists}
            narrow_lists = {id(lst) for _, lists, narrow in self._todo if narrow for lst in lists}
            new_body = []
            for stmt in block.body:
                value = stmt.value if isinstance(stmt, ir_mod.Assign) else None
                if id(value) in todo_lists:
                    if id(value) in narrow_lists:
                        value.items = [self._narrow_const(item, new_body) for item in value.items]
                    value.op = "build_tuple"
                new_body.append(stmt)
            block.body = new_body
            return block

        def _narrow_const(self, var, new_body):
            try:
                defn = self._func_ir.get_definition(var)
            except KeyError:
                return var
            if isinstance(defn, ir_mod.Const) and type(defn.value) is float:
                tmp = self._block.scope.redefine("$qd_f32_const", var.loc)
                const = ir_mod.Const(np.float32(defn.value), var.loc)
                new_body.append(ir_mod.Assign(const, tmp, var.loc))
                self._func_ir._definitions[tmp.name] = [const]
                return tmp
            return var

    return RewriteMatrixLiteralLists


RewriteMatrixLiteralLists = register_rewrite("before-inference")(matrix_literal_rewrite(ir, Rewrite))
