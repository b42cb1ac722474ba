"""ReduceAtomics: updates of one address from a parallel loop become per-thread partials.

Input: the kernel IR after Offload and fusion (``state.loops``). Two shapes of update inside
a range-for task are reductions: every iteration combines a value into the same place with
an associative, commutative op (``+=``/``-=``, ``qd.atomic_add/sub/min/max``):

* **uniform atomics on global data**: ``G[I] op= V`` (rewritten to ``atomic_update`` by
  RewriteSubscripts) where the address does not depend on the loop: ``I`` is computed from
  constants and values defined before the loop (``loss[None]``, ``hist[0]``, ``acc[k, 1]``);
  its old value is unused; and every access the loop makes to ``G`` is such an update, with
  ops of one class (add/sub, min or max) per address (addresses count as distinct only when
  all of ``G``'s indices are constants: ``out[1] += v; qd.atomic_max(out[2], v)``). Off with
  ``warp_reduce=False`` (``QD_WARP_REDUCE=0``);
* **kernel-scope locals**: ``s = 0.0; for i in x: s += x[i]; return s`` — a local assigned
  before the loop whose every mention in the loop is ``s += v``/``s -= v``,
  ``qd.atomic_<op>(s, v)`` with the old value unused, or ``m = qd.max(m, v)`` / ``qd.min``,
  and read after the loop (Offload accepts it through :func:`kernel_scope_reduction`; any
  other assignment to such a local stays Offload's error). Always on: it is what the program means.

The rewrite, per reduction, keeps the loop a plain task of every target:

* the preheader (loop setup, no work) sets the partial ``p = reduce_identity(G or s, op)``;
  a task receives it like any value computed before it (CPU: by value, per chunk; CUDA:
  recomputed per thread, or from a temporary);
* each update becomes ``p = reduce_step(p, V, op)``;
* a *combine block*, new in the loop's body, runs once per chunk (CPU) or thread (CUDA)
  after the loop: ``reduce_combine(G, I, p, op, warp)`` — one atomic per chunk, or per warp on
  CUDA after a shuffle reduction (lowering/reduce.py);
* a kernel-scope local lives in cells of a ``u64`` field the pass creates (a block of
  ``CELLS_PER_LOCAL`` 8-byte cells per reduction: a vector or matrix local takes one per
  element, reduced element by element): the preheader stores ``s`` into them, the combine
  updates them, and the loop's exit reads ``s`` back.

Never touches serial code other than the preheader and the head of the loop's exit.
"""

from __future__ import annotations

import dataclasses
import operator

from .. import dtypes
from .. import math as qd_math
from ..field import Field
from ..lowering import array_access
from ..lowering import reduce as rd
from ..lowering import subscripts as sub_impl
from .base import MISSING, hidden_argument, resolve_copies, try_static
from .ir_builder import retarget, successors
from .plan_tasks import _assignments

_INPLACE_OPS = {operator.iadd: "add", operator.isub: "sub"}
_EXTREMA = {max: "max", min: "min", qd_math.max: "max", qd_math.min: "min"}   # ``m = qd.max(m, v)``
_REDUCIBLE = frozenset(rd.COMBINE_OP)
_INVARIANT_OPS = ("binop", "unary", "build_tuple", "cast", "static_getitem", "getattr")


# -- analysis ------------------------------------------------------------------------------------------

_DEAD_IF_UNUSED = ("getitem", "static_getitem", "binop", "inplace_binop", "unary", "cast", "build_tuple", "getattr")
_PURE_LOADS = (array_access.array_load,)   # DirectArrayAccess's unchecked ndarray load


def _dead_if_unused(state, expr) -> bool:
    if expr.op == "call":
        return try_static(state, expr.func) in _PURE_LOADS
    return expr.op in _DEAD_IF_UNUSED


def _uses(state) -> tuple[dict, set]:
    """(var name -> number of live statements reading it, ids of dead statements). ``G[I] += V``
    leaves the load ``G[I]`` and the sum unused once RewriteSubscripts made it an atomic: such
    values (loads and operators nobody reads) are dead, and do not count as uses."""
    ir = state.ir
    out, reads = {}, {}
    for block in state.func_ir.blocks.values():
        for stmt in block.body:
            target = stmt.target.name if isinstance(stmt, ir.Assign) else None
            reads[id(stmt)] = [v.name for v in stmt.list_vars() if v.name != target]
            for name in reads[id(stmt)]:
                out[name] = out.get(name, 0) + 1
    dead, changed = set(), True
    while changed:
        changed = False
        for block in state.func_ir.blocks.values():
            for stmt in block.body:
                if id(stmt) not in dead and isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) \
                        and _dead_if_unused(state, stmt.value) and not out.get(stmt.target.name, 0) \
                        and len(state.func_ir._definitions.get(stmt.target.name, ())) == 1:
                    dead.add(id(stmt))
                    for name in reads[id(stmt)]:
                        out[name] -= 1
                    changed = True
    return out, dead


@dataclasses.dataclass
class _LocalSite:
    """One update of a kernel-scope local in a loop body."""
    update: object          # the statement computing the new value (inplace_binop or apply_op call)
    store: object           # ``s = <new value>``
    value: object           # the operand
    op: str


def kernel_scope_reduction(state, lp, name: str, uses=None):
    """The update sites of local ``name`` in loop ``lp`` if it is a kernel-scope reduction
    (module docstring), else None. ``uses``: :func:`_uses` of the kernel, if known."""
    ir = state.ir
    uses, dead = _uses(state) if uses is None else uses
    blocks = state.func_ir.blocks
    assigns = _assignments(state)
    if not any(lbl not in lp.body for lbl, _ in assigns.get(name, ())) or not _exits_directly(state, lp):
        return None                      # never set before the loop, or no place for the combine
    sites, allowed = [], set()
    for lbl in lp.body:
        body = blocks[lbl].body
        for k, stmt in enumerate(body):
            if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr)):
                continue
            found = _local_update(state, stmt, name)
            if found is None:
                continue
            value, op = found
            if stmt.target.name == name:     # ``m = qd.max(m, v)`` stores the call's value directly
                store = stmt
            else:
                store = next((s for s in body[k + 1:] if isinstance(s, ir.Assign) and s.target.name == name
                              and isinstance(s.value, ir.Var) and s.value.name == stmt.target.name), None)
                if store is None or uses.get(stmt.target.name, 0) != 1:
                    return None
            sites.append(_LocalSite(stmt, store, value, op))
            allowed.update((id(stmt), id(store)))
    if not sites or len({rd.COMBINE_OP[s.op] for s in sites}) != 1:
        return None
    for lbl in lp.body:
        for stmt in blocks[lbl].body:
            if id(stmt) in allowed or id(stmt) in dead or name not in {v.name for v in stmt.list_vars()}:
                continue
            # ``old = s`` of ``qd.atomic_<op>(s, v)``, the old value unused
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Var) and stmt.value.name == name \
                    and uses.get(stmt.target.name, 0) == 0:
                allowed.add(id(stmt))
                continue
            return None
    return sites


def _exits_directly(state, lp) -> bool:
    """The loop's header branches to its exit (where the combine block goes; not a ``for ... else``)."""
    return lp.exit in successors(state.ir, state.func_ir.blocks[lp.header])


def _local_update(state, stmt, name):
    """(operand, op) if ``stmt`` computes ``name op operand`` as ``+=``/``-=``, qd.atomic_<op>,
    or ``qd.max(name, operand)`` / ``qd.min`` (builtin ``max``/``min`` too, either order)."""
    expr = stmt.value
    if expr.op == "inplace_binop" and expr.fn in _INPLACE_OPS and expr.lhs.name == name:
        return expr.rhs, _INPLACE_OPS[expr.fn]
    if expr.op == "call" and len(expr.args) == 2 and not expr.kws and expr.vararg is None \
            and [a.name for a in expr.args].count(name) == 1:
        op = _EXTREMA.get(try_static(state, expr.func))
        if op is not None:
            return next(a for a in expr.args if a.name != name), op
    if expr.op == "call" and len(expr.args) == 3 and expr.args[0].name == name \
            and try_static(state, expr.func) is sub_impl.apply_op:
        op = try_static(state, expr.args[2])
        if op in _REDUCIBLE:
            return expr.args[1], op
    return None


@dataclasses.dataclass
class _GlobalSite:
    stmt: object            # ``$old = atomic_update(G, I, V, op)``
    root: object            # the variable holding G's argument
    op: str


class _Loop:
    """What one offloaded loop reduces."""

    def __init__(self, state, lp, assigns, uses):
        self.state, self.lp, self.assigns = state, lp, assigns
        self.uses, self.dead = uses
        self._invariant = {}

    # global data ---------------------------------------------------------------------------------
    def global_sites(self) -> list[_GlobalSite]:
        state, ir = self.state, self.state.ir
        blocks = state.func_ir.blocks
        if not _exits_directly(state, self.lp):
            return []
        candidates, mentions = [], {}
        for lbl in sorted(self.lp.body):
            for stmt in blocks[lbl].body:
                if id(stmt) in self.dead:
                    continue
                site = self._atomic_site(stmt)
                if site is not None:
                    candidates.append(site)
                copy = isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Var)
                for v in stmt.list_vars():
                    root = self._root(v)
                    if root is not None and not copy:
                        mentions.setdefault(root.name, []).append(stmt)
        out = []
        for name, stmts in mentions.items():
            sites = [c for c in candidates if c.root.name == name]
            if len(sites) != len(stmts) or {id(s.stmt) for s in sites} != {id(s) for s in stmts}:
                continue
            # ops of one class per address; addresses are told apart only when all are constants
            indices = [try_static(self.state, s.stmt.value.args[1]) for s in sites]
            keys = indices if MISSING not in indices and all(_hashable(i) for i in indices) else [0] * len(sites)
            classes = {}
            for key, s in zip(keys, sites):
                classes.setdefault(key, set()).add(rd.COMBINE_OP[s.op])
            if all(len(c) == 1 for c in classes.values()):
                out += [s for s in sites if self.invariant(s.stmt.value.args[1])]
        return out

    def _atomic_site(self, stmt):
        state, ir = self.state, self.state.ir
        if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call"
                and len(stmt.value.args) == 4 and try_static(state, stmt.value.func) is sub_impl.atomic_update):
            return None
        op = try_static(state, stmt.value.args[3])
        root = self._root(stmt.value.args[0])
        if op not in _REDUCIBLE or root is None or self.uses.get(stmt.target.name, 0) or not _scalar_data(state, root):
            return None
        return _GlobalSite(stmt, root, op)

    def _root(self, var):
        """The variable holding the global data argument ``var`` copies, or None."""
        state = self.state
        root, d = resolve_copies(state, var)
        return root if isinstance(d, state.ir.Arg) else None

    # loop invariance -------------------------------------------------------------------------------
    def invariant(self, var) -> bool:
        """Whether ``var`` has the same value in every iteration: computed from constants and
        values set before the loop, by pure operations."""
        name = var.name
        if name not in self._invariant:
            self._invariant[name] = False           # a cycle is not invariant
            self._invariant[name] = self._is_invariant(name)
        return self._invariant[name]

    def _is_invariant(self, name) -> bool:
        ir = self.state.ir
        defs = self.assigns.get(name, [])
        inside = [stmt for lbl, stmt in defs if lbl in self.lp.body]
        if not inside:
            return bool(defs)
        if len(defs) != 1:
            return False
        value = inside[0].value
        if isinstance(value, (ir.Const, ir.Global, ir.FreeVar)):
            return True
        if isinstance(value, ir.Var):
            return self.invariant(value)
        return isinstance(value, ir.Expr) and value.op in _INVARIANT_OPS \
            and all(self.invariant(v) for v in value.list_vars())

    def materialise(self, var, out: list, scope, loc):
        """A variable holding ``var``'s (invariant) value at the combine block: ``var`` itself
        when it is set before the loop, else a fresh copy of its computation appended to ``out``."""
        ir = self.state.ir
        defs = [stmt for lbl, stmt in self.assigns.get(var.name, []) if lbl in self.lp.body]
        if not defs:
            return var
        value = defs[0].value
        if isinstance(value, ir.Var):
            return self.materialise(value, out, scope, loc)
        if isinstance(value, ir.Expr):
            expr = ir.Expr(value.op, value.loc, **{
                k: (self.materialise(v, out, scope, loc) if isinstance(v, ir.Var) else
                    [self.materialise(x, out, scope, loc) if isinstance(x, ir.Var) else x for x in v]
                    if isinstance(v, list) else v)
                for k, v in value._kws.items()})
            value = expr
        new = scope.redefine("$qd_reduce_index", loc)
        out.append(ir.Assign(value, new, loc))
        return new


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _scalar_data(state, root) -> bool:
    """Global data whose elements are 32/64-bit int or float scalars (what the partials hold)."""
    d = state.definition(root)
    field = state.hidden_by_arg_index(d.index)
    if field is not None:
        dtype = None if field.elem_type is not None else field.dtype
    else:
        dtype = getattr(state.param_types.get(d.name), "dtype", None)
    return dtype in (dtypes.i32, dtypes.i64, dtypes.u32, dtypes.u64, dtypes.f32, dtypes.f64)


# -- the rewrite ---------------------------------------------------------------------------------------

class _Emitter:
    def __init__(self, state, scope, loc):
        self.ir, self.scope, self.loc = state.ir, scope, loc
        self.out = []

    def const(self, value, hint="$qd_reduce_const"):
        var = self.scope.redefine(hint, self.loc)
        self.out.append(self.ir.Assign(self.ir.Const(value, self.loc), var, self.loc))
        return var

    def call(self, fn, args, target=None):
        ir, loc = self.ir, self.loc
        fvar = self.scope.redefine(f"$qd_{fn.__name__}", loc)
        target = target if target is not None else self.scope.redefine(f"$qd_{fn.__name__}_out", loc)
        self.out += [ir.Assign(ir.Global(fn.__name__, fn, loc), fvar, loc),
                     ir.Assign(ir.Expr.call(fvar, list(args), (), loc), target, loc)]
        return target


class ReduceAtomics:
    name = "reduce_atomics"

    def run(self, state, adjoints: bool = False) -> bool:
        """``adjoints``: ReverseMode calls it on the gradient tasks it made, whose adjoint
        accumulations ``G.grad[I] += g`` at a uniform address reduce like any other."""
        # the gradient compile differentiates the forward body as written: ReverseMode drops its
        # stores and atomics, and a partial would be a call it cannot differentiate
        if not state.loops or (state.autodiff_mode in ("reverse", "forward") and not adjoints):
            return False
        state.refresh_definitions()
        assigns, uses = _assignments(state), _uses(state)
        warp = state.config.warp_reduce
        candidates = {lp.header: set() if adjoints else self._local_candidates(state, lp) for lp in state.loops}
        live_map = self._live_map(state) if any(candidates.values()) else {}
        plans = []
        cells = 0
        for lp in state.loops:
            loop = _Loop(state, lp, assigns, uses)
            sites = loop.global_sites() if warp else []
            locals_ = []
            for name in sorted(candidates[lp.header] & set(live_map.get(lp.exit, ()))):
                found = kernel_scope_reduction(state, lp, name, uses)
                if found is not None:
                    locals_.append((name, found, cells))
                    cells += rd.CELLS_PER_LOCAL     # the type is not known yet: room for a vector
            if sites or locals_:
                plans.append((lp, loop, sites, locals_))
        if not plans:
            return False
        buf = self._cell_field(state, cells) if cells else None
        for lp, loop, sites, locals_ in plans:
            self._rewrite(state, lp, loop, sites, locals_, buf, warp)
        by_index = {lp.task_index: lp for lp in state.loops}
        state.tasks = [dataclasses.replace(t, body=frozenset(by_index[t.index].body))
                       if t.index in by_index and t.kind == "range_for" else t for t in state.tasks]
        state.refresh_definitions()
        return True

    @staticmethod
    def _local_candidates(state, lp) -> set:
        """User locals the loop updates as ``s += v``/``s -= v`` or ``qd.atomic_<op>(s, v)``: the
        only ones that can be kernel-scope reductions (then the kernel's liveness is needed)."""
        ir = state.ir
        out = set()
        for lbl in lp.body:
            for stmt in state.func_ir.blocks[lbl].body:
                if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr)):
                    continue
                expr = stmt.value
                named = [expr.lhs] if expr.op == "inplace_binop" else expr.args if expr.op == "call" else []
                out.update(v.name for v in named if not state.is_temp(v) and _local_update(state, stmt, v.name))
        return out

    @staticmethod
    def _live_map(state) -> dict:
        analysis, blocks = state.tools.analysis, state.func_ir.blocks
        usedefs = analysis.compute_use_defs(blocks)
        return analysis.compute_live_map(analysis.compute_cfg_from_blocks(blocks), blocks, usedefs.usemap,
                                         usedefs.defmap)

    @staticmethod
    def _cell_field(state, cells: int):
        """A ``u64`` field of 8-byte cells (a block per kernel-scope reduction), as a hidden argument."""
        field = Field.scratch(dtypes.u64, (cells,), name=f"{state.kernel_name}.reductions")
        return hidden_argument(state, field, state.func_ir.blocks[min(state.func_ir.blocks)].loc)

    def _rewrite(self, state, lp, loop, sites, locals_, buf, warp):
        ir = state.ir
        blocks = state.func_ir.blocks
        pre = blocks[lp.preheader]
        scope, loc = pre.scope, pre.body[-1].loc
        init = _Emitter(state, scope, loc)       # loop setup: no work of its own
        serial = _Emitter(state, scope, loc)     # before the loop: stores the locals' cells
        combine = _Emitter(state, scope, loc)
        after = _Emitter(state, scope, loc)      # head of the exit: reads the locals back
        replace = {}                             # id(stmt) -> statements replacing it (or [])
        for site in sites:
            partial = scope.redefine("$qd_partial", loc)
            init.call(rd.reduce_identity, [site.root, init.const(rd.COMBINE_OP[site.op])], partial)
            call = site.stmt.value
            step = _Emitter(state, scope, site.stmt.loc)
            step.call(rd.reduce_step, [partial, call.args[2], call.args[3]], partial)
            replace[id(site.stmt)] = step.out
            index = loop.materialise(call.args[1], combine.out, scope, loc)
            combine.call(rd.reduce_combine, [site.root, index, partial, combine.const(rd.COMBINE_OP[site.op]),
                                             combine.const(warp)])
        for name, local_sites, cell in locals_:
            local = ir.Var(scope, name, loc)
            partial = scope.redefine("$qd_partial", loc)
            op = rd.COMBINE_OP[local_sites[0].op]
            stored = serial.call(rd.reduction_cell, [buf, serial.const(cell), local])
            serial.call(rd.cell_store, [stored, local])
            init.call(rd.reduce_identity, [local, init.const(op)], partial)
            for s in local_sites:
                step = _Emitter(state, scope, s.update.loc)
                step.call(rd.reduce_step, [partial, s.value, step.const(s.op)], partial)
                replace[id(s.store)] = []
                replace[id(s.update)] = step.out     # after: the update may be the store itself
            target = combine.call(rd.reduction_cell, [buf, combine.const(cell), partial])
            combine.call(rd.reduce_combine, [target, combine.const(0), partial, combine.const(op),
                                             combine.const(warp)])
            read = after.call(rd.reduction_cell, [buf, after.const(cell), local])
            after.call(rd.cell_load, [read, local], local)
        for lbl in lp.body:
            block = blocks[lbl]
            body = []
            for stmt in block.body:
                if id(stmt) in replace:
                    body += replace[id(stmt)]
                elif not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Var)
                          and any(stmt.value.name == n for n, _, _ in locals_)):
                    body.append(stmt)
            block.body = body
        pre.body[-1:-1] = serial.out + init.out
        lp.setup.extend(init.out)
        label = state.new_label()
        blocks[label] = ir.Block(scope, loc)
        blocks[label].body = combine.out + [ir.Jump(lp.exit, loc)]
        retarget(ir, blocks[lp.header], {lp.exit: label})
        lp.body.add(label)
        exit_block = blocks[lp.exit]
        exit_block.body[:0] = after.out

