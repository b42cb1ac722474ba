"""The global-data accesses of a loop body, with per-thread address fingerprints.

:class:`BodyAccesses` walks one offloaded loop's blocks and records every access to global
data (a field or an ndarray argument) as an :class:`Access`: the resource (the kernel argument
index), read or write, and a :class:`Fingerprint` of the address in terms of the loop-index
components (which of them it is injective in). Fusion decides on these; PlanTasks stores them in
each range-for Task (``Task.accesses``, ``reads``, ``writes``).
"""

from __future__ import annotations

import dataclasses
import operator
import sys

from ..lowering import reduce as reduce_impl
from ..lowering import spaces
from ..lowering import subscripts as sub_impl
from .base import MISSING, try_static
from .bounds import space_key

# -- injective index expressions -------------------------------------------------------------------

_ADD, _SUB, _MUL = (operator.add, operator.iadd), (operator.sub, operator.isub), (operator.mul, operator.imul)
_SHL, _XOR = (operator.lshift, operator.ilshift), (operator.xor, operator.ixor)


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """The per-thread address of one access: ``key`` is a structural description in terms of
    loop-index components (comparable between the two loops, whose spaces are identical);
    ``covers`` is the set of loop-index components it is injective in, or None if it is not
    injective in anything (a constant, an opaque value, a non-injective operation)."""
    key: tuple
    covers: frozenset | None

    def text(self) -> str:
        return _render(self.key)


def _render(key) -> str:
    tag = key[0]
    if tag == "idx":
        return "ijklmn"[key[1]] if key[1] < 6 else f"i{key[1]}"
    if tag == "const":
        return repr(key[1])
    if tag == "tuple":
        return ", ".join(_render(k) for k in key[1:])
    if tag == "add":
        return f"{_render(key[1])} {'-' if key[2] < 0 else '+'} {abs(key[2])}"
    if tag in ("mul", "shl", "xor"):
        return f"{_render(key[1])} {dict(mul='*', shl='<<', xor='^')[tag]} {key[2]}"
    if tag == "rsub":
        return f"{key[1]} - {_render(key[2])}"
    if tag in ("neg", "bitnot"):
        return f"{'-' if tag == 'neg' else '~'}{_render(key[1])}"
    if tag == "nonlinear":
        return key[1]
    return "?"


def _opaque(what: str) -> Fingerprint:
    # never equal to another fingerprint: the analysis does not know the address
    return Fingerprint(("nonlinear", what, object()), None)


# -- one loop body: definitions and accesses ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Access:
    resource: int           # kernel argument index (runtime parameter or hidden field)
    kind: str               # "read" | "write" (stores, atomics, views that may be written through)
    where: Fingerprint
    what: str               # "load", "store", "atomic", "unknown use" ...


class BodyAccesses:
    """The global accesses of one offloaded loop body (``lp``), or of a serial region
    (``labels``, no loop: addresses are then fingerprinted without loop indices)."""

    def __init__(self, state, lp, serial_defs, labels=None):
        self.state, self.lp = state, lp
        ir = state.ir
        blocks = state.func_ir.blocks
        labels = lp.body if lp is not None else labels
        self.local = {}
        for lbl in labels:
            for stmt in blocks[lbl].body:
                if isinstance(stmt, ir.Assign):
                    self.local.setdefault(stmt.target.name, []).append(stmt.value)
        self.serial_defs = serial_defs
        self.space_key = space_key(state, lp.space_var) if lp is not None else None
        header = blocks[lp.header] if lp is not None else None
        self.flat = None if header is None else next(
            (s.target.name for s in header.body if isinstance(s, ir.Assign)
             and isinstance(s.value, ir.Expr) and s.value.op == "pair_first"), None)
        self.accesses: list[Access] = []
        self.statements = sum(len(blocks[lbl].body) for lbl in labels)
        for lbl in sorted(labels):
            for stmt in blocks[lbl].body:
                self._visit(stmt)

    # definitions as seen from inside the body
    def definition(self, var):
        """The value a body-local name always holds, a unique outside definition, or None."""
        name = var.name if hasattr(var, "name") else var
        local = self.local.get(name)
        if local is not None:
            return local[0] if len(local) == 1 and name not in self.serial_defs else None
        return self.state.definition(name)

    def resolve(self, var, limit=50):
        ir = self.state.ir
        for _ in range(limit):
            d = self.definition(var)
            if isinstance(d, ir.Var):
                var = d
                continue
            return var, d
        return var, None

    def int_const(self, var):
        ir = self.state.ir
        var, d = self.resolve(var)
        if isinstance(d, ir.Const):
            value = d.value
        elif var.name in self.local:
            return None
        else:
            value = try_static(self.state, var)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return None

    def resources(self, var) -> set:
        """Argument indices of the global data ``var`` may be (through copies; any definition)."""
        ir = self.state.ir
        out, todo, seen = set(), [var.name], set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for d in self.state.func_ir._definitions.get(name, ()):
                if isinstance(d, ir.Var):
                    todo.append(d.name)
                elif isinstance(d, ir.Arg) and self._is_data_arg(d):
                    out.add(d.index)
        return out

    def _is_data_arg(self, arg) -> bool:
        if self.state.hidden_by_arg_index(arg.index) is not None:
            return True
        ty = self.state.param_types.get(arg.name)
        return ty is not None and hasattr(ty, "ndim")

    def ndim_of(self, resource: int):
        field = self.state.hidden_by_arg_index(resource)
        if field is not None:
            return len(field.shape)
        return getattr(self.state.param_types.get(self.state.runtime_params[resource]), "ndim", None)

    # fingerprints
    def fingerprint(self, var, depth=0) -> Fingerprint:
        ir = self.state.ir
        c = self.int_const(var)
        if c is not None:
            return Fingerprint(("const", c), None)
        var, d = self.resolve(var)
        if depth > 30 or d is None:
            return _opaque(var.name)
        if isinstance(d, ir.Const) and d.value is None:
            return Fingerprint(("const", None), None)
        if not isinstance(d, ir.Expr):
            return _opaque(var.name)
        if d.op == "static_getitem" and isinstance(d.index, int) and self._is_space_index(d.value):
            return Fingerprint(("idx", d.index), frozenset({d.index}))
        if d.op == "call" and try_static(self.state, d.func) is sub_impl.index_vector and d.args \
                and self._is_space_index(d.args[0]):
            # the vector index of qd.grouped is the tuple of all loop indices
            ndim = self._loop_ndim()
            return Fingerprint(("tuple", *(("idx", k) for k in range(ndim))), frozenset(range(ndim)))
        if d.op == "build_tuple":
            parts = [self.fingerprint(v, depth + 1) for v in d.items]
            key = ("tuple", *(p.key for p in parts))
            if any(p.covers is None and p.key[0] != "const" for p in parts):
                return Fingerprint(key, None)
            covers = frozenset().union(*(p.covers or () for p in parts))
            return Fingerprint(key, covers or None)
        if d.op in ("binop", "inplace_binop"):
            return self._binop(d, depth)
        if d.op == "unary":
            inner = self.fingerprint(d.value, depth + 1)
            if d.fn in ("+", operator.pos):
                return inner
            tag = {"-": "neg", operator.neg: "neg", "~": "bitnot", operator.invert: "bitnot"}.get(d.fn)
            if tag is None or inner.covers is None:
                return _opaque(f"{d.fn}(...)")
            return Fingerprint((tag, inner.key), inner.covers)
        return _opaque(self._describe(d))

    def _binop(self, d, depth) -> Fingerprint:
        fn = d.fn
        lc, rc = self.int_const(d.lhs), self.int_const(d.rhs)
        text = f"{self._describe(d)}"
        if (lc is None) == (rc is None):   # both variable, or both constant (not folded: rare)
            return _opaque(text)
        const = lc if lc is not None else rc
        inner = self.fingerprint(d.rhs if lc is not None else d.lhs, depth + 1)
        if inner.covers is None:
            return _opaque(text)
        if fn in _ADD:
            return Fingerprint(("add", inner.key, const), inner.covers)
        if fn in _SUB:
            if rc is not None:
                return Fingerprint(("add", inner.key, -const), inner.covers)
            return Fingerprint(("rsub", const, inner.key), inner.covers)
        if fn in _MUL and const != 0:
            return Fingerprint(("mul", inner.key, const), inner.covers)
        if fn in _SHL and rc is not None and 0 <= const < 63:
            return Fingerprint(("shl", inner.key, const), inner.covers)
        if fn in _XOR:
            return Fingerprint(("xor", inner.key, const), inner.covers)
        return _opaque(text)

    def _describe(self, d) -> str:
        if d.op in ("binop", "inplace_binop"):
            sym = {operator.floordiv: "//", operator.mod: "%", operator.and_: "&", operator.or_: "|",
                   operator.rshift: ">>", operator.truediv: "/", operator.lt: "<", operator.gt: ">"}
            return f"(... {sym.get(d.fn, getattr(d.fn, '__name__', '?'))} ...)"
        if d.op == "call":
            fn = try_static(self.state, d.func)
            return f"{getattr(fn, '__name__', 'call')}(...)" if fn is not MISSING else "call(...)"
        if d.op in ("getitem", "static_getitem"):
            return "an indirect load"
        return d.op

    def _is_space_index(self, var) -> bool:
        ir = self.state.ir
        _, d = self.resolve(var)
        if not (isinstance(d, ir.Expr) and d.op == "call" and try_static(self.state, d.func) is spaces.space_index):
            return False
        space, flat = d.args
        flat, _ = self.resolve(flat)
        if flat.name != self.flat:
            return False
        # a fused loop's later parts index their own (identical) copy of the space
        if self.lp is None:
            return False
        return space.name == self.lp.space_var.name or space_key(self.state, space) == self.space_key

    def _loop_ndim(self) -> int:
        return len(self.space_key or ((),))

    def _index_arity(self, index_var):
        ir = self.state.ir
        _, d = self.resolve(index_var)
        if isinstance(d, ir.Const):
            return 0 if d.value is None else len(d.value) if isinstance(d.value, tuple) else 1
        if isinstance(d, ir.Expr):
            if d.op == "build_tuple":
                return len(d.items)
            if d.op in ("binop", "inplace_binop", "unary"):
                return 1
            if d.op == "static_getitem" and self._is_space_index(d.value):
                return 1
            if d.op == "call" and try_static(self.state, d.func) is sub_impl.index_vector:
                return self._loop_ndim()
        return None

    # accesses
    def _add(self, resource, kind, where, what):
        self.accesses.append(Access(resource, kind, where, what))

    def _visit(self, stmt):
        ir = self.state.ir
        consumed = set()          # ids of Var occurrences accounted for by a recognised access
        if isinstance(stmt, ir.Assign):
            value = stmt.value
            consumed.add(id(stmt.target))
            if isinstance(value, ir.Var):
                consumed.add(id(value))   # an alias of global data is not an access
            elif isinstance(value, ir.Expr) and value.op in ("getitem", "static_getitem"):
                res = self.resources(value.value)
                if res:
                    consumed.add(id(value.value))
                    if value.op == "getitem":
                        where, arity = self.fingerprint(value.index), self._index_arity(value.index)
                    else:
                        where = Fingerprint(("const", value.index), None)
                        arity = 0 if value.index is None else len(value.index) \
                            if isinstance(value.index, tuple) else 1
                    for r in res:
                        full = arity is not None and arity == self.ndim_of(r)
                        # a partial index yields a view that may be written through
                        self._add(r, "read" if full and len(res) == 1 else "write", where,
                                  "load" if full else "partial load")
            elif isinstance(value, ir.Expr) and value.op == "getattr" and value.attr == "shape":
                consumed.add(id(value.value))
            elif isinstance(value, ir.Expr) and value.op == "call":
                self._visit_call(value, consumed)
        elif isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            res = self.resources(stmt.target)
            if res:
                consumed.add(id(stmt.target))
                where = self.fingerprint(stmt.index) if isinstance(stmt, ir.SetItem) else \
                    Fingerprint(("const", stmt.index), None)
                for r in res:
                    self._add(r, "write", where, "store")
        for var in stmt.list_vars():
            if id(var) not in consumed:
                for r in self.resources(var):
                    self._add(r, "write", _opaque(var.name), "unknown use")

    def _visit_call(self, expr, consumed):
        fn = try_static(self.state, expr.func)
        try:
            kind = _access_callees().get(fn)
        except TypeError:      # an unhashable callee: not one of ours
            return
        if kind is None or len(expr.args) < 2:
            return
        base, index = expr.args[0], expr.args[1]
        res = self.resources(base)
        if res:
            consumed.add(id(base))
            where = self.fingerprint(index)
            arity = self._index_arity(index)
            for r in res:
                full = arity is not None and arity == self.ndim_of(r) and len(res) == 1
                self._add(r, "read" if kind == "load" and full else "write", where, kind)


def _access_callees() -> dict:
    """The compiled helpers that access global data as ``helper(base, index, ...)``: callee ->
    "load" | "store" | "atomic"."""
    table = {sub_impl.atomic_update: "atomic", sub_impl.nested_atomic: "atomic", sub_impl.write_back: "store",
             sub_impl.atomic_cas_update: "atomic", sub_impl.nested_atomic_cas: "atomic",
             reduce_impl.reduce_combine: "atomic"}
    direct = sys.modules.get("qd_numba.lowering.array_access")   # the DirectArrayAccess rewrite
    if direct is not None:
        for load in (direct.array_load, direct.checked_array_load):
            table[load] = "load"
        for store in (direct.array_store, direct.checked_array_store):
            table[store] = "store"
    return table


def serial_definitions(state) -> set:
    """Names assigned outside the offloaded loops (serial code): inside a loop body they are
    shared by every iteration, not private to one."""
    ir = state.ir
    in_loops = set().union(*(lp.body for lp in state.loops))
    out = set()
    for lbl, block in state.func_ir.blocks.items():
        if lbl not in in_loops:
            out.update(s.target.name for s in block.body if isinstance(s, ir.Assign))
    return out


def resource_name(state, resource: int) -> str:
    """A person's name for a kernel argument index: the parameter, or the field's name."""
    field = state.hidden_by_arg_index(resource)
    if field is not None:
        return getattr(field, "name", None) or f"field#{resource - len(state.runtime_params)}"
    return state.runtime_params[resource]
