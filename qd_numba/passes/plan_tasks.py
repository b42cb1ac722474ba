"""PlanTasks: the kernel's final Task list — which serial code becomes a task, and the values
that cross from one task to another.

Input: the kernel IR after Offload (and fusion): ``state.loops`` holds the range-for loops every
run reaches once, in program order. The code between them forms serial regions; a region becomes
a ``serial`` Task when it does work (stores, loads of global data, calls), computes a value a
later task reads that cannot be recomputed, or returns the kernel's value. Every target runs
the same plan, so ``kernel.tasks()`` is the same on every target.

Values crossing task boundaries:

* a value whose definition is a *pure* expression of arguments and constants (a shape, a loop
  bound, ``n - 1``) is recomputed inside each task that needs it;
* anything else (a value loaded from a field, a serial loop's result) is stored by the serial
  task that computes it into a temporary slot and loaded by the tasks that read it (a target
  that runs serial code inline, as the CPU does, passes such values directly).

Output: ``state.tasks`` (serial and range-for Tasks, renumbered in program order; each loop's
``task_index`` follows) and ``state.task_plan`` (a :class:`TaskPlan`). Never changes the IR.
"""

from __future__ import annotations

import dataclasses

from ..errors import QuadrantsCompilationError
from ..lowering import reduce, spaces
from ..task import Task
from .accesses import BodyAccesses, resource_name, serial_definitions
from .base import is_global_data, try_static
from .ir_builder import op_traits, successors
from .liveness import Liveness


def task_prefix(state) -> str:
    return state.kernel_qualname or state.kernel_name


_PURE_CALLS = (spaces.range_dim, spaces.ndrange_dim, spaces.shape_space, spaces.space_total,
               reduce.reduce_identity)


@dataclasses.dataclass
class Unit:
    """One task in program order, as planned: a loop (``range_for``) or a serial region."""

    kind: str
    labels: set
    loop: object = None                 # offload.OffloadedLoop for range_for
    start: int | None = None            # serial: first block of the region
    launched: bool = False
    stores: dict = dataclasses.field(default_factory=dict)   # var -> temp slot (values produced here)
    loads: dict = dataclasses.field(default_factory=dict)    # var -> temp slot (values read from earlier tasks)
    recompute: list = dataclasses.field(default_factory=list)  # pure statements copied into the prologue
    returns: bool = False               # stores the kernel's return value
    ret_var: str | None = None          # the returned variable (set when the IR is built)
    live_ins: list = dataclasses.field(default_factory=list)  # variables defined before the task that it reads
    types: dict | None = None           # variable -> Numba type (passes/task_types.py, per target)
    task: Task | None = None


@dataclasses.dataclass
class TaskPlan:
    units: list                         # the kernel's tasks (launched units), program order
    temp_slots: int
    ret_slot: int | None
    return_type: object = None          # the kernel's inferred return type (passes/task_types.py)


# -- structure -----------------------------------------------------------------------------------

def launched_headers(state) -> set:
    """Headers of the top-level loops that become range-for tasks: those every run of the kernel
    reaches exactly once (the header is on every path from the entry, and in no serial loop).
    A top-level loop under a runtime ``if`` or inside a top-level ``while`` stays in its serial
    task and runs serially, as Quadrants runs loops that are not at the outermost scope."""
    cfg = state.tools.analysis.compute_cfg_from_blocks(state.func_ir.blocks)
    backbone = cfg.backbone()
    return {header for header in backbone
            if header in cfg.loops() and [inner.header for inner in cfg.in_loops(header)] == [header]}


def _regions(state):
    """Serial regions between the launched loops: ``regions[k]`` runs before loop k (k =
    len(loops): after)."""
    ir = state.ir
    blocks = state.func_ir.blocks
    loops = sorted(state.loops, key=lambda lp: lp.task_index)
    headers = {lp.header: k for k, lp in enumerate(loops)}
    starts = [min(blocks)] + [lp.exit for lp in loops]
    owner = {}
    regions = []
    for k, start in enumerate(starts):
        stop = loops[k].header if k < len(loops) else None
        labels, todo = set(), [start]
        while todo:
            lbl = todo.pop()
            if lbl in labels:
                continue
            if lbl in headers:
                if lbl != stop:
                    _nonlinear(state, loops[headers[lbl]])
                continue
            labels.add(lbl)
            todo.extend(successors(ir, blocks[lbl]))
        for lbl in labels:
            if lbl in owner:
                _nonlinear(state, loops[min(k, len(loops) - 1)])
            if k < len(loops) and isinstance(blocks[lbl].body[-1], ir.Return):  # a path around loop k
                _nonlinear(state, loops[k])
            owner[lbl] = k
        regions.append((start if start not in headers else None, labels))
    return loops, regions


def _nonlinear(state, lp):
    loc = state.func_ir.blocks[lp.header].loc
    raise state.error(QuadrantsCompilationError,
                      "internal error: the serial code around this loop does not split into tasks", loc)


# -- values -----------------------------------------------------------------------------------------

def _assignments(state):
    """var name -> list of (label, stmt) assigning it, over the whole kernel IR."""
    ir = state.ir
    out = {}
    for lbl, block in state.func_ir.blocks.items():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign):
                out.setdefault(stmt.target.name, []).append((lbl, stmt))
    return out


def _all_uses(state, labels):
    ir = state.ir
    used = set()
    for lbl in labels:
        for stmt in state.func_ir.blocks[lbl].body:
            used.update(v.name for v in stmt.list_vars() if not (isinstance(stmt, ir.Assign) and v is stmt.target))
    return used


class _Slicer:
    """Backward slices of pure definitions (recomputable in any task).

    Only definitions outside the offloaded loops count: a variable a parallel loop assigns is
    private to each of its iterations (Offload rejects reading it after the loop), so those
    definitions never reach another task."""

    def __init__(self, state, assigns):
        self.state, self.memo = state, {}
        in_loops = set().union(*(lp.body for lp in getattr(state, "loops", ()) or ()))
        self.assigns = {name: [d for d in defs if d[0] not in in_loops] for name, defs in assigns.items()}

    def slice(self, name):
        """Statements (dependency order) recomputing ``name``, or None if it is not pure."""
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = None  # cycles are not pure
        result = self._slice(name, self.slice)
        self.memo[name] = result
        return result

    def slice_with_loads(self, name, loadable, leaves, depth=0):
        """Like :meth:`slice`, but a dependency that is not pure and ``loadable(dep)`` becomes a
        leaf read from a temporary (added to ``leaves``): ``range(m)`` after ``m = a[0]`` is
        recomputed from a load of ``m`` instead of needing a task of its own."""
        pure = self.slice(name)
        if pure is not None:
            return pure
        if loadable(name):
            leaves.add(name)
            return []
        if depth > 64:
            return None
        return self._slice(name, lambda dep: self.slice_with_loads(dep, loadable, leaves, depth + 1))

    def definition(self, name):
        defs = self.assigns.get(name, [])
        return defs[0] if len(defs) == 1 else None

    def _slice(self, name, sub_slice):
        ir = self.state.ir
        d = self.definition(name)
        if d is None:
            return None
        _, stmt = d
        value = stmt.value
        if isinstance(value, ir.Arg):
            return []
        if isinstance(value, (ir.Const, ir.Global, ir.FreeVar)):
            return [stmt]
        if isinstance(value, ir.Var):
            deps = [value.name]
        elif isinstance(value, ir.Expr) and op_traits(value.op).recomputable:
            deps = [v.name for v in value.list_vars()]
        elif isinstance(value, ir.Expr) and value.op == "getitem" and not is_global_data(self.state, value.value):
            deps = [v.name for v in value.list_vars()]
        elif isinstance(value, ir.Expr) and value.op == "call" and not value.kws and value.vararg is None \
                and try_static(self.state, value.func) in _PURE_CALLS:
            deps = [v.name for v in value.list_vars()]
        else:
            return None
        out = []
        for dep in deps:
            sub = sub_slice(dep)
            if sub is None:
                return None
            out.extend(sub)
        out.append(stmt)
        return out


def _value_vars(ir, value):
    if isinstance(value, ir.Var):
        return [value]
    if isinstance(value, ir.Expr):
        return value.list_vars()
    return []


def _dedupe(stmts):
    seen, out = set(), []
    for s in stmts:
        if id(s) not in seen:
            seen.add(id(s))
            out.append(s)
    return out


def _is_arg(assigns, name, ir):
    defs = assigns.get(name, [])
    return len(defs) == 1 and isinstance(defs[0][1].value, ir.Arg)


# -- planning ------------------------------------------------------------------------------------------

def plan(state, returns_value: bool) -> TaskPlan:
    """Decide the tasks, their recomputed and loaded values, and the temporaries."""
    ir = state.ir
    blocks = state.func_ir.blocks
    loops, regions = _regions(state)
    assigns = _assignments(state)
    slicer = _Slicer(state, assigns)
    setup = {id(s) for lp in loops for s in (*lp.plumbing, *lp.setup)}
    units = []
    for k, (start, labels) in enumerate(regions):
        unit = Unit("serial", labels, start=start)
        unit.launched = any(does_work(state, s) and id(s) not in setup for lbl in labels for s in blocks[lbl].body)
        unit.returns = returns_value and any(isinstance(blocks[lbl].body[-1], ir.Return) for lbl in labels)
        unit.launched |= unit.returns
        units.append(unit)
        if k < len(loops):
            units.append(Unit("range_for", set(loops[k].body), loop=loops[k], launched=True))
    region_of = {}
    for unit in units:
        if unit.kind == "serial":
            for lbl in unit.labels:
                region_of[lbl] = unit
    liveness = Liveness(state.tools.analysis, ir, blocks)
    slots = {}

    def slot(name):
        return slots.setdefault(name, len(slots))

    for pos in range(len(units) - 1, -1, -1):
        unit = units[pos]
        if not unit.launched:
            continue
        entry = unit.loop.header if unit.kind == "range_for" else unit.start
        # the unit's labels are reachable from its entry (a loop body, a region found from its start)
        needed = liveness.live_at(entry, _all_uses(state, unit.labels)) if entry is not None else set()
        if unit.kind == "range_for":
            needed.discard(unit.loop.iter_var.name)
        # only the names this task needs: a set over every variable would make the plan
        # quadratic in the number of tasks
        defined_outside = {n for n in needed if any(lbl not in unit.labels for lbl, _ in assigns.get(n, ()))}
        unit.live_ins = sorted(needed & defined_outside)
        if unit.kind == "range_for":
            needed.add(unit.loop.total_var.name)
            defined_outside.add(unit.loop.total_var.name)
        recompute = []
        def loadable(dep, pos=pos):  # produced by one serial task that runs anyway, before this one
            d = slicer.definition(dep)
            producer = region_of.get(d[0]) if d is not None else None
            return producer is not None and producer.launched and units.index(producer) < pos

        for name in sorted(needed & defined_outside):
            if _is_arg(assigns, name, ir):
                continue
            leaves = set()
            sl = slicer.slice_with_loads(name, loadable, leaves)
            if sl is not None and name not in leaves:
                recompute.extend(sl)
                for leaf in leaves:
                    region_of[slicer.definition(leaf)[0]].stores[leaf] = slot(leaf)
                    unit.loads[leaf] = slot(leaf)
                continue
            producers = [region_of.get(lbl) for lbl, _ in assigns[name]
                         if lbl not in unit.labels and lbl in region_of]
            earlier = [p for p in producers if p is not None and units.index(p) < pos]
            if not earlier:
                loc = assigns[name][0][1].loc
                raise state.error(QuadrantsCompilationError,
                                  f"'{name}' is computed inside a parallel loop and read by a later task",
                                  loc)
            for p in earlier:
                p.launched = True
                p.stores[name] = slot(name)
            unit.loads[name] = slot(name)
        unit.recompute = _dedupe(recompute)
        if unit.kind == "serial":
            # a region that stores a value it may not assign on every path reads it first
            for name in unit.stores:
                if any(lbl not in unit.labels for lbl, _ in assigns.get(name, ())) and name not in unit.loads:
                    earlier = [region_of[lbl] for lbl, _ in assigns[name]
                               if lbl in region_of and units.index(region_of[lbl]) < pos]
                    if earlier:
                        for p in earlier:
                            p.launched = True
                            p.stores[name] = slot(name)
                        unit.loads[name] = slot(name)
    launched = [u for u in units if u.launched]
    ret_slot = None
    if returns_value:
        ret_slot = len(slots)
    _name_tasks(state, launched)
    return TaskPlan(launched, len(slots) + (1 if returns_value else 0), ret_slot)


def _name_tasks(state, units):
    """The task list: the offloaded range-for tasks (fusion info included) renumbered among the
    serial tasks."""
    by_header = {t.header: t for t in state.tasks if t.kind == "range_for"}
    for index, unit in enumerate(units):
        if unit.kind == "range_for":
            unit.task = by_header[unit.loop.header].renumbered(index)
            unit.loop.task_index = index
        else:
            blocks = state.func_ir.blocks
            work = [stmt.loc for lbl in unit.labels for stmt in blocks[lbl].body
                    if stmt.loc is not None and does_work(state, stmt)]
            loc = min(work, key=lambda loc: loc.line or 0) if work else \
                blocks[unit.start].loc if unit.start is not None else None
            unit.task = Task.make(task_prefix(state), index, "serial", body=frozenset(unit.labels),
                                  loc=f"{loc.filename}:{loc.line}" if loc is not None else "")


def does_work(state, stmt) -> bool:
    """Statements with an effect a serial task must carry out: stores, loads of global data,
    calls, prints. Copies, constants and scalar arithmetic (parameter bindings of inlined
    funcs, values computed for later loops) are evaluated wherever they are needed."""
    ir = state.ir
    if isinstance(stmt, (ir.Jump, ir.Branch, ir.Return)):
        return False
    if isinstance(stmt, ir.Assign):
        value = stmt.value
        if isinstance(value, (ir.Arg, ir.Const, ir.Global, ir.FreeVar, ir.Var)):
            return False
        if isinstance(value, ir.Expr) and not op_traits(value.op).work:
            return False
        if isinstance(value, ir.Expr) and value.op in ("getitem", "static_getitem"):
            return is_global_data(state, value.value)
        return True
    return True


def with_accesses(state, unit, serial_defs) -> None:
    """Give ``unit.task`` the accesses to global data its blocks make now, and the read and
    write sets derived from them."""
    found = BodyAccesses(state, unit.loop, serial_defs, labels=unit.labels).accesses
    names = {a.resource: resource_name(state, a.resource) for a in found}
    unit.task = dataclasses.replace(
        unit.task, accesses=tuple(found),
        reads=frozenset(names[a.resource] for a in found if a.kind == "read"),
        writes=frozenset(names[a.resource] for a in found if a.kind == "write"))


class PlanTasks:
    name = "plan_tasks"

    def run(self, state) -> bool:
        before = [(t.kind, t.name, t.body) for t in state.tasks]
        state.refresh_definitions()
        state.task_plan = plan(state, state.returns_value)
        serial_defs = serial_definitions(state)
        for unit in state.task_plan.units:
            with_accesses(state, unit, serial_defs)
        state.tasks = [unit.task for unit in state.task_plan.units]
        return [(t.kind, t.name, t.body) for t in state.tasks] != before
