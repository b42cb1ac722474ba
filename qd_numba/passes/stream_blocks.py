"""``with qd.stream_parallel():`` blocks: their structure, checked, and the stream group of each Task.

Input: the kernel IR after inlining and static folding, where a ``with`` block is an
``enter_with`` statement (on the context manager the ``qd.stream_parallel()`` call made), the
block's code, and a ``pop_block`` where it ends. One check and two passes:

* :func:`reject_with_in_func` (called by InlineFuncs) rejects a ``with`` in a ``qd.func``;
* :class:`MarkStreamBlocks` (before Offload) checks the rules of Quadrants and records, in
  ``state.stream_groups``, the stream group of every IR block inside a ``with`` block (1, 2, ...
  in program order), then removes the ``enter_with``/``pop_block`` statements and the call, so
  the rest of the pipeline sees ordinary top-level code. Offload gives each range-for Task the
  group of its loop header; fusion never merges Tasks of different groups.
* :class:`TagSerialStreamGroups` (after PlanTasks) gives each serial Task the group of the
  blocks it does work in, and rejects a value that one block computes and another reads
  through a temporary (the blocks run concurrently: that read would race).

The rules (errors name the kernel and the line): when a kernel has a ``qd.stream_parallel()``
block, every top-level statement is such a block (all or nothing; a docstring is fine); a block
is at the kernel's top level (not in a loop or under an ``if``), never nested, never in a
``qd.func``, never in a ``graph=True`` kernel, and does not ``return`` (nor does the kernel return
a value). Any other ``with`` in a kernel is rejected. Kernels without ``with`` are left alone
(MarkStreamBlocks returns False); so are the Tasks of kernels without blocks."""

from __future__ import annotations

import warnings
import weakref

from ..errors import QuadrantsSyntaxError, QuadrantsWarning
from ..lang import stream_parallel
from .accesses import resource_name
from .base import try_static
from .ir_builder import successors
from .plan_tasks import does_work

_NOT_ONLY_BLOCKS = ("when a kernel uses qd.stream_parallel(), every top-level statement must be a "
                    "'with qd.stream_parallel():' block; move this code into a block or into another kernel")


class MarkStreamBlocks:
    name = "mark_stream_blocks"

    def run(self, state) -> bool:
        ir = state.ir
        blocks = state.func_ir.blocks
        enters = [(lbl, stmt) for lbl, block in blocks.items() for stmt in block.body
                  if isinstance(stmt, ir.EnterWith)]
        if not enters:
            return False
        state.refresh_definitions()
        cfg = state.tools.analysis.compute_cfg_from_blocks(blocks)
        order = {lbl: k for k, lbl in enumerate(cfg.topo_order())}
        enters.sort(key=lambda e: order[e[0]])
        calls = [self._check_enter(state, cfg, lbl, stmt) for lbl, stmt in enters]
        groups = {}
        for group, (lbl, _) in enumerate(enters, 1):
            for member in self._block_labels(state, lbl):
                groups[member] = group
        self._check_outside(state, groups, {id(c) for c in calls})
        for block in blocks.values():
            block.body = [s for s in block.body if not isinstance(s, (ir.EnterWith, ir.PopBlock))]
        for call in calls:
            call.value = ir.Const(None, call.loc)
        state.stream_groups = groups
        state.refresh_definitions()
        return True

    def _check_enter(self, state, cfg, label, stmt):
        """The assignment of the ``qd.stream_parallel()`` call a valid ``with`` enters."""
        call = self._manager_call(state, stmt.contextmanager)
        if call is None or try_static(state, call.value.func) is not stream_parallel:
            raise state.error(QuadrantsSyntaxError, "'with' in a kernel only supports qd.stream_parallel()",
                              stmt.loc)
        if state.graph:
            raise state.error(QuadrantsSyntaxError,
                              "qd.stream_parallel() is not compatible with graph=True kernels; remove graph=True "
                              "or the qd.stream_parallel() block", stmt.loc)
        if call.value.args or call.value.kws:
            raise state.error(QuadrantsSyntaxError, "qd.stream_parallel() takes no arguments", stmt.loc)
        if label not in cfg.backbone() or cfg.in_loops(label):
            raise state.error(QuadrantsSyntaxError,
                              "'with qd.stream_parallel():' must be at the kernel's top level (not inside a "
                              "loop, an 'if' or another block)", stmt.loc)
        return call

    @staticmethod
    def _manager_call(state, var):
        """The ``Assign`` of the call that made the context manager ``var`` (through copies)."""
        ir = state.ir
        for _ in range(8):
            defs = state.func_ir._definitions.get(var.name, [])
            if len(defs) != 1:
                return None
            value = defs[0]
            if isinstance(value, ir.Var):
                var = value
                continue
            if isinstance(value, ir.Expr) and value.op == "call":
                for block in state.func_ir.blocks.values():
                    for stmt in block.body:
                        if isinstance(stmt, ir.Assign) and stmt.value is value:
                            return stmt
            return None
        return None

    @staticmethod
    def _block_labels(state, label):
        """The IR blocks of the ``with`` block entered in block ``label``: those reached from it
        up to (and with) the one that pops it."""
        ir = state.ir
        blocks = state.func_ir.blocks
        members, todo = set(), list(successors(ir, blocks[label]))
        while todo:
            lbl = todo.pop()
            if lbl in members:
                continue
            members.add(lbl)
            body = blocks[lbl].body
            for stmt in body:
                if isinstance(stmt, ir.EnterWith):
                    raise state.error(QuadrantsSyntaxError, "qd.stream_parallel() blocks cannot be nested",
                                      stmt.loc)
                if isinstance(stmt, ir.Return):
                    raise state.error(QuadrantsSyntaxError, "'return' inside a qd.stream_parallel() block is not "
                                      "supported", stmt.loc)
            if any(isinstance(stmt, ir.PopBlock) for stmt in body):
                continue
            todo.extend(successors(ir, blocks[lbl]))
        return members

    @staticmethod
    def _check_outside(state, groups, calls):
        """Outside the blocks only the plumbing of the kernel and of its ``with`` statements:
        arguments (template ones bound to their values), constants, globals, copies and attribute
        reads of temporaries, the calls that make the context managers, jumps and the final
        ``return None``."""
        ir = state.ir
        for lbl, block in state.func_ir.blocks.items():
            if lbl in groups:
                continue
            for stmt in block.body:
                if isinstance(stmt, (ir.Jump, ir.Return, ir.Del, ir.EnterWith, ir.PopBlock)):
                    continue
                if isinstance(stmt, ir.Assign):
                    value = stmt.value
                    # template parameters are bound to their values (passes/bind_arguments.py)
                    if id(stmt) in calls or isinstance(value, ir.Arg) or stmt.target.name in state.template_values:
                        continue
                    if isinstance(value, ir.Expr) and value.op == "cast" and not _is_none(state, value.value):
                        raise state.error(QuadrantsSyntaxError, "a kernel with qd.stream_parallel() blocks cannot "
                                          "return a value", stmt.loc)
                    if state.is_temp(stmt.target) and (
                            isinstance(value, (ir.Const, ir.Global, ir.FreeVar, ir.Var))
                            or (isinstance(value, ir.Expr) and value.op in ("getattr", "cast"))):
                        continue
                raise state.error(QuadrantsSyntaxError, _NOT_ONLY_BLOCKS, stmt.loc)


def _is_none(state, var) -> bool:
    value = state.definition(var)
    return isinstance(value, state.ir.Const) and value.value is None


def reject_with_in_func(state, func_ir, func_name: str) -> None:
    """InlineFuncs calls this before inlining a ``qd.func``: a ``with`` statement in it is an error
    (``qd.stream_parallel()`` blocks belong to kernels)."""
    ir = state.ir
    for block in func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.EnterWith):
                raise state.error(QuadrantsSyntaxError,
                                  f"qd.func '{func_name}': qd.stream_parallel() can only be used inside @qd.kernel, "
                                  "not @qd.func (nor any other 'with')", stmt.loc)


class TagSerialStreamGroups:
    name = "tag_serial_stream_groups"

    def run(self, state) -> bool:
        groups = state.stream_groups
        plan = state.task_plan
        if not groups or plan is None:
            return False
        blocks = state.func_ir.blocks
        changed = False
        for unit in plan.units:
            if unit.kind != "serial":
                continue
            found = sorted({groups.get(lbl, 0) for lbl in unit.labels
                            if any(does_work(state, s) for s in blocks[lbl].body)} - {0})
            if len(found) > 1:
                raise state.error(QuadrantsSyntaxError,
                                  "the code after the last loop of one qd.stream_parallel() block and before the "
                                  "first loop of the next runs as one serial task; put it inside a loop of its "
                                  "block", self._first_work(state, unit))
            if found and unit.task.stream_group != found[0]:
                unit.task = unit.task.renumbered(unit.task.index, stream_group=found[0])
                changed = True
        producer = {slot: unit for unit in plan.units for slot in unit.stores.values()}
        for unit in plan.units:
            for name, slot in unit.loads.items():
                source = producer.get(slot)
                if source is not None and source.task.stream_group != unit.task.stream_group \
                        and source.task.stream_group and unit.task.stream_group:
                    raise state.error(QuadrantsSyntaxError,
                                      f"'{name}' is computed in one qd.stream_parallel() block and read in another; "
                                      "the blocks run concurrently: compute it in the block that reads it",
                                      self._first_work(state, unit))
        if changed:
            state.tasks = [unit.task for unit in plan.units]
        _warn_racing_blocks(state, [unit.task for unit in plan.units])
        return changed

    @staticmethod
    def _first_work(state, unit):
        blocks = state.func_ir.blocks
        locs = [s.loc for lbl in sorted(unit.labels) for s in blocks[lbl].body
                if s.loc is not None and does_work(state, s)]
        return min(locs, key=lambda loc: loc.line or 0) if locs else None


def _block_uses(tasks) -> dict:
    """stream group -> {"store" | "atomic" | "load": {resource: the first task making it}} of
    the accesses the analysis is sure of (a full-index load, a store, an atomic update)."""
    uses: dict = {}
    for task in tasks:
        if not task.stream_group:
            continue
        kinds = uses.setdefault(task.stream_group, {"store": {}, "atomic": {}, "load": {}})
        for access in task.accesses:
            if access.what in kinds and (access.what != "load" or access.kind == "read"):
                kinds[access.what].setdefault(access.resource, task)
    return uses


def _data_name(state, resource: int) -> str:
    """The name a person knows data by: the parameter, the field's ``name=``, else the name the
    kernel's code reaches the field by (a global, a closure variable, a template argument or an
    attribute of one), else ``field#k``."""
    field = state.hidden_by_arg_index(resource)
    if field is None or getattr(field, "name", None):
        return resource_name(state, resource)
    fn = state.func_ir.func_id.func
    closure = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            closure[name] = cell.cell_contents
        except ValueError:      # a closure variable not assigned yet
            pass
    for scope in (closure.items(), getattr(fn, "__globals__", {}).items(), state.template_values.items()):
        for name, value in scope:
            if value is field:
                return name
    for owner, value in state.template_values.items():
        for attr, member in getattr(value, "__dict__", {}).items():
            if member is field:
                return f"{owner}.{attr}"
    return resource_name(state, resource)


_warned_races = weakref.WeakKeyDictionary()   # kernel's Python function -> data names warned about


def _warn_racing_blocks(state, tasks) -> None:
    """A ``QuadrantsWarning`` for data one ``qd.stream_parallel()`` block stores to and another
    block loads, stores to or updates atomically, or that one block updates atomically and
    another loads (atomic updates from several blocks are fine): the blocks run concurrently on
    a GPU, so the result depends on timing there. Once per kernel and data (a kernel compiles
    again per argument types and target), at the first block's loop."""
    uses = _block_uses(tasks)
    if len(uses) < 2:
        return
    warned = _warned_races.setdefault(state.func_ir.func_id.func, set())
    for g, mine in uses.items():
        for h, theirs in uses.items():
            if g == h:
                continue
            clashes = [(r, t, "stores to") for r, t in theirs["store"].items() if r in mine["store"]]
            clashes += [(r, t, "updates atomically") for r, t in theirs["atomic"].items() if r in mine["store"]]
            clashes += [(r, t, "loads") for r, t in theirs["load"].items() if r in mine["store"]]
            # a block that updates data atomically also loads it for ``x[i] += v``: not a read to warn of
            clashes += [(r, t, "loads") for r, t in theirs["load"].items()
                        if r in mine["atomic"] and r not in theirs["atomic"]]
            for resource, other, verb in clashes:
                name = _data_name(state, resource)
                if name in warned:
                    continue
                warned.add(name)
                writer = mine["store"].get(resource) or mine["atomic"][resource]
                first = min((writer, other), key=lambda t: t.stream_group)
                message = (f"in kernel '{state.kernel_name}': '{name}' is written in the qd.stream_parallel() block "
                           f"at {writer.loc} and the block at {other.loc} {verb} it; the blocks run at the same "
                           "time on a GPU, so what each sees depends on timing: use it in one block only (or "
                           "only atomic updates in both), or split the kernel")
                filename, _, line = first.loc.rpartition(":")
                warnings.warn_explicit(message, QuadrantsWarning, filename or "<unknown>",
                                       int(line) if line.isdigit() else 0)
