"""CfgOptimize: store-to-load forwarding and dead-store elimination on global data, one Task at
a time.

Input: the kernel IR after PlanTasks, whose Task list is final. Each launched task is optimised
on its own control-flow graph, never on the kernel as a whole (a value cannot travel from one
launch to the next in a register):

* a range-for task: one iteration — one thread — of its body; the edges back to the loop header
  (the end of the body, ``continue``) leave the graph;
* a serial task: its region, serial loops included (their back edges stay: loop-carried paths).

Global data (field and ndarray elements, 0-d fields) is live-in and live-out of every task:
nothing is available at a task's entry, and every store is read at its exits (the end of the
task, ``continue``, ``return``, a raise).

Two dataflow analyses over the task's accesses:

* available values (forward, on every path): after ``A[k] = v`` the element holds ``v``, after
  ``t = A[k]`` it holds ``t``. A load of an address whose value is available becomes a copy —
  ``t = t0`` (a redundant load) or ``t = stored_value(v, dtype)`` (a forwarded store: the
  conversion the store did; only for scalar elements that store as they load, not ``f16``).
* overwritten before read (backward, on every path): a store whose address is stored again on
  every path before anything may read it is removed. Not with ``debug=True``, where every
  access may raise and so end the task in between.

Addresses: the resource (kernel argument index) and the address fingerprint of
passes/accesses.py when it is known (loop indices and constants: the same value everywhere in
one thread), else the index variable itself — a fact about a variable dies when the variable
is assigned again, as one about the stored or loaded value does. Two addresses may alias unless
they are different constants or of resources that never alias: two fields never do, an ndarray
argument may be any other ndarray argument of its dtype. Atomics read and write (a fact about
anything they may touch dies, nothing is forwarded through them, they keep earlier stores);
``write_back`` (the store of ``G[I][J] = V``, a no-op on some types) counts as an atomic; any
other use of global data (a partial index, an argument of a call) reads and writes all of that
resource; a call of anything but known pure functions (math, vector constructors, index helpers)
is a barrier for everything.

Output: the changed statements; then dead pure temporaries are dropped, and each changed Task's
accesses are recomputed. Runs when ``cfg_optimization`` and ``cfg_optimization_per_task`` are
on (docs/optimisations.md). Never changes control flow, labels or the values crossing tasks.
"""

from __future__ import annotations

import builtins
import functools

from numba.core import types

from ..dtypes import to_numba
from ..lowering import field as field_impl
from ..lowering import subscripts as sub_impl
from .accesses import BodyAccesses, _access_callees, serial_definitions
from .base import MISSING, try_static
from .dead_code import remove_dead_pure
from .ir_builder import successors
from .plan_tasks import with_accesses

_PURE_MODULES = frozenset({"math", "cmath", "qd_numba.math", "qd_numba.matrix", "qd_numba.lowering.matrix",
                           "qd_numba.lowering.spaces", "qd_numba.ops.elementwise", "qd_numba.ops.math_funcs",
                           "qd_numba.ops.decompositions"})
_PURE_BUILTINS = frozenset({builtins.bool, builtins.int, builtins.float, builtins.abs, builtins.min, builtins.max,
                            builtins.range, builtins.len, builtins.round, builtins.pow, builtins.divmod})


def _pure_call(fn) -> bool:
    """A callee that touches no global data except through its arguments, and never raises."""
    if fn is MISSING:
        return False
    try:
        if fn in _PURE_BUILTINS:
            return True
    except TypeError:
        return False
    if fn in (sub_impl.apply_op, sub_impl.true_divide, sub_impl.subscript_store, sub_impl.index_vector,
              sub_impl.as_index_tuple, field_impl.stored_value):
        return True
    return getattr(fn, "__module__", None) in _PURE_MODULES


# -- addresses -------------------------------------------------------------------------------------

def _has_opaque(key) -> bool:
    if not isinstance(key, tuple):
        return False
    if key and key[0] == "nonlinear":
        return True
    return any(_has_opaque(k) for k in key)


def _constant(key):
    """A fingerprint key's constant value as a tuple of indices, or None if it is not constant."""
    if key[0] == "const":
        value = key[1]
        return () if value is None else value if isinstance(value, tuple) else (value,)
    if key[0] == "tuple":
        parts = [_constant(k) for k in key[1:]]
        return None if any(p is None for p in parts) else sum(parts, ())
    return None


_VALUE_OPS = frozenset({"binop", "inplace_binop", "unary", "build_tuple"})


@functools.lru_cache(maxsize=4096)
def _addr_vars(addr) -> frozenset:
    """The variables an address is stated in (its fact dies when one of them is assigned)."""
    if addr[0] == "var":
        return frozenset((addr[1],))
    if addr[0] == "expr":
        return frozenset().union(*(_addr_vars(a) for a in addr[3:]))
    return frozenset()


class _Effects:
    """The effects of one statement on global data, in evaluation order; ``defs`` last.

    Each effect is ``("load", rk, target)``, ``("store", rk, value, forwardable)``, ``("atomic", rk)``,
    ``("clobber", resources)`` or ``("barrier",)``; ``rk`` is ``(resource, address)``."""

    __slots__ = ("effects", "defs")

    def __init__(self, effects, defs):
        self.effects, self.defs = effects, defs


class _IndexAnalysis(BodyAccesses):
    """BodyAccesses' definitions, fingerprints and resources, without its list of accesses
    (this pass classifies the statements itself)."""

    def _visit(self, stmt):
        return None


class _TaskView:
    """One task's statements classified: addresses, aliasing, effects."""

    def __init__(self, state, unit, serial_defs):
        self.state = state
        self.acc = _IndexAnalysis(state, unit.loop, serial_defs, labels=unit.labels)
        self.callees = _access_callees()
        self._resources = {}
        self._dtype = {}

    def resources(self, var) -> frozenset:
        name = var.name
        if name not in self._resources:
            self._resources[name] = frozenset(self.acc.resources(var))
        return self._resources[name]

    # aliasing
    def _array_dtype(self, resource):
        """An ndarray argument's dtype (None: unknown), or MISSING for a field."""
        if resource not in self._dtype:
            state = self.state
            if state.hidden_by_arg_index(resource) is not None:
                self._dtype[resource] = MISSING
            else:
                self._dtype[resource] = getattr(state.param_types.get(state.runtime_params[resource]), "dtype", None)
        return self._dtype[resource]

    def resources_alias(self, r1, r2) -> bool:
        if r1 == r2:
            return True
        d1, d2 = self._array_dtype(r1), self._array_dtype(r2)
        if d1 is MISSING or d2 is MISSING:
            return False
        return d1 is None or d2 is None or d1 == d2

    def may_alias(self, rk1, rk2) -> bool:
        if not self.resources_alias(rk1[0], rk2[0]):
            return False
        a1, a2 = rk1[1], rk2[1]
        return not (a1[0] == "c" and a2[0] == "c" and a1 != a2)

    def forwardable(self, resource) -> str | None:
        """The dtype name a store to a scalar element of ``resource`` converts to (None: the
        element is not a scalar that stores as it loads)."""
        state = self.state
        f = state.hidden_by_arg_index(resource)
        if f is not None:
            dtype = to_numba(f.dtype) if f.elem_type is None else None
        else:
            ty = state.param_types.get(state.runtime_params[resource])
            dtype = ty.dtype if isinstance(ty, types.Array) and isinstance(ty.dtype, types.Number) else None
        if dtype is None or dtype == types.float16 or not isinstance(dtype, types.Number):
            return None
        return str(dtype)

    # addresses
    def address(self, block, pos, var, depth=0):
        """The address (or value) ``var`` holds at statement ``pos`` of ``block``: its fingerprint
        when known; else the expression computing it earlier in the block, if none of the
        variables it reads was assigned since (``a[(i + 1) % n]`` twice is one address); else the
        variable itself."""
        fp = self.acc.fingerprint(var)
        if not _has_opaque(fp.key):
            return self._fp_address(fp.key)
        ir = self.state.ir
        d = self.state.definition(var)
        if isinstance(d, (ir.Global, ir.FreeVar, ir.Const)) and isinstance(d.value, int) \
                and not isinstance(d.value, bool):   # a global constant (N), which fingerprints leave opaque
            return ("c", (d.value,))
        at = next((k for k in range(pos - 1, -1, -1) if isinstance(block.body[k], ir.Assign)
                   and block.body[k].target.name == var.name), None)
        value = block.body[at].value if at is not None else None
        if depth < 6 and isinstance(value, ir.Expr) and value.op in _VALUE_OPS:
            operands = value.list_vars()
            parts = [self.address(block, at, v, depth + 1) for v in operands]
            read = frozenset().union(*(_addr_vars(p) for p in parts))
            if not any(isinstance(s, ir.Assign) and s.target.name in read for s in block.body[at + 1:pos]):
                return ("expr", value.op, value.fn if value.op != "build_tuple" else None, *parts)
        return ("var", var.name)

    @staticmethod
    def _fp_address(key):
        c = _constant(key)
        return ("c", c) if c is not None else ("fp", key)

    def _full(self, resource, index_var=None, const_index=MISSING) -> bool:
        if const_index is not MISSING:
            arity = 0 if const_index is None else len(const_index) if isinstance(const_index, tuple) else 1
        else:
            arity = self.acc._index_arity(index_var)
        return arity is not None and arity == self.acc.ndim_of(resource)

    # statements
    def effects(self, block, pos) -> _Effects:
        ir = self.state.ir
        stmt = block.body[pos]
        out, consumed = [], set()
        defs = ()
        if isinstance(stmt, ir.Assign):
            defs = (stmt.target.name,)
            consumed.add(id(stmt.target))
            value = stmt.value
            if isinstance(value, ir.Var):
                consumed.add(id(value))
            elif isinstance(value, ir.Expr) and value.op in ("getitem", "static_getitem"):
                self._load(block, pos, value, stmt.target, out, consumed)
            elif isinstance(value, ir.Expr) and value.op == "getattr" and value.attr == "shape":
                consumed.add(id(value.value))
            elif isinstance(value, ir.Expr) and value.op == "call":
                self._call(block, pos, value, stmt.target, out, consumed)
        elif isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            res = self.resources(stmt.target)
            if len(res) == 1:
                (r,) = res
                static = isinstance(stmt, ir.StaticSetItem)
                full = self._full(r, const_index=stmt.index) if static else self._full(r, stmt.index)
                if full:
                    consumed.add(id(stmt.target))
                    addr = ("c", _constant(("const", stmt.index))) if static else self.address(block, pos, stmt.index)
                    out.append(("store", (r, addr), stmt.value.name, self.forwardable(r)))
        clobbered = set()
        for var in stmt.list_vars():
            if id(var) not in consumed:
                clobbered |= self.resources(var)
        if clobbered:
            out.insert(0, ("clobber", frozenset(clobbered)))
        return _Effects(out, defs)

    def _load(self, block, pos, value, target, out, consumed):
        res = self.resources(value.value)
        if len(res) != 1:
            return
        (r,) = res
        if value.op == "getitem":
            if not self._full(r, value.index):
                return
            addr = self.address(block, pos, value.index)
        else:
            if not self._full(r, const_index=value.index):
                return
            addr = ("c", _constant(("const", value.index)))
        consumed.add(id(value.value))
        out.append(("load", (r, addr), target.name))

    def _call(self, block, pos, value, target, out, consumed):
        fn = try_static(self.state, value.func)
        try:
            kind = self.callees.get(fn)
        except TypeError:
            kind = None
        if kind is not None and len(value.args) >= 2:
            base, index = value.args[0], value.args[1]
            res = self.resources(base)
            if len(res) == 1 and self._full(next(iter(res)), index):
                (r,) = res
                consumed.add(id(base))
                rk = (r, self.address(block, pos, index))
                if kind == "load":
                    out.append(("load", rk, target.name))
                elif kind == "store" and fn is not sub_impl.write_back:
                    out.append(("store", rk, value.args[2].name, self.forwardable(r)))
                else:
                    out.append(("atomic", rk))
                return
        if kind is not None or not _pure_call(fn):
            out.append(("barrier",))


# -- the dataflow ------------------------------------------------------------------------------------

class _Graph:
    """A task's blocks, entry and edges; successors outside the task are exits."""

    def __init__(self, state, unit):
        ir = state.ir
        blocks = state.func_ir.blocks
        if unit.kind == "range_for":
            self.labels = set(unit.loop.body) - {unit.loop.header}
            self.entries = [s for s in successors(ir, blocks[unit.loop.header]) if s in self.labels]
        else:
            self.labels = set(unit.labels)
            self.entries = [unit.start] if unit.start is not None else []
        self.succs = {lbl: [s for s in successors(ir, blocks[lbl]) if s in self.labels] for lbl in self.labels}
        self.exits = {lbl for lbl in self.labels
                      if len(self.succs[lbl]) != len(successors(ir, blocks[lbl])) or not successors(ir, blocks[lbl])}
        self.preds = {lbl: [] for lbl in self.labels}
        for lbl, ss in self.succs.items():
            for s in ss:
                self.preds[s].append(lbl)
        self.order = self._reverse_postorder()

    def _reverse_postorder(self):
        seen, order = set(), []
        for entry in self.entries:
            stack = [(entry, iter(self.succs[entry]))]
            seen.add(entry)
            while stack:
                lbl, it = stack[-1]
                nxt = next((s for s in it if s not in seen), None)
                if nxt is None:
                    order.append(lbl)
                    stack.pop()
                else:
                    seen.add(nxt)
                    stack.append((nxt, iter(self.succs[nxt])))
        return order[::-1]


def _kill_defs(facts, name):
    return {rk: v for rk, v in facts.items() if v[0] != name and name not in _addr_vars(rk[1])}


def _forward_stmt(view, facts, eff, on_load=None):
    """Available values after one statement (``on_load(target, fact)`` sees each load)."""
    for e in eff.effects:
        tag = e[0]
        if tag == "barrier":
            facts = {}
        elif tag == "clobber":
            facts = {rk: v for rk, v in facts.items() if not any(view.resources_alias(rk[0], r) for r in e[1])}
        elif tag in ("store", "atomic"):
            facts = {rk: v for rk, v in facts.items() if not view.may_alias(rk, e[1])}
            if tag == "store" and e[3] is not None:
                facts[e[1]] = (e[2], e[3])
        elif tag == "load" and on_load is not None:
            on_load(e[2], facts.get(e[1]))
    for name in eff.defs:
        facts = _kill_defs(facts, name)
    for e in eff.effects:
        if e[0] == "load" and e[2] not in _addr_vars(e[1][1]):
            facts[e[1]] = (e[2], None)   # the element holds the loaded value (no conversion)
    return facts


def _meet_forward(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    first, rest = values[0], values[1:]
    return {rk: v for rk, v in first.items() if all(o.get(rk) == v for o in rest)}


def _backward_stmt(view, over, eff, on_store=None):
    """Addresses overwritten before any read, before one statement (``on_store(rk, dead)``)."""
    for name in eff.defs:
        over = frozenset(rk for rk in over if name not in _addr_vars(rk[1]))
    for e in reversed(eff.effects):
        tag = e[0]
        if tag == "barrier":
            over = frozenset()
        elif tag == "clobber":
            over = frozenset(rk for rk in over if not any(view.resources_alias(rk[0], r) for r in e[1]))
        elif tag in ("load", "atomic"):
            over = frozenset(rk for rk in over if not view.may_alias(rk, e[1]))
        elif tag == "store":
            if on_store is not None:
                on_store(e[1] in over)
            over = over | {e[1]}
    return over


def _solve(graph, transfer, forward, meet, boundary):
    """Fixed point of a block-level dataflow, in the analysis' direction: the facts entering each
    block (at its start going forward, at its end going backward)."""
    entering = {lbl: None for lbl in graph.labels}
    leaving = {lbl: None for lbl in graph.labels}
    order = graph.order if forward else graph.order[::-1]
    changed = True
    while changed:
        changed = False
        for lbl in order:
            if forward:
                inputs = [leaving[p] for p in graph.preds[lbl]] + ([boundary] if lbl in graph.entries else [])
            else:
                inputs = [leaving[s] for s in graph.succs[lbl]] + ([boundary] if lbl in graph.exits else [])
            incoming = meet(inputs)
            if incoming is None or incoming == entering[lbl]:
                continue
            entering[lbl], leaving[lbl] = incoming, transfer(lbl, incoming)
            changed = True
    return entering


def _meet_backward(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return frozenset.intersection(*values)


class _TaskOptimizer:
    def __init__(self, state, unit, serial_defs):
        self.state, self.unit, self.serial_defs = state, unit, serial_defs
        self.view = _TaskView(state, unit, serial_defs)
        self.graph = _Graph(state, unit)
        self.blocks = state.func_ir.blocks
        self._effects = {}

    def effects(self, lbl, pos):
        key = (lbl, pos)
        if key not in self._effects:
            self._effects[key] = self.view.effects(self.blocks[lbl], pos)
        return self._effects[key]

    def _classify(self):
        """Every statement's effects; the accesses to a resource used in any other way in the task
        (a view ``row = a[i]``, an argument of a call: writes through it are not seen) only read
        and write, as atomics do."""
        for lbl in self.graph.order:
            for pos in range(len(self.blocks[lbl].body)):
                self.effects(lbl, pos)
        escaped = set()
        for eff in self._effects.values():
            for e in eff.effects:
                if e[0] == "clobber":
                    escaped |= e[1]
        if not escaped:
            return
        for eff in self._effects.values():
            eff.effects = [("atomic", e[1]) if e[0] in ("load", "store")
                           and any(self.view.resources_alias(e[1][0], r) for r in escaped) else e
                           for e in eff.effects]

    def run(self, eliminate_stores: bool) -> bool:
        self._classify()
        changed = self._forward()
        if changed:
            self.view = _TaskView(self.state, self.unit, self.serial_defs)
            self._effects.clear()
            self._classify()
        if eliminate_stores:
            changed |= self._eliminate_dead_stores()
        return changed

    # store-to-load forwarding, redundant loads
    def _forward(self) -> bool:
        def transfer(lbl, facts):
            for pos in range(len(self.blocks[lbl].body)):
                facts = _forward_stmt(self.view, facts, self.effects(lbl, pos))
            return facts

        entering = _solve(self.graph, transfer, True, _meet_forward, {})
        changed = False
        for lbl in self.graph.order:
            facts = entering[lbl]
            block = self.blocks[lbl]
            rewrites = {}
            for pos in range(len(block.body)):
                def on_load(target, fact, pos=pos):
                    if fact is not None:
                        rewrites[pos] = fact
                facts = _forward_stmt(self.view, facts, self.effects(lbl, pos), on_load)
            if rewrites:
                self._rewrite_loads(block, rewrites)
                changed = True
        return changed

    def _rewrite_loads(self, block, rewrites):
        ir = self.state.ir
        body = []
        for pos, stmt in enumerate(block.body):
            fact = rewrites.get(pos)
            if fact is None:
                body.append(stmt)
                continue
            source, dtype = fact
            loc = stmt.loc
            self._drop_definition(stmt)
            if dtype is None:
                if source != stmt.target.name:
                    new = [ir.Assign(ir.Var(block.scope, source, loc), stmt.target, loc)]
                else:
                    new = []
            else:
                fn = block.scope.redefine("$qd_stored_value", loc)
                name = block.scope.redefine("$qd_dtype", loc)
                new = [ir.Assign(ir.Global("stored_value", field_impl.stored_value, loc), fn, loc),
                       ir.Assign(ir.Const(dtype, loc), name, loc),
                       ir.Assign(ir.Expr.call(fn, [ir.Var(block.scope, source, loc), name], (), loc), stmt.target,
                                 loc)]
            definitions = self.state.func_ir._definitions
            for assign in new:   # kept current here: rebuilding them per task would be quadratic
                definitions.setdefault(assign.target.name, []).append(assign.value)
            body += new
        block.body = body

    def _drop_definition(self, stmt):
        if isinstance(stmt, self.state.ir.Assign):
            defs = self.state.func_ir._definitions.get(stmt.target.name, [])
            defs[:] = [d for d in defs if d is not stmt.value]

    # dead stores
    def _eliminate_dead_stores(self) -> bool:
        def transfer(lbl, over):
            for pos in range(len(self.blocks[lbl].body) - 1, -1, -1):
                over = _backward_stmt(self.view, over, self.effects(lbl, pos))
            return over

        leaving = _solve(self.graph, transfer, False, _meet_backward, frozenset())
        changed = False
        for lbl in self.graph.order:
            over = leaving[lbl]
            block = self.blocks[lbl]
            dead = set()
            for pos in range(len(block.body) - 1, -1, -1):
                def on_store(is_dead, pos=pos):
                    if is_dead:
                        dead.add(pos)
                over = _backward_stmt(self.view, over, self.effects(lbl, pos), on_store)
            if dead:
                for pos in dead:
                    self._drop_definition(block.body[pos])
                block.body = [s for pos, s in enumerate(block.body) if pos not in dead]
                changed = True
        return changed


class _AssignedElsewhere:
    """The names a serial task must not read as its own definitions: those assigned outside it
    (a loop body's are those of serial code: :func:`accesses.serial_definitions`)."""

    def __init__(self, owners, unit):
        self.owners, self.unit = owners, id(unit)

    def __contains__(self, name):
        return self.owners.get(name, {None}) != {self.unit}


def _owners(state) -> dict:
    """name -> ids of the units (None: no unit) whose blocks assign it."""
    ir = state.ir
    unit_of = {lbl: id(u) for u in state.task_plan.units for lbl in u.labels}
    out = {}
    for lbl, block in state.func_ir.blocks.items():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign):
                out.setdefault(stmt.target.name, set()).add(unit_of.get(lbl))
    return out


class CfgOptimize:
    name = "cfg_optimize"

    def run(self, state) -> bool:
        config = state.config
        if not (config.cfg_optimization and config.cfg_optimization_per_task) or state.task_plan is None:
            return False
        state.refresh_definitions()
        serial_defs, owners = serial_definitions(state), _owners(state)
        changed_units = []
        for unit in state.task_plan.units:
            if unit.kind == "serial" and unit.start is None:
                continue
            defs = serial_defs if unit.kind == "range_for" else _AssignedElsewhere(owners, unit)
            if _TaskOptimizer(state, unit, defs).run(eliminate_stores=not config.debug):
                changed_units.append(unit)
        if not changed_units:
            return False
        labels = set().union(*(u.labels for u in changed_units))
        remove_dead_pure(state, labels)
        serial_defs = serial_definitions(state)
        for unit in changed_units:
            with_accesses(state, unit, serial_defs)
        state.tasks = [unit.task for unit in state.task_plan.units]
        return True
