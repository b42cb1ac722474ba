"""RewriteStructs: struct values, struct fields and methods, before typing.

Struct values are immutable (typing/struct.py), struct fields are one field per member
(qd_numba/struct.py), and methods are ``@qd.func`` functions inlined like any other. This pass
rewrites the statements that need that knowledge (``S`` a struct field known at compile time,
``p`` a local struct value, ``T`` a struct type):

=================================  ===================================================================
``T(1.0, v=w)``                    ``T(1.0, w, 0)``: keyword arguments in member order, missing ones 0
``S[I].a`` (read)                  ``S.a[I]``
``S[I].a = V``, ``S[I].a += V``    ``S.a[I] = V`` (a field store; ``+=`` stays atomic)
``S[I]`` (as a value)              ``T(S.a[I], S.b[I], ...)``
``S[I] = V``                       ``S.a[I] = V.a; S.b[I] = V.b; ...``
``for i in S``                     ``for i in S.<first member field>``
``p.a = V`` (a local)              ``p = member_store(p, "a", V)`` (``v.x = V`` on a vector is left to
                                   RewriteSubscripts: ``v[0] = V``)
``p.v.x = V``, ``p.v[k] = V``      the update of the temporary ``p.v``, then ``p = member_store(p, "v", $t)``
``p.method(args)``                 ``T.method(p, args)``, when ``p``'s struct type is known here
``obj.method(args)`` (bound)       ``method(obj, args)`` (``@qd.func`` methods of data-oriented objects)
``O[I] += V``, ``O[I] -= V``       ``f(O, I, V)``, ``O`` a compile-time object whose class maps ``"add"``/
                                   ``"sub"`` to a ``@qd.func`` ``f`` in ``qd_subscript_updates``
                                   (``qd.linalg.SparseMatrixBuilder``); ``O[I]`` used any other way
                                   is a ``QuadrantsSyntaxError``
=================================  ===================================================================

A local's struct type is known before typing when every definition of it is a constructor call,
an element of a struct field, a member of a known struct, a ``@qd.func`` call annotated with a
struct type, or a copy of one of those. Never touches control flow.
"""

from __future__ import annotations

import operator

from ..errors import QuadrantsSyntaxError, QuadrantsTypeError
from ..frontend.objects import BoundQdFunc, QdFunc
from ..lowering.struct import member_store
from ..struct import StructField
from ..typing.matrix import SWIZZLE
from ..typing.struct import StructType, unknown_member
from .base import MISSING, try_static
from .ir_builder import emit_call

_UPDATE_OPS = {operator.iadd: "add", operator.isub: "sub"}


def _struct_field_item(state, var):
    """``(S, getitem expr)`` when the temporary ``var`` is ``S[I]`` of a compile-time struct field
    ``S`` (a named local ``p = S[I]`` is a copy: a value)."""
    if not state.is_temp(var):
        return None
    d = state.definition(var)
    ir = state.ir
    if isinstance(d, ir.Expr) and d.op in ("getitem", "static_getitem"):
        base = try_static(state, d.value)
        if isinstance(base, StructField):
            return base, d
    return None


class RewriteStructs:
    name = "rewrite_structs"

    def run(self, state) -> bool:
        self.state, self.ir = state, state.ir
        changed = False
        state.refresh_definitions()
        # O[I] op= V across blocks (V a conditional expression): its pieces, by variable name
        self.object_reads, self.object_reads_used, self.object_updates = {}, set(), {}
        for block in state.func_ir.blocks.values():
            self.block, self.out, self.member_vars = block, [], {}
            block_changed = False
            for k, stmt in enumerate(block.body):
                self.loc, self.following = stmt.loc, block.body[k + 1:k + 4]
                if self._rewrite(stmt):
                    block_changed = True
                else:
                    self.out.append(stmt)
            if block_changed:
                block.body = self.out
                changed = True
        self._check_object_items_used()
        if changed:
            state.refresh_definitions()
        return changed

    # -- helpers ---------------------------------------------------------------------------------------
    def _var(self, hint):
        return self.block.scope.redefine(hint, self.loc)

    def _assign(self, value, target):
        self.out.append(self.ir.Assign(value, target, self.loc))
        return target

    def _global(self, obj, hint="$qd_struct_global"):
        return self._assign(self.ir.Global(hint.lstrip("$"), obj, self.loc), self._var(hint))

    def _member_field(self, field, attr):
        """One variable per (struct field, member) in a block: ``S.a[I] += V`` must load and
        store through the same variable to stay an atomic update (passes/rewrite_subscripts.py)."""
        if attr not in field.field_dict:
            raise self.state.error(QuadrantsTypeError, unknown_member(field.dtype, attr), self.loc)
        key = (id(field), attr)
        if key not in self.member_vars:
            self.member_vars[key] = self._global(field.field_dict[attr], "$qd_member_field")
        return self.member_vars[key]

    def _item(self, base, expr):
        """``base[I]`` with ``expr``'s index (a getitem or static_getitem)."""
        ir = self.ir
        if expr.op == "getitem":
            return ir.Expr.getitem(base, expr.index, self.loc)
        return ir.Expr.static_getitem(base, expr.index, expr.index_var, self.loc)

    def _store_item(self, base, expr, value):
        ir = self.ir
        if expr.op == "getitem":
            self.out.append(ir.SetItem(base, expr.index, value, self.loc))
        else:
            self.out.append(ir.StaticSetItem(base, expr.index, expr.index_var, value, self.loc))

    def _call(self, fn, args, target):
        self.out.extend(emit_call(self.ir, fn, args, target, self.loc, self._var(f"$qd_{fn.__name__}")))
        return target

    def _const(self, value):
        return self._assign(self.ir.Const(value, self.loc), self._var("$qd_const"))

    # -- the rows of the table -----------------------------------------------------------------------------
    def _rewrite(self, stmt) -> bool:
        ir = self.ir
        if isinstance(stmt, ir.Assign) and isinstance(stmt.value, (ir.Expr, ir.Var)) \
                and self._object_item_update(stmt, stmt.value):
            return True
        if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr):
            expr = stmt.value
            if expr.op == "call":
                return self._constructor(stmt, expr) or self._method_call(stmt, expr)
            if expr.op == "getattr":
                self._check_field_member(expr)
                return self._method_read(expr) or self._member_read(stmt, expr)
            if expr.op in ("getitem", "static_getitem"):
                return self._element_read(stmt, expr)
            if expr.op == "getiter":
                return self._struct_for(stmt, expr)
            return False
        if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            return self._object_item_store(stmt) or self._element_store(stmt) or self._member_item_store(stmt)
        if isinstance(stmt, ir.SetAttr):
            return self._member_store(stmt)
        return False

    def _constructor(self, stmt, expr) -> bool:
        st = try_static(self.state, expr.func)
        if not isinstance(st, StructType) or expr.vararg is not None \
                or (not expr.kws and len(expr.args) == len(st.members)):
            return False
        kws = dict(expr.kws)
        names = list(st.members)
        if len(expr.args) > len(names):
            raise self.state.error(QuadrantsTypeError, f"{st.type_name} has {len(names)} members, "
                                   f"got {len(expr.args)} positional values", self.loc)
        for k in kws:
            if k not in st.members or names.index(k) < len(expr.args):
                problem = unknown_member(st, k) if k not in st.members else f"member '{k}' given twice"
                raise self.state.error(QuadrantsTypeError, f"{st.type_name}(...): {problem}", self.loc)
        args = list(expr.args) + [kws[k] if k in kws else self._const(0) for k in names[len(expr.args):]]
        self._assign(self.ir.Expr.call(expr.func, args, (), self.loc), stmt.target)
        return True

    def _method_call(self, stmt, expr) -> bool:
        ir = self.ir
        callee = try_static(self.state, expr.func)
        if isinstance(callee, BoundQdFunc):
            obj = self._global(callee.obj, "$qd_self")
            fn = self._global(callee.func, "$qd_method")
            self._assign(ir.Expr.call(fn, [obj, *expr.args], expr.kws, self.loc, vararg=expr.vararg), stmt.target)
            return True
        if callee is not MISSING:
            return False
        d = self.state.definition(expr.func)
        if not (isinstance(d, ir.Expr) and d.op == "getattr"):
            return False
        st = struct_type_of(self.state, d.value)
        if st is None or d.attr not in st.methods:
            return False
        fn = self._global(st.methods[d.attr], "$qd_method")
        self._assign(ir.Expr.call(fn, [d.value, *expr.args], expr.kws, self.loc, vararg=expr.vararg), stmt.target)
        return True

    # ``O[I] op= V`` is ``$t = O[I]; $u = inplace_binop(op, $t, V); O[I] = $u`` (V computed between):
    # the read and the binop are dropped, the store becomes the call
    def _object_item_update(self, stmt, expr) -> bool:
        if isinstance(expr, self.ir.Var):
            if expr.name not in self.object_reads:
                return False
            self.object_reads[stmt.target.name] = self.object_reads[expr.name]   # a copy into a $phi
            self.object_reads_used.add(expr.name)
            return True
        if expr.op in ("getitem", "static_getitem"):
            obj = try_static(self.state, expr.value)
            if obj is MISSING or not hasattr(type(obj), "qd_subscript_updates"):
                return False
            self.object_reads[stmt.target.name] = self.loc
            return True
        if getattr(expr, "op", None) == "inplace_binop" and expr.lhs.name in self.object_reads:
            if expr.fn not in _UPDATE_OPS:
                raise self._object_item_error()
            self.object_reads_used.add(expr.lhs.name)
            self.object_updates[stmt.target.name] = (_UPDATE_OPS[expr.fn], expr.rhs, self.loc)
            return True
        return False

    def _object_item_store(self, stmt) -> bool:
        obj = try_static(self.state, stmt.target)
        if obj is MISSING or not hasattr(type(obj), "qd_subscript_updates"):
            return False
        if stmt.value.name not in self.object_updates:
            raise self._object_item_error()
        op, value, _ = self.object_updates.pop(stmt.value.name)
        fn = type(obj).qd_subscript_updates.get(op)
        if fn is None:
            raise self._object_item_error()
        index = stmt.index if isinstance(stmt, self.ir.SetItem) else \
            (stmt.index_var if stmt.index_var is not None else self._const(stmt.index))
        args = [self._global(obj, "$qd_self"), index, value]
        self._assign(self.ir.Expr.call(self._global(fn, "$qd_method"), args, (), self.loc), self._var("$qd_unused"))
        return True

    def _check_object_items_used(self) -> None:
        """An element read (``A[i, j]`` as a value) or update left without its store: our error."""
        locs = [loc for name, loc in self.object_reads.items() if name not in self.object_reads_used]
        locs += [loc for _, _, loc in self.object_updates.values()]
        if locs:
            self.loc = locs[0]
            raise self._object_item_error()

    def _object_item_error(self):
        return self.state.error(QuadrantsSyntaxError, "an element of this object can only be updated with "
                                "'A[i, j] += v' or 'A[i, j] -= v' (a sparse matrix builder's entries cannot be "
                                "read or assigned)", self.loc)

    def _check_field_member(self, expr) -> None:
        """``S.q`` of a struct field without a member (or attribute) ``q``: our error, here."""
        field = try_static(self.state, expr.value)
        if isinstance(field, StructField) and not hasattr(field, expr.attr):
            raise self.state.error(QuadrantsTypeError, unknown_member(field.dtype, expr.attr), self.loc)

    def _method_read(self, expr) -> bool:
        """``$m = p.method``: dropped, its call is rewritten (``_method_call``)."""
        if try_static(self.state, expr.value) is not MISSING:
            return False
        st = struct_type_of(self.state, expr.value)
        return st is not None and expr.attr in st.methods and expr.attr not in st.members

    def _member_read(self, stmt, expr) -> bool:
        item = _struct_field_item(self.state, expr.value)
        if item is None:
            return False
        field, getitem = item
        self._assign(self._item(self._member_field(field, expr.attr), getitem), stmt.target)
        return True

    def _element_read(self, stmt, expr) -> bool:
        field = try_static(self.state, expr.value)
        if not isinstance(field, StructField):
            return False
        values = []
        for k in field.field_dict:
            values.append(self._assign(self._item(self._member_field(field, k), expr), self._var("$qd_member")))
        self._assign(self.ir.Expr.call(self._global(field.dtype, "$qd_struct_type"), values, (), self.loc),
                     stmt.target)
        return True

    def _struct_for(self, stmt, expr) -> bool:
        field = try_static(self.state, expr.value)
        if not isinstance(field, StructField):
            return False
        leaves = field.leaf_fields()
        if not leaves:
            raise self.state.error(QuadrantsSyntaxError, "a struct-for over a struct field without members", self.loc)
        self._assign(self.ir.Expr.getiter(self._global(leaves[0], "$qd_member_field"), self.loc), stmt.target)
        return True

    def _element_store(self, stmt) -> bool:
        field = try_static(self.state, stmt.target)
        if not isinstance(field, StructField):
            return False
        expr = (self.ir.Expr.getitem(stmt.target, stmt.index, self.loc) if isinstance(stmt, self.ir.SetItem)
                else self.ir.Expr.static_getitem(stmt.target, stmt.index, stmt.index_var, self.loc))
        for k in field.field_dict:
            value = self._assign(self.ir.Expr.getattr(stmt.value, k, self.loc), self._var("$qd_member"))
            self._store_item(self._member_field(field, k), expr, value)
        return True

    def _member_item_store(self, stmt) -> bool:
        """``p.v[k] = V``: the store updates the temporary ``p.v`` (RewriteSubscripts), which is
        then written back into ``p``."""
        if not self._is_member_temp(stmt.target) or self._written_back(stmt.target):
            return False
        self.out.append(stmt)
        self._write_back(stmt.target, stmt.target)
        return True

    def _member_store(self, stmt) -> bool:
        state = self.state
        item = _struct_field_item(state, stmt.target)
        if item is not None:
            field, getitem = item
            self._store_item(self._member_field(field, stmt.attr), getitem, stmt.value)
            return True
        if try_static(state, stmt.target) is not MISSING:
            return False
        if state.is_temp(stmt.target) and not self._is_member_temp(stmt.target):
            return False   # L[I].x = V, G[I].x = V: RewriteSubscripts' rows
        if not state.is_temp(stmt.target) and stmt.attr in SWIZZLE and struct_type_of(state, stmt.target) is None:
            return False   # v.x = V on a vector: RewriteSubscripts' row (after the argument-write checks)
        if not state.is_temp(stmt.target):
            self._call(member_store, [stmt.target, self._const(stmt.attr), stmt.value], stmt.target)
            return True
        updated = self._call(member_store, [stmt.target, self._const(stmt.attr), stmt.value], self._var("$qd_updated"))
        self._write_back(stmt.target, updated)
        return True

    def _written_back(self, var) -> bool:
        """Whether the next statements (a constant, a global, the call) already write ``var`` back (an
        earlier round did)."""
        ir = self.ir
        for nxt in self.following:
            fn_var = nxt.value.func if isinstance(nxt, ir.Assign) and isinstance(nxt.value, ir.Expr) \
                and nxt.value.op == "call" else None
            if fn_var is not None and try_static(self.state, fn_var) is member_store \
                    and any(a.name == var.name for a in nxt.value.args):
                return True
        return False

    def _is_member_temp(self, var) -> bool:
        """A temporary holding a member of a local (``$t = p.v``), not a vector component."""
        d = self.state.definition(var)
        return (self.state.is_temp(var) and isinstance(d, self.ir.Expr) and d.op == "getattr"
                and (d.attr not in SWIZZLE or struct_type_of(self.state, d.value) is not None)
                and try_static(self.state, d.value) is MISSING and _struct_field_item(self.state, d.value) is None)

    def _write_back(self, var, updated) -> None:
        """``updated``, the new value of the temporary ``var`` = ``p.m``, written back into ``p``:
        ``p = member_store(p, "m", updated)``, up the chain of temporaries (``p.a.b``); each
        temporary keeps its single definition, the named local at the top is assigned."""
        while self._is_member_temp(var):
            base = self.state.definition(var).value
            target = base if not self.state.is_temp(base) else self._var("$qd_updated")
            updated = self._call(member_store, [base, self._const(self.state.definition(var).attr), updated], target)
            var = base


def struct_type_of(state, var, seen=None):
    """The struct type of local ``var`` when every definition of it gives the same one, else None."""
    ir = state.ir
    seen = set() if seen is None else seen
    if var.name in seen:
        return None
    seen.add(var.name)
    found = set()
    for d in state.func_ir._definitions.get(var.name, ()):
        found.add(_definition_struct_type(state, ir, d, seen))
    if len(found) != 1:
        return None
    return found.pop()


def _definition_struct_type(state, ir, d, seen):
    if isinstance(d, ir.Var):
        return struct_type_of(state, d, seen)
    if isinstance(d, ir.Arg):
        ty = state.param_types.get(d.name)
        return ty if isinstance(ty, StructType) else None
    if not isinstance(d, ir.Expr):
        return None
    if d.op == "call":
        fn = try_static(state, d.func)
        if isinstance(fn, StructType):
            return fn
        if fn is member_store:
            return struct_type_of(state, d.args[0], seen)
        if isinstance(fn, QdFunc) and isinstance(fn.return_type, StructType):
            return fn.return_type
        return None
    if d.op in ("getitem", "static_getitem"):
        base = try_static(state, d.value)
        return base.dtype if isinstance(base, StructField) else None
    if d.op == "getattr":
        base = struct_type_of(state, d.value, seen)
        member = base.members.get(d.attr) if base is not None else None
        return member if isinstance(member, StructType) else None
    return None
