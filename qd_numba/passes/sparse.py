"""RewriteSparse: activation and the operations of sparse SNodes, before subscripts are rewritten.

A sparse node (snode.py) keeps a hidden i32 field ``F`` in its tree: one activity flag per cell
(``bitmasked``, ``pointer``) or one length per cell of its parent (``dynamic``). ``cell(I)`` is
the node's cell holding the element ``I`` of a field below it (``(I - offset) // divisor`` per
axis, snode.cell_digits). For a field ``x`` placed below sparse nodes:

===============================  ==================================================================
``x[I] = V`` (also ``+=``)       the store, then per sparse node above ``x``: ``F[cell(I)] = 1``; a
                                 dynamic node: ``qd.atomic_max(F[cell(I)], pos(I) + 1)``
``qd.atomic_op(x[I], V)``        the same activation after the atomic
``qd.activate(n, I)``            ``F[I] = 1``
``qd.deactivate(n, I)``          each field below n zeroed in the cell (``x[I] = 0``, or
                                 lowering/sparse.zero_block over the cell's block of elements), then
                                 ``F[I] = 2`` (a pointer node's block given back: free_block)
``qd.is_active(n, I)``           ``F[I] != 0``
``qd.append(n, I, V)``           ``p = qd.atomic_add(F[I], 1); x[I with p on n's axis] = V`` if ``p`` is
                                 below the capacity (lowering/sparse.store_if); value p
``qd.length(n, I)``              ``min(F[I], capacity)``
``for I in x`` (a struct-for)    the body runs for active cells only: a test after the loop
                                 targets are bound jumps back to the loop header otherwise
===============================  ==================================================================

``n`` is a sparse SNode or a field placed directly under one (its node). Reads are left alone:
deactivation zero-fills a cell, so an inactive cell reads 0 as in Quadrants.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import snode as sn
from ..errors import QuadrantsSyntaxError
from ..field import Field
from ..lang import ATOMIC_FUNCTIONS, atomic_add, atomic_max
from ..lang import grouped as qd_grouped
from ..lang import ndrange as qd_ndrange
from ..lowering.sparse import (
    activate_block,
    activate_cell,
    deactivate_cell,
    free_block,
    set_flag,
    store_if,
    unlist_block,
    zero_block,
)
from ..lowering.subscripts import as_index_tuple, index_vector
from .base import MISSING, hidden_argument, try_static
from .fold_static import bypass_jump_only_headers, loop_shape


def _c_strides(shape) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


_CALLS = {sn.is_active: "is_active", sn.activate: "activate", sn.deactivate: "deactivate", sn.append: "append",
          sn.length: "length", sn.rescale_index: "rescale_index"}


def _sparse_field(value):
    return isinstance(value, Field) and value._snode is not None and value._snode._kind == "place" \
        and bool(sn.sparse_ancestors(value._snode))


def _binds(ir, stmt, index_var) -> bool:
    """Whether ``stmt`` binds the loop target(s) from the loop's index (a copy or exhaust_iter)."""
    if not isinstance(stmt, ir.Assign):
        return False
    value = stmt.value
    if isinstance(value, ir.Expr) and value.op == "exhaust_iter":
        value = value.value
    return isinstance(value, ir.Var) and value.name == index_var.name


class _NodeCells:
    """What a struct-for over a bitmasked/pointer SNode iterates: one element per cell."""

    offset = None

    def __init__(self, node):
        self._snode, self.shape = node, node.shape


def _listed_node(field):
    """The innermost bitmasked/pointer node above ``field`` (a struct-for walks its list of cells),
    or None."""
    nodes = [n for n in sn.sparse_ancestors(field._snode) if n._cells is not None]
    return nodes[-1] if nodes else None


class RewriteSparse:
    name = "rewrite_sparse"

    def run(self, state) -> bool:
        self.state, self.ir = state, state.ir
        state.refresh_definitions()
        changed, self._new_args = False, []
        for block in list(state.func_ir.blocks.values()):
            self.block, self.out = block, []
            block_changed = False
            for stmt in block.body:
                self.loc = stmt.loc
                block_changed |= self._rewrite(stmt)
            if block_changed:
                block.body = self.out
                changed = True
        if changed:
            state.refresh_definitions()
        changed |= self._filter_struct_fors()
        if self._new_args:
            entry = state.func_ir.blocks[min(state.func_ir.blocks)]
            entry.body[:0] = self._new_args
        if changed:
            state.refresh_definitions()
        return changed

    # -- emitting ------------------------------------------------------------------------------
    def _var(self, hint):
        return self.block.scope.redefine(hint, self.loc)

    def _assign(self, value, hint="$qd_sparse"):
        target = self._var(hint)
        self.out.append(self.ir.Assign(value, target, self.loc))
        return target

    def _global(self, obj, hint="$qd_sparse_global"):
        if isinstance(obj, Field):    # a field: a hidden argument (ResolveGlobals has run)
            return hidden_argument(self.state, obj, self.loc, into=self._new_args)
        return self._assign(self.ir.Global(hint.lstrip("$"), obj, self.loc), hint)

    def _const(self, value):
        return self._assign(self.ir.Const(value, self.loc), "$qd_const")

    def _binop(self, fn, lhs, rhs):
        return self._assign(self.ir.Expr.binop(fn, lhs, rhs, self.loc))

    def _index(self, comps):
        """The index of a field access from its components (0-d: None)."""
        if not comps:
            return self._const(None)
        if len(comps) == 1:
            return comps[0]
        return self._assign(self.ir.Expr.build_tuple(list(comps), self.loc))

    def _components(self, var, ndim: int) -> list:
        """The index ``var`` of a field access or a sparse call, one variable per dimension."""
        ir = self.ir
        d = self.state.definition(var)
        if isinstance(d, ir.Expr) and d.op in ("build_tuple", "build_list"):
            items = list(d.items)
        elif isinstance(d, ir.Const) and d.value is None or ndim == 0:
            items = []
        else:   # an int, a tuple or a vector (qd.grouped): as a tuple
            items = self._unpack(var, ndim)
        if len(items) != ndim:
            raise self.state.error(QuadrantsSyntaxError, f"{len(items)} index(es) given where {ndim} are needed",
                                   self.loc)
        return items

    def _unpack(self, var, ndim: int) -> list:
        ir = self.ir
        fn = self._global(as_index_tuple, "$qd_as_index_tuple")
        tup = self._assign(ir.Expr.call(fn, [var], (), self.loc))
        return [self._assign(ir.Expr.static_getitem(tup, k, None, self.loc)) for k in range(ndim)]

    def _digit(self, comp, offset: int, divisor: int):
        if offset:
            comp = self._binop(operator.sub, comp, self._const(offset))
        if divisor != 1:
            comp = self._binop(operator.floordiv, comp, self._const(divisor))
        return comp

    def _cell(self, node, field, comps):
        return [self._digit(comps[r], off, div) for r, off, div in sn.cell_digits(node, field)]

    def _store(self, field, index, value):
        self.out.append(self.ir.SetItem(self._global(field), index, value, self.loc))

    def _atomic(self, fn, field, index, value):
        item = self._assign(self.ir.Expr.getitem(self._global(field), index, self.loc))
        return self._assign(self.ir.Expr.call(self._global(fn, "$qd_atomic"), [item, value], (), self.loc))

    def _activate_for(self, field, index_var):
        """Activate the cells of the sparse nodes above ``field`` that hold ``field[index]``."""
        comps = self._components(index_var, len(field.shape))
        for node in sn.sparse_ancestors(field._snode):
            if node._kind == "dynamic":
                rank, off, div, cap = sn.dynamic_position(node, field)
                pos = self._digit(comps[rank], off, div)
                pos = self._binop(operator.mod, pos, self._const(cap))
                end = self._binop(operator.add, pos, self._const(1))
                self._atomic(atomic_max, node._flags, self._index(self._cell(node._parent, field, comps)), end)
            else:
                self._activate_cell(node, self._cell(node, field, comps))

    def _flat(self, node, cell):
        """The C-order flat index of the cell ``cell`` (its components) of ``node``."""
        flat = None
        for c, stride in zip(cell, _c_strides(node.shape)):
            term = self._binop(operator.mul, c, self._const(stride)) if stride != 1 else c
            flat = term if flat is None else self._binop(operator.add, flat, term)
        return flat

    def _activate_cell(self, node, cell):
        if node._cells is None:    # below a pointer node: no list
            fn = self._global(set_flag, "$qd_set_flag")
            self._assign(self.ir.Expr.call(fn, [self._global(node._flags), self._index(cell), self._const(1)], (),
                                           self.loc))
            return
        args = [self._global(node._flags), self._global(node._cells), self._global(node._count)]
        if node._slots is not None:
            node._tree.materialize()    # the pool's capacity and ring are fixed then
            fn = self._global(activate_block, "$qd_activate_block")
            args += [self._global(node._slots), self._global(node._ring), self._global(node._heads),
                     self._index(cell), self._flat(node, cell), self._const(node._capacity)]
        else:
            fn = self._global(activate_cell, "$qd_activate_cell")
            args += [self._index(cell), self._flat(node, cell)]
        self._assign(self.ir.Expr.call(fn, args, (), self.loc))

    # -- statements --------------------------------------------------------------------------------
    def _rewrite(self, stmt) -> bool:
        ir = self.ir
        if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            field = try_static(self.state, stmt.target)
            if not _sparse_field(field):
                self.out.append(stmt)
                return False
            index = stmt.index if isinstance(stmt, ir.SetItem) else stmt.index_var
            if index is None:
                index = self._const(stmt.index)
            self._activate_for(field, index)    # first: below a pointer node, the store needs the block
            self.out.append(stmt)
            return True
        if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call"):
            self.out.append(stmt)
            return False
        expr = stmt.value
        fn = try_static(self.state, expr.func)
        if fn in ATOMIC_FUNCTIONS and expr.args:
            d = self.state.definition(expr.args[0])
            if isinstance(d, ir.Expr) and d.op in ("getitem", "static_getitem"):
                field = try_static(self.state, d.value)
                if _sparse_field(field):
                    index = d.index if d.op == "getitem" else (d.index_var or self._const(d.index))
                    self._activate_for(field, index)
                    self.out.append(stmt)
                    return True
            self.out.append(stmt)
            return False
        if fn not in _CALLS:
            self.out.append(stmt)
            return False
        what = _CALLS[fn]
        self._sparse_call(what, stmt, expr)
        return True

    def _static_snode(self, var):
        """A field or SNode that ``var`` holds at compile time, through ``.snode`` and ``.parent(n)``
        of one (``x.snode.parent(2)``, ``x.parent().parent()``), or MISSING; the calls met become
        the SNode they give (a compile-time global)."""
        ir = self.ir
        value = try_static(self.state, var)
        if value is not MISSING:
            return value
        d = self.state.definition(var)
        if isinstance(d, ir.Expr) and d.op == "getattr" and d.attr == "snode":
            owner = self._static_snode(d.value)
            node = owner.snode if isinstance(owner, Field) else MISSING
        elif isinstance(d, ir.Expr) and d.op == "call" and not d.kws:
            f, method = self.state.definition(d.func), try_static(self.state, d.func)
            if isinstance(f, ir.Expr) and f.op == "getattr" and f.attr == "parent":
                owner = self._static_snode(f.value)
            elif getattr(method, "__name__", None) == "parent":    # a bound method, folded
                owner = getattr(method, "__self__", None)
            else:
                return MISSING
            args = [try_static(self.state, a) for a in d.args]
            if not isinstance(owner, (Field, sn.SNode)) or MISSING in args:
                return MISSING
            node = owner.parent(*args)
        else:
            return MISSING
        if node is not MISSING:
            self._replace_value(var, ir.Global("snode", node, self.loc))
        return node

    def _replace_value(self, var, value):
        for block in [self.out] + [b.body for b in self.state.func_ir.blocks.values()]:
            for stmt in block:
                if isinstance(stmt, self.ir.Assign) and stmt.target.name == var.name:
                    stmt.value = value
                    return

    def _node(self, what, var):
        value = self._static_snode(var)
        if isinstance(value, Field) and value._snode is not None:
            value = value._snode._parent
        kinds = ("dynamic",) if what in ("append", "length") else ("bitmasked", "pointer")
        if not isinstance(value, sn.SNode) or value._kind not in kinds:
            raise self.state.error(QuadrantsSyntaxError,
                                   f"qd.{what}() takes a {' or '.join(kinds)} SNode known at compile time "
                                   f"(or a field placed directly under one), got {value!r}", self.loc)
        if value._flags is None:
            raise self.state.error(QuadrantsSyntaxError, f"qd.{what}(): no field is placed under {value!r}",
                                   self.loc)
        return value

    def _rescale(self, stmt, expr):
        """``qd.rescale_index(a, b, I)``, from the shapes of ``a`` and ``b`` (compile-time)."""
        ir = self.ir
        if len(expr.args) != 3 or expr.kws:
            raise self.state.error(QuadrantsSyntaxError, "qd.rescale_index() takes 3 arguments", self.loc)
        a, b = (self._static_snode(v) for v in expr.args[:2])
        for v in (a, b):
            if not isinstance(v, (Field, sn.SNode)) or v.shape is None:
                raise self.state.error(QuadrantsSyntaxError, "qd.rescale_index(a, b, I): a and b must be fields "
                                       f"or SNodes known at compile time, got {v!r}", self.loc)
        d = self.state.definition(expr.args[2])
        n = len(d.items) if isinstance(d, ir.Expr) and d.op in ("build_tuple", "build_list") else len(a.shape)
        comps = self._components(expr.args[2], n)
        for k in range(min(n, len(a.shape), len(b.shape))):
            if a.shape[k] > b.shape[k]:
                comps[k] = self._binop(operator.floordiv, comps[k], self._const(a.shape[k] // b.shape[k]))
            elif a.shape[k] < b.shape[k]:
                comps[k] = self._binop(operator.mul, comps[k], self._const(b.shape[k] // a.shape[k]))
        tup = self._assign(ir.Expr.build_tuple(comps, self.loc))
        fn = self._global(index_vector, "$qd_index_vector")
        self.out.append(ir.Assign(ir.Expr.call(fn, [tup], (), self.loc), stmt.target, self.loc))

    def _sparse_call(self, what, stmt, expr):
        ir = self.ir
        if what == "rescale_index":
            self._rescale(stmt, expr)
            return
        want = 3 if what == "append" else 2
        if len(expr.args) != want or expr.kws:
            raise self.state.error(QuadrantsSyntaxError, f"qd.{what}() takes {want} arguments", self.loc)
        node = self._node(what, expr.args[0])
        if what in ("append", "length"):
            parent = node._parent
            comps = self._components(expr.args[1], len(parent.shape))
            index = self._index(comps)
            if what == "length":   # appends past the capacity count in the flag, not in the length
                n = self._assign(ir.Expr.getitem(self._global(node._flags), index, self.loc))
                value = ir.Expr.call(self._global(min, "$qd_min"), [n, self._const(node._sizes[0])], (), self.loc)
            else:
                value = self._append(node, comps, index, expr.args[2])
            self.out.append(ir.Assign(value, stmt.target, self.loc))
            return
        comps = self._components(expr.args[1], len(node.shape))
        index = self._index(comps)
        if what == "is_active":
            flag = self._assign(ir.Expr.getitem(self._global(node._flags), index, self.loc))
            self.out.append(ir.Assign(ir.Expr.binop(operator.eq, flag, self._const(1), self.loc), stmt.target,
                                      self.loc))
            return
        if what == "activate":
            self._activate_cell(node, comps)
        else:    # the data first: a pointer cell's block is given back after
            listed = {id(n._flags) for n in node._walk() if n._cells is not None}
            for below in node._walk():
                if below._kind == "place":
                    self._zero_cell(node, below._field, comps, id(below._field) in listed)
            if node._slots is not None:
                node._tree.materialize()
                fn = self._global(free_block, "$qd_free_block")
                args = [self._global(node._flags), self._global(node._slots), self._global(node._ring),
                        self._global(node._heads), index, self._const(node._capacity)]
            elif node._cells is None:
                fn = self._global(set_flag, "$qd_set_flag")
                args = [self._global(node._flags), index, self._const(0)]
            else:
                fn = self._global(deactivate_cell, "$qd_deactivate_cell")
                args = [self._global(node._flags), index]
            self._assign(ir.Expr.call(fn, args, (), self.loc))
        self.out.append(ir.Assign(ir.Const(None, self.loc), stmt.target, self.loc))

    def _zero_cell(self, node, field, cell, listed=False):
        """Zero the elements of ``field`` in the cell ``cell`` (its components) of ``node``; the
        states of a nested bitmasked/pointer node (``listed``) become 2 where they were listed."""
        if field._snode._parent is node:    # one element per cell
            self._store(field, self._index(cell), self._const(0))
            return
        digits = {rank: (k, off, div) for k, (rank, off, div) in enumerate(sn.cell_digits(node, field))}
        offset = field.offset or (0,) * len(field.shape)
        start, size = [], []
        for rank, n in enumerate(field.shape):
            if rank in digits:     # an axis of the node: the cell's block of div elements
                k, off, div = digits[rank]
                first = self._binop(operator.mul, cell[k], self._const(div))
                start.append(self._binop(operator.add, first, self._const(off)) if off else first)
                size.append(div)
            else:                  # an axis below the node only: all of it
                start.append(self._const(offset[rank]))
                size.append(n)
        starts = self._assign(self.ir.Expr.build_tuple(start, self.loc))
        fn = self._global(unlist_block, "$qd_unlist_block") if listed else self._global(zero_block, "$qd_zero_block")
        self._assign(self.ir.Expr.call(fn, [self._global(field), starts, self._const(tuple(size))], (), self.loc))

    def _append(self, node, comps, index, value):
        ir = self.ir
        places = [c._field for c in node._children if c._kind == "place"]
        if len(places) != 1:
            raise self.state.error(QuadrantsSyntaxError, "qd.append() needs a dynamic node with one field "
                                   f"placed directly under it, this one has {len(places)}", self.loc)
        pos = self._atomic(atomic_add, node._flags, index, self._const(1))
        axis = node._axes[0]
        axes_ = sorted({a for a, _ in node._levels()})
        field = places[0]
        offset = field.offset or (0,) * len(axes_)
        # the element's index: the parent cell's digits, the position on the node's axis
        full = []
        it = iter(comps)
        for k, a in enumerate(axes_):
            full.append(self._binop(operator.add, pos, self._const(offset[k])) if a == axis else next(it))
        ok = self._binop(operator.lt, pos, self._const(node._sizes[0]))   # past the capacity: dropped
        fn = self._global(store_if, "$qd_store_if")
        self._assign(ir.Expr.call(fn, [self._global(field), self._index(full), value, ok], (), self.loc))
        return pos

    # -- struct-fors -------------------------------------------------------------------------------
    def _filter_struct_fors(self) -> bool:
        state, ir = self.state, self.ir
        if not any(_sparse_field(f) for f in state.hidden) and not any(
                isinstance(st, ir.Assign) and isinstance(st.value, ir.Global) and isinstance(st.value.value, sn.SNode)
                for block in state.func_ir.blocks.values() for st in block.body):
            return False    # no field below a sparse node and no SNode: no struct-for to rewrite
        bypass_jump_only_headers(state)
        analysis = state.tools.analysis
        blocks = state.func_ir.blocks
        cfg = analysis.compute_cfg_from_blocks(blocks)
        changed = False
        for loop in analysis.find_top_level_loops(cfg):
            shape = loop_shape(state, loop.header, loop)
            if shape is None:
                continue
            iterable, grouped = shape.iterable, False
            d = state.definition(iterable)
            if isinstance(d, ir.Expr) and d.op == "call" and try_static(state, d.func) is qd_grouped and d.args:
                iterable, grouped = d.args[0], True
            self.out, self.loc = [], shape.loc
            field = self._static_snode(iterable)
            if isinstance(field, sn.SNode):
                field = self._snode_loop(shape, field, iterable, grouped)
                changed = True
                if field is None:
                    continue
            elif not _sparse_field(field):
                continue
            entry = blocks[shape.body_entry]
            ndim = len(field.shape)
            first = entry.body[0]
            binds = _binds(ir, first, shape.index_var)
            self.block, self.out, self.loc = entry, [], first.loc
            node = _listed_node(field)
            if node is not None:    # iterate the node's list of cells, not every element
                comps = self._list_walk(shape, node, field, blocks[shape.preheader])
                if binds:
                    self.out.append(self._bind(first, comps, grouped))
            else:
                if not binds:
                    # the targets are never read: bind them for the test (Offload's forms)
                    value = shape.index_var if ndim == 1 or grouped else \
                        ir.Expr.exhaust_iter(shape.index_var, ndim, shape.loc)
                    first = ir.Assign(value, entry.scope.redefine("$qd_cell", shape.loc), shape.loc)
                    entry.body.insert(0, first)
                self.out.append(first)
                comps = self._unpack(first.target, ndim)
            cond = self._active(field, comps)
            label = max(blocks) + 1
            blocks[label] = ir.Block(entry.scope, first.loc)
            blocks[label].body = entry.body[1 if binds or node is None else 0:]
            entry.body = self.out + [ir.Branch(cond, label, shape.header, self.loc)]
            changed = True
        return changed

    def _snode_loop(self, shape, node, iterable, grouped):
        """A struct-for over an SNode visits its cells: over a dense node, the loop becomes one over
        ``qd.ndrange(*node.shape)`` (None returned); over a bitmasked/pointer node, a stand-in for a
        field of one element per cell is returned (its active cells are walked, as a field's)."""
        ir = self.ir
        if node._kind in ("bitmasked", "pointer"):
            if node._flags is None:
                raise self.state.error(QuadrantsSyntaxError, f"a struct-for over {node!r}: no field is placed "
                                       "under it", shape.loc)
            return _NodeCells(node)
        if node._kind != "dense":
            raise self.state.error(QuadrantsSyntaxError, f"a struct-for over {node!r} is not supported (iterate a "
                                   "field placed under it, or a dense, bitmasked or pointer SNode)", shape.loc)
        pre = self.state.func_ir.blocks[shape.preheader]
        self.block, self.out, self.loc = pre, [], shape.loc
        dims = [self._const(n) for n in node.shape]
        space = self._assign(ir.Expr.call(self._global(qd_ndrange, "$qd_ndrange"), dims, (), self.loc))
        pre.body[:0] = self.out
        if grouped:
            self.state.definition(shape.iterable).args[0] = space
        else:
            getiter = next(st for st in pre.body if isinstance(st, ir.Assign) and isinstance(st.value, ir.Expr)
                           and st.value.op == "getiter" and st.value.value.name == iterable.name)
            getiter.value.value = space
        return None

    def _list_walk(self, shape, node, field, pre):
        """Make the loop ``for t in range(count * cell_elements)`` over ``node``'s list of cells;
        returns the element index of ``t`` (its components), computed at the top of the body."""
        ir = self.ir
        digits = sn.cell_digits(node, field)
        block = list(field.shape)        # the elements of one cell of ``node``, per index rank
        for rank, _, div in digits:
            block[rank] = div
        elements = int(np.prod(block, dtype=np.int64))
        # the preheader: range(count * elements) instead of the field
        getiter = next(k for k, st in enumerate(pre.body) if isinstance(st, ir.Assign)
                       and isinstance(st.value, ir.Expr) and st.value.op == "getiter"
                       and st.value.value.name == shape.iterable.name)
        body_block, body_out = self.block, self.out
        self.block, self.out = pre, []
        count = self._assign(ir.Expr.getitem(self._global(node._count), self._const(None), self.loc))
        total = self._binop(operator.mul, count, self._const(elements))
        rng = self._assign(ir.Expr.call(self._global(range, "$qd_range"), [total], (), self.loc))
        pre.body[getiter].value.value = rng
        pre.body[getiter:getiter] = self.out
        self.block, self.out = body_block, body_out
        t = shape.index_var
        flat = self._assign(ir.Expr.getitem(self._global(node._cells),
                                            self._binop(operator.floordiv, t, self._const(elements)), self.loc))
        inner = self._binop(operator.mod, t, self._const(elements)) if elements != 1 else None
        cell = [self._unravel(flat, node.shape, k) for k in range(len(node.shape))]
        offset = field.offset or (0,) * len(field.shape)
        comps = [self._unravel(inner, block, r) if inner is not None else self._const(0) for r in range(len(block))]
        for k, (rank, _, div) in enumerate(digits):
            first = self._binop(operator.mul, cell[k], self._const(div)) if div != 1 else cell[k]
            comps[rank] = self._binop(operator.add, first, comps[rank]) if elements != 1 else first
        return [self._binop(operator.add, c, self._const(o)) if o else c for c, o in zip(comps, offset)]

    def _unravel(self, flat, shape, k):
        """Component ``k`` of the C-order flat index ``flat`` over ``shape``."""
        stride = int(np.prod(shape[k + 1:], dtype=np.int64))
        value = self._binop(operator.floordiv, flat, self._const(stride)) if stride != 1 else flat
        return self._binop(operator.mod, value, self._const(shape[k])) if k else value

    def _bind(self, first, comps, grouped):
        """The loop targets' binding ``first``, from the element index ``comps`` instead."""
        ir = self.ir
        if grouped:
            tup = self._assign(ir.Expr.build_tuple(list(comps), self.loc))
            fn = self._global(index_vector, "$qd_index_vector")
            return ir.Assign(ir.Expr.call(fn, [tup], (), self.loc), first.target, first.loc)
        if len(comps) == 1:
            return ir.Assign(comps[0], first.target, first.loc)
        tup = self._assign(ir.Expr.build_tuple(list(comps), self.loc))
        return ir.Assign(ir.Expr.exhaust_iter(tup, len(comps), self.loc), first.target, first.loc)

    def _active(self, field, comps):
        """A variable: whether every sparse node above ``field`` holds the element ``comps``."""
        cond = None
        for node in sn.sparse_ancestors(field._snode):
            if node._kind == "dynamic":
                rank, off, div, cap = sn.dynamic_position(node, field)
                pos = self._binop(operator.mod, self._digit(comps[rank], off, div), self._const(cap))
                n = self._assign(self.ir.Expr.getitem(self._global(node._flags),
                                                      self._index(self._cell(node._parent, field, comps)), self.loc))
                test = self._binop(operator.lt, pos, n)
            else:
                flag = self._assign(self.ir.Expr.getitem(self._global(node._flags),
                                                         self._index(self._cell(node, field, comps)), self.loc))
                test = self._binop(operator.eq, flag, self._const(1))
            cond = test if cond is None else self._binop(operator.and_, cond, test)
        return cond
