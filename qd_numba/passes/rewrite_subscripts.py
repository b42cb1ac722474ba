"""RewriteSubscripts: Quadrants' meaning of subscript updates, atomics and division.

The rewrites are a table of ``(pattern, rewrite)`` rows (:data:`PATTERNS`), tried in order on
every statement; the first row whose matcher accepts the statement replaces it (global data =
a field or an ndarray argument, ``L`` a local value):

==========================================  =============================================
``G[I] op= V`` (op in + - & | ^)            ``atomic_update(G, I, V, op)``: atomic RMW
``G[I][J] op= V`` (vector field component)  ``nested_atomic(G, I, J, V, op)``
``G[I] = V``                                kept (a plain store)
``L[I] = V`` (local vector/matrix)          ``L = subscript_store(L, I, V)``: value update
``L.x = V`` (component xyzw, rgba, stpq)    as ``L[0] = V``; ``L.x`` is ``L[0]`` in all of these
``G[I][J] = V``                             ``T = G[I]; T[J] = V; G[I] = T`` (value types)
``L[I][J] = V``, ``L[I].x = V`` (local)     ``T = L[I]; T[J] = V; L = subscript_store(L, I, T)``
``qd.atomic_<op>(G[I], V)``                 ``atomic_update(G, I, V, op)``: returns old
``qd.atomic_<op>(G[I][J], V)``              ``nested_atomic(G, I, J, V, op)``: returns old
``qd.atomic_<op>(L[I], V)``                 ``old = L[I]; L = subscript_store(L, I, L[I] op V)``
``qd.atomic_<op>(L, V)`` (local scalar)     ``old = L; L = L op V``
``qd.atomic_cas(X, E, D)`` (X as above)      as ``qd.atomic_<op>(X, V)``, with ``atomic_cas_update``
                                            (``nested_atomic_cas``) and ``L = cas_value(L, E, D)``
``qd.volatile_load(G[I])``                  ``volatile_element_load(G, I)`` (ops/volatile.py);
                                            any other argument is a ``QuadrantsSyntaxError``
``a / b``                                   ``true_divide(a, b, default_fp)``: ints give ``default_fp``
==========================================  =============================================

Other ``op=`` (``*=``, ``/=`` ...) stay plain read-modify-writes, as in Quadrants.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable

from ..errors import QuadrantsSyntaxError, QuadrantsTypeError
from ..lang import ATOMIC_FUNCTIONS as _BASIC_ATOMICS
from ..lowering import subscripts as impl
from ..ops.atomics import ARITY as _ATOMIC_ARITY
from ..ops.atomics import MORE_ATOMICS
from ..ops.volatile import volatile_element_load, volatile_load
from ..typing.matrix import SWIZZLE
from .base import MISSING, is_global_data, try_static
from .ir_builder import emit_call

ATOMIC_FUNCTIONS = {**_BASIC_ATOMICS, **MORE_ATOMICS}
_AUG_OPS = {operator.iadd: "add", operator.isub: "sub", operator.iand: "and",
            operator.ior: "or", operator.ixor: "xor"}


@dataclasses.dataclass(frozen=True)
class Subscript:
    """``base[index]``: the index as a variable, or as a constant (``static_getitem``)."""
    base: object
    index_var: object
    const_index: object = None


def subscript_of(state, var):
    """The Subscript ``var`` is defined by, or None."""
    d = state.definition(var)
    ir = state.ir
    if isinstance(d, ir.Expr) and d.op == "getitem":
        return Subscript(d.value, d.index)
    if isinstance(d, ir.Expr) and d.op == "static_getitem":
        return Subscript(d.value, d.index_var, d.index)
    if isinstance(d, ir.Expr) and d.op == "getattr" and d.attr in SWIZZLE:  # v.x is v[0]
        return Subscript(d.value, None, SWIZZLE[d.attr])
    return None


class _Emitter:
    """Builds the replacement statements of one rewrite in ``block``."""

    def __init__(self, state, block, loc):
        self.state, self.block, self.loc, self.ir = state, block, loc, state.ir
        self.out = []

    def var(self, hint):
        return self.block.scope.redefine(hint, self.loc)

    def const(self, value):
        var = self.var("$qd_const")
        self.out.append(self.ir.Assign(self.ir.Const(value, self.loc), var, self.loc))
        return var

    def index(self, sub: Subscript):
        """A variable holding ``sub``'s index (static_getitem may only have a constant)."""
        return sub.index_var if sub.index_var is not None else self.const(sub.const_index)

    def call(self, fn, args, target):
        self.out += emit_call(self.ir, fn, args, target, self.loc, self.var(f"$qd_{fn.__name__}"))
        return target

    def assign(self, value, target):
        self.out.append(self.ir.Assign(value, target, self.loc))


# -- matchers: statement -> match dict or None --------------------------------------------------------

def _store(state, stmt):
    """``target[index] = value`` (or ``target.x = value``): target, the index as a Subscript of the
    target, the value."""
    ir = state.ir
    if isinstance(stmt, ir.SetItem):
        return {"target": stmt.target, "sub": Subscript(stmt.target, stmt.index), "value": stmt.value}
    if isinstance(stmt, ir.StaticSetItem):
        return {"target": stmt.target, "sub": Subscript(stmt.target, stmt.index_var, stmt.index),
                "value": stmt.value}
    if isinstance(stmt, ir.SetAttr) and stmt.attr in SWIZZLE:   # v.x = value is v[0] = value
        return {"target": stmt.target, "sub": Subscript(stmt.target, None, SWIZZLE[stmt.attr]),
                "value": stmt.value}
    return None


def _aug_store(state, stmt):
    """``T[I] op= V``: a store of ``T[I] <inplace op> V`` back into ``T[I]``."""
    m = _store(state, stmt)
    if m is None:
        return None
    ir = state.ir
    vdef = state.definition(m["value"])
    if not (isinstance(vdef, ir.Expr) and vdef.op == "inplace_binop" and vdef.fn in _AUG_OPS):
        return None
    loaded = subscript_of(state, vdef.lhs)
    if loaded is None or loaded.base.name != m["target"].name:
        return None
    return {**m, "op": _AUG_OPS[vdef.fn], "rhs": vdef.rhs}


def _match_aug_global(state, stmt):
    m = _aug_store(state, stmt)
    return m if m is not None and is_global_data(state, m["target"]) else None


def _match_aug_nested(state, stmt):
    m = _aug_store(state, stmt)
    if m is None:
        return None
    outer = subscript_of(state, m["target"])
    return {**m, "outer": outer} if outer is not None and is_global_data(state, outer.base) else None


def _match_global_store(state, stmt):
    m = _store(state, stmt)
    return m if m is not None and is_global_data(state, m["target"]) else None


def _match_local_store(state, stmt):
    m = _store(state, stmt)
    if m is None:
        return None
    outer = subscript_of(state, m["target"])
    if outer is not None and is_global_data(state, outer.base):
        return {**m, "outer": outer}
    # L[I][J] = V, L[I].x = V: the row is a temporary, written back into the local L
    row_of = outer if outer is not None and state.is_temp(m["target"]) else None
    return {**m, "outer": None, "row_of": row_of}


def _atomic_call(state, stmt):
    """``target = qd.atomic_<op>(dest, value)``."""
    ir = state.ir
    if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call"):
        return None
    expr = stmt.value
    fn = try_static(state, expr.func)
    if fn is MISSING or not callable(fn) or fn not in ATOMIC_FUNCTIONS:
        return None
    op = ATOMIC_FUNCTIONS[fn]
    arity = _ATOMIC_ARITY.get(op, 2)
    if len(expr.args) != arity or expr.kws:
        raise state.error(QuadrantsTypeError, f"qd.{fn.__name__}() takes {arity} arguments", stmt.loc)
    dest, *values = expr.args
    # ``qd.atomic_add(x[i], v)`` passes a temporary loaded from x[i]: the target is x[i].
    # ``s = x[i]; qd.atomic_add(s, v)`` targets the local s.
    sub = subscript_of(state, dest) if state.is_temp(dest) else None
    return {"target": stmt.target, "dest": dest, "value": values[0], "values": values, "op": op, "sub": sub}


def _match_atomic_global(state, stmt):
    m = _atomic_call(state, stmt)
    return m if m is not None and m["sub"] is not None and is_global_data(state, m["sub"].base) else None


def _match_atomic_nested(state, stmt):
    m = _atomic_call(state, stmt)
    if m is None or m["sub"] is None:
        return None
    outer = subscript_of(state, m["sub"].base)
    return {**m, "outer": outer} if outer is not None and is_global_data(state, outer.base) else None


def _match_atomic_local_element(state, stmt):
    m = _atomic_call(state, stmt)
    return m if m is not None and m["sub"] is not None else None


def _match_atomic_local(state, stmt):
    return _atomic_call(state, stmt)


def _match_volatile_load(state, stmt):
    """``target = qd.volatile_load(G[I])``; our error for any other argument."""
    ir = state.ir
    if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call"):
        return None
    expr = stmt.value
    fn = try_static(state, expr.func)
    if fn is not volatile_load:
        return None
    if len(expr.args) != 1 or expr.kws:
        raise state.error(QuadrantsSyntaxError, "qd.volatile_load() takes 1 argument (an element x[i])", stmt.loc)
    (arg,) = expr.args
    if is_global_data(state, arg):
        raise state.error(QuadrantsSyntaxError, "cannot pass a field or ndarray directly to qd.volatile_load; "
                          "index it first (x[i], or x[None] for a 0-d field)", stmt.loc)
    sub = subscript_of(state, arg) if state.is_temp(arg) else None
    if sub is None or not is_global_data(state, sub.base):
        what = "a component of an element" if sub is not None and subscript_of(state, sub.base) is not None \
            else "a local value"
        raise state.error(QuadrantsSyntaxError, "qd.volatile_load requires an element of a field or ndarray "
                          f"(x[i]) as its argument, got {what}", stmt.loc)
    return {"target": stmt.target, "sub": sub}


def _volatile_load(e, m):
    e.call(volatile_element_load, [m["sub"].base, e.index(m["sub"])], m["target"])


def _match_true_divide(state, stmt):
    ir = state.ir
    if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "binop" \
            and stmt.value.fn is operator.truediv:
        return {"target": stmt.target, "lhs": stmt.value.lhs, "rhs": stmt.value.rhs,
                "default_fp": state.config.default_fp}
    return None


# -- rewrites: (emitter, match) -> None (the statements are in emitter.out) ---------------------------

def _atomic_update(e, m):
    index = e.index(m["sub"])
    target = m["target"] if "dest" in m else e.var("$qd_old")
    if m["op"] == "cas":
        e.call(impl.atomic_cas_update, [m["sub"].base, index, *m["values"]], target)
        return
    op = e.const(m["op"])
    e.call(impl.atomic_update, [m["sub"].base, index, m.get("rhs", m.get("value")), op], target)


def _nested_atomic(e, m):
    index, outer_index = e.index(m["sub"]), e.index(m["outer"])
    target = m["target"] if "dest" in m else e.var("$qd_old")
    if m["op"] == "cas":
        e.call(impl.nested_atomic_cas, [m["outer"].base, outer_index, index, *m["values"]], target)
        return
    op = e.const(m["op"])
    e.call(impl.nested_atomic, [m["outer"].base, outer_index, index, m.get("rhs", m.get("value")), op], target)


def _new_local_value(e, m):
    """``dest op value`` (``cas_value(dest, expected, desired)`` for a compare-and-swap)."""
    if m["op"] == "cas":
        return e.call(impl.cas_value, [m["dest"], *m["values"]], e.var("$qd_new"))
    return e.call(impl.apply_op, [m["dest"], m["value"], e.const(m["op"])], e.var("$qd_new"))


def _keep(e, m):
    e.out = None


def _value_update(e, m):
    index = e.index(m["sub"])
    target = m["target"]
    e.call(impl.subscript_store, [target, index, m["value"]], target)
    if m["outer"] is not None:
        e.call(impl.write_back, [m["outer"].base, e.index(m["outer"]), target], e.var("$qd_wb"))
    elif m["row_of"] is not None:
        local = m["row_of"].base
        e.call(impl.subscript_store, [local, e.index(m["row_of"]), target], local)


def _atomic_local_element(e, m):
    index = e.index(m["sub"])
    e.assign(m["dest"], m["target"])
    new = _new_local_value(e, m)
    e.call(impl.subscript_store, [m["sub"].base, index, new], m["sub"].base)


def _atomic_local(e, m):
    e.assign(m["dest"], m["target"])
    e.assign(_new_local_value(e, m), m["dest"])


def _true_divide(e, m):
    # default_fp as an argument: Numba caches an overload per argument types, not per qd.init
    e.call(impl.true_divide, [m["lhs"], m["rhs"], e.const(m["default_fp"])], m["target"])


@dataclasses.dataclass(frozen=True)
class Pattern:
    text: str
    match: Callable
    rewrite: Callable


PATTERNS = (
    Pattern("G[I] op= V", _match_aug_global, _atomic_update),
    Pattern("G[I][J] op= V", _match_aug_nested, _nested_atomic),
    Pattern("G[I] = V", _match_global_store, _keep),
    Pattern("L[I] = V, L[I][J] = V, G[I][J] = V", _match_local_store, _value_update),
    Pattern("qd.atomic_<op>(G[I], V)", _match_atomic_global, _atomic_update),
    Pattern("qd.atomic_<op>(G[I][J], V)", _match_atomic_nested, _nested_atomic),
    Pattern("qd.atomic_<op>(L[I], V)", _match_atomic_local_element, _atomic_local_element),
    Pattern("qd.atomic_<op>(L, V)", _match_atomic_local, _atomic_local),
    Pattern("qd.volatile_load(G[I])", _match_volatile_load, _volatile_load),
    Pattern("a / b", _match_true_divide, _true_divide),
)


class RewriteSubscripts:
    name = "rewrite_subscripts"

    def run(self, state) -> bool:
        changed = False
        state.refresh_definitions()
        for block in state.func_ir.blocks.values():
            new_body = []
            for stmt in block.body:
                out = self._rewrite(state, block, stmt)
                if out is None:
                    new_body.append(stmt)
                else:
                    new_body.extend(out)
                    changed = True
            block.body = new_body
        if changed:
            state.refresh_definitions()
        return changed

    @staticmethod
    def _rewrite(state, block, stmt):
        """The statements replacing ``stmt`` (first matching row of PATTERNS), or None."""
        for pattern in PATTERNS:
            match = pattern.match(state, stmt)
            if match is not None:
                emitter = _Emitter(state, block, stmt.loc)
                pattern.rewrite(emitter, match)
                return emitter.out
        return None
