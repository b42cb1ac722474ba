"""Split an offloaded kernel (numba-cuda IR) into GPU task kernels.

Input: the kernel IR after the untyped pipeline (passes/offload.py), built with numba-cuda's IR
classes. Every range-for task becomes a grid-stride kernel over its iteration space; the serial
code between loops becomes a single-thread kernel when it does work (or computes a value a later
task needs). Every task kernel has the same leading parameters, ``(ctx, tmp)`` (see
lowering/device.py), followed by the runtime parameters it reads.

Values crossing task boundaries:

* a value whose definition is a *pure* expression of arguments and constants (a shape, a loop
  bound, ``n - 1``) is recomputed inside each task that needs it;
* anything else (a value loaded from a field, a serial loop's result) is stored by the serial
  task that computes it into a 64-byte temporary slot and loaded by the tasks that read it.

The same pure slices, translated to Python, give the host each loop's iteration count for an
exact grid (``totals_source``), with no device round trip.

The kernel must be a straight sequence of serial regions and top-level loops: a top-level loop
under a runtime condition is rejected with a QuadrantsCompilationError (use ``qd.static``).
"""

from __future__ import annotations

import copy
import dataclasses
import operator

from ..errors import QuadrantsCompilationError
from ..lowering import device, spaces
from ..passes.base import MISSING, derive_ir, exec_stub, is_global_data, try_static
from ..passes.offload import _does_work, _task_prefix
from ..task import Task

PARAM_CTX, PARAM_TMP = "qd_ctx", "qd_tmp"


class GpuUnsupportedError(QuadrantsCompilationError):
    """A kernel the CPU runs but GPU targets do not support (yet)."""
_PURE_OPS = frozenset({"getattr", "static_getitem", "build_tuple", "binop", "unary", "cast"})
_PURE_CALLS = (spaces.range_dim, spaces.ndrange_dim, spaces.shape_space, spaces.space_total)


@dataclasses.dataclass
class Unit:
    """One GPU task kernel in program order: a loop (``range_for``) or a serial region."""

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
    task: Task | None = None


@dataclasses.dataclass
class CudaPlanIR:
    units: list                         # launched units, program order
    temp_slots: int
    ret_slot: int | None


# -- structure -----------------------------------------------------------------------------------

def _successors(ir, block):
    term = block.body[-1]
    if isinstance(term, ir.Jump):
        return [term.target]
    if isinstance(term, ir.Branch):
        return [term.truebr, term.falsebr]
    return []


def _launched_loops(state):
    """The offloaded loops that become GPU range-for tasks: those every run of the kernel
    reaches exactly once (the header is on every path from the entry, and in no serial loop).
    A top-level loop under a runtime ``if`` or inside a top-level ``while`` stays in its serial
    task and runs on one GPU thread, as Quadrants runs loops that are not at the outermost scope."""
    cfg = state.tools.analysis.compute_cfg_from_blocks(state.func_ir.blocks)
    backbone = cfg.backbone()
    return [lp for lp in sorted(state.loops, key=lambda lp: lp.task_index)
            if lp.header in backbone and [inner.header for inner in cfg.in_loops(lp.header)] == [lp.header]]


def _regions(state):
    """Serial regions between the launched loops: ``regions[k]`` runs before loop k (k =
    len(loops): after)."""
    ir = state.ir
    blocks = state.func_ir.blocks
    loops = _launched_loops(state)
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
            todo.extend(_successors(ir, blocks[lbl]))
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
    raise state.error(GpuUnsupportedError,
                      "internal error: the serial code around this loop does not split into GPU tasks", loc)


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


def _live_map(state):
    analysis = state.tools.analysis
    blocks = state.func_ir.blocks
    cfg = analysis.compute_cfg_from_blocks(blocks)
    usedefs = analysis.compute_use_defs(blocks)
    return analysis.compute_live_map(cfg, blocks, usedefs.usemap, usedefs.defmap)


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
        elif isinstance(value, ir.Expr) and value.op in _PURE_OPS:
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

def plan(state, returns_value: bool) -> CudaPlanIR:
    """Decide the task kernels, their recomputed and loaded values, and the temporaries."""
    ir = state.ir
    blocks = state.func_ir.blocks
    loops, regions = _regions(state)
    assigns = _assignments(state)
    slicer = _Slicer(state, assigns)
    setup = {id(s) for lp in loops for s in (*lp.plumbing, *lp.setup)}
    units = []
    for k, (start, labels) in enumerate(regions):
        unit = Unit("serial", labels, start=start)
        unit.launched = any(_does_work(state, s) and id(s) not in setup for lbl in labels for s in blocks[lbl].body)
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
    live_map = _live_map(state)
    slots = {}

    def slot(name):
        return slots.setdefault(name, len(slots))

    for pos in range(len(units) - 1, -1, -1):
        unit = units[pos]
        if not unit.launched:
            continue
        entry = unit.loop.header if unit.kind == "range_for" else unit.start
        needed = set(live_map.get(entry, ())) & _all_uses(state, unit.labels) if entry is not None else set()
        if unit.kind == "range_for":
            needed.discard(unit.loop.iter_var.name)
            needed.add(unit.loop.total_var.name)
        defined_outside = {n for n, ds in assigns.items() if any(lbl not in unit.labels for lbl, _ in ds)}
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
    return CudaPlanIR(launched, len(slots) + (1 if returns_value else 0), ret_slot)


def _name_tasks(state, units):
    """The GPU task list: the offloaded range-for tasks (fusion info included) renumbered among
    the serial tasks this target launches."""
    by_header = {t.header: t for t in state.tasks if t.kind == "range_for"}
    for index, unit in enumerate(units):
        if unit.kind == "range_for":
            unit.task = by_header[unit.loop.header].renumbered(index)
        else:
            loc = state.func_ir.blocks[unit.start].loc if unit.start is not None else None
            unit.task = Task.make(_task_prefix(state), index, "serial", body=frozenset(unit.labels),
                                  loc=f"{loc.filename}:{loc.line}" if loc is not None else "")


# -- task kernel IR ------------------------------------------------------------------------------------

@dataclasses.dataclass
class TaskKernelIR:
    unit: Unit
    func_ir: object
    runtime_args: list          # runtime param names the kernel takes after (ctx, tmp)


def build_task_ir(state, unit: Unit, temp_types: dict, field_slot, field_token, ret_slot):
    """The numba-cuda FunctionIR of one task kernel.

    ``temp_types``: var -> Numba type of values loaded from temporaries (known once their
    producer compiled); ``field_slot(field) -> int`` and ``field_token(field) -> TypeToken``
    give the context slot and type of a field."""
    ir = state.ir
    blocks = state.func_ir.blocks
    scope = blocks[min(blocks)].scope
    first_label = min(unit.labels) if unit.labels else min(blocks)
    loc = blocks[first_label].loc
    shift = 1  # label 0 is the new entry block

    # copy the unit's blocks, without their Arg bindings (the prologue binds arguments)
    body = {}
    for lbl in unit.labels:
        blk = copy.deepcopy(blocks[lbl])
        blk.body = [s for s in blk.body if not (isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg))]
        body[lbl + shift] = blk
    recompute = [copy.deepcopy(s) for s in unit.recompute]
    recompute = [s for s in recompute if not isinstance(s.value, ir.Arg)]

    # which arguments the task reads
    used = set()
    for blk in body.values():
        for s in blk.body:
            used.update(v.name for v in s.list_vars())
    for s in recompute:
        used.update(v.name for v in s.list_vars())
    if unit.kind == "range_for":
        used.add(unit.loop.total_var.name)
    arg_defs = {}
    for s in blocks[min(blocks)].body:
        if isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg):
            arg_defs[s.target.name] = s.value
    runtime_args, hidden = [], []
    for name, arg in sorted(arg_defs.items(), key=lambda kv: kv[1].index):
        if name not in used:
            continue
        field = state.hidden_by_arg_index(arg.index)
        if field is not None:
            hidden.append((name, field))
        else:
            runtime_args.append(name)

    params = [PARAM_CTX, PARAM_TMP] + runtime_args
    entry = ir.Block(scope, loc)
    ctx_v, tmp_v = ir.Var(scope, "$qd_ctx", loc), ir.Var(scope, "$qd_tmp", loc)
    entry.body += [ir.Assign(ir.Arg(PARAM_CTX, 0, loc), ctx_v, loc), ir.Assign(ir.Arg(PARAM_TMP, 1, loc), tmp_v, loc)]
    for k, name in enumerate(runtime_args):
        entry.body.append(ir.Assign(ir.Arg(name, k + 2, loc), ir.Var(scope, name, loc), loc))

    def call(fn, args, target):
        fvar = ir.Var(scope, f"$qd_fn_{fn.__name__}_{len(entry.body)}", loc)
        return [ir.Assign(ir.Global(fn.__name__, fn, loc), fvar, loc),
                ir.Assign(ir.Expr.call(fvar, list(args), (), loc), target, loc)]

    def const(value, hint):
        var = ir.Var(scope, f"$qd_c_{hint}_{len(entry.body)}", loc)
        entry.body.append(ir.Assign(ir.Const(value, loc), var, loc))
        return var

    def glob(value, hint):
        var = ir.Var(scope, f"$qd_g_{hint}_{len(entry.body)}", loc)
        entry.body.append(ir.Assign(ir.Global(hint, value, loc), var, loc))
        return var

    for name, field in hidden:
        s = const(field_slot(field), "slot")
        t = glob(field_token(field), "token")
        entry.body += call(device.field_from_ctx, [ctx_v, s, t], ir.Var(scope, name, loc))
    for name, slot in sorted(unit.loads.items(), key=lambda kv: kv[1]):
        off = const(slot * device.TEMP_SLOT_BYTES, "off")
        t = glob(device.TypeToken(temp_types[name]), "token")
        entry.body += call(device.temp_load, [tmp_v, off, t], ir.Var(scope, name, loc))
    entry.body += recompute

    done = ir.Block(scope, loc)
    none = ir.Var(scope, "$qd_none", loc)
    ret = ir.Var(scope, "$qd_ret", loc)
    done_label = max(body, default=0) + 1
    done.body = [ir.Assign(ir.Const(None, loc), none, loc), ir.Assign(ir.Expr.cast(none, loc), ret, loc),
                 ir.Return(ret, loc)]
    new_blocks = {0: entry, done_label: done}

    if unit.kind == "range_for":
        lp = unit.loop
        start, stride = ir.Var(scope, "$qd_start", loc), ir.Var(scope, "$qd_stride", loc)
        entry.body += call(device.grid_start, [], start) + call(device.grid_stride, [], stride)
        rng, it = ir.Var(scope, "$qd_range_call", loc), ir.Var(scope, "$qd_iter", loc)
        rfn = glob(range, "range")
        entry.body += [ir.Assign(ir.Expr.call(rfn, [start, lp.total_var, stride], (), loc), rng, loc),
                       ir.Assign(ir.Expr.getiter(rng, loc), it, loc),
                       ir.Assign(it, ir.Var(scope, lp.iter_var.name, loc), loc),
                       ir.Jump(lp.header + shift, loc)]
        outside = {lp.exit: done_label}
    else:
        entry.body.append(ir.Jump(unit.start + shift, loc))
        # leaving the region (to the next loop's header) ends the task: store the values later
        # tasks read, then return
        epilogue = ir.Block(scope, loc)
        epi_label = done_label + 1
        for name, slot in sorted(unit.stores.items(), key=lambda kv: kv[1]):
            off = ir.Var(scope, f"$qd_off_{slot}", loc)
            epilogue.body.append(ir.Assign(ir.Const(slot * device.TEMP_SLOT_BYTES, loc), off, loc))
            epilogue.body += call(device.temp_store, [tmp_v, off, ir.Var(scope, name, loc)],
                                  ir.Var(scope, f"$qd_stored_{slot}", loc))
        epilogue.body.append(ir.Jump(done_label, loc))
        new_blocks[epi_label] = epilogue
        outside = {}
        for blk in body.values():
            for t in _successors(ir, blk):     # still the kernel's labels
                if t not in unit.labels:
                    outside[t] = epi_label
    for blk in body.values():
        _retarget(ir, blk, lambda t: outside[t] if t in outside else t + shift)
    if unit.kind == "serial":
        for blk in body.values():
            term = blk.body[-1]
            if isinstance(term, ir.Return):
                tail = []
                if unit.returns and ret_slot is not None:
                    off = ir.Var(scope, "$qd_off_ret", loc)
                    tail.append(ir.Assign(ir.Const(ret_slot * device.TEMP_SLOT_BYTES, loc), off, loc))
                    tail += call(device.temp_store, [tmp_v, off, term.value], ir.Var(scope, "$qd_stored_ret", loc))
                    unit.ret_var = term.value.name
                blk.body = blk.body[:-1] + tail + [ir.Jump(epi_label, term.loc)]
    new_blocks.update(body)
    stub = exec_stub(f"qd_{unit.task.kind}{unit.task.index}", params)
    # a task kernel is alone in its cubin: a name from the task's content-stable uid keeps the
    # cubin the same in every process
    new_ir = derive_ir(state, stub, new_blocks, params, stable_id=int(unit.task.uid[:8], 16))
    return TaskKernelIR(unit, new_ir, runtime_args)


def _retarget(ir, block, fn):
    term = block.body[-1]
    if isinstance(term, ir.Jump):
        block.body[-1] = ir.Jump(fn(term.target), term.loc)
    elif isinstance(term, ir.Branch):
        block.body[-1] = ir.Branch(term.cond, fn(term.truebr), fn(term.falsebr), term.loc)


# -- host-side iteration counts -------------------------------------------------------------------------

def totals_source(state, units, param_ndims, arg_positions=None):
    """Python source of ``def totals(<runtime params>)`` returning each range-for unit's
    iteration count (None where it is not a pure function of the arguments), or None when no
    loop needs it. Constants are returned through the ``env`` dict the source is exec'd with.
    ``arg_positions[k]``: where runtime parameter k sits in the ``args`` the function receives
    (default: args holds exactly the runtime parameters)."""
    ir = state.ir
    assigns = _assignments(state)
    slicer = _Slicer(state, assigns)
    lines, env, emitted = [], {}, set()
    results = []
    counter = [0]

    def name_of(var_name):
        return "v_" + "".join(ch if ch.isalnum() else "_" for ch in var_name)

    def ref(value):
        counter[0] += 1
        key = f"c{counter[0]}"
        env[key] = value
        return key

    def emit(stmt):
        if id(stmt) in emitted:
            return True
        v = stmt.value
        t = name_of(stmt.target.name)
        if isinstance(v, ir.Arg):
            field = state.hidden_by_arg_index(v.index)
            if field is not None:
                rhs = ref(field)
            else:
                rhs = f"args[{v.index if arg_positions is None else arg_positions[v.index]}]"
        elif isinstance(v, (ir.Const, ir.Global, ir.FreeVar)):
            rhs = ref(v.value)
        elif isinstance(v, ir.Var):
            rhs = name_of(v.name)
        elif v.op == "getattr":
            rhs = f"{name_of(v.value.name)}.{v.attr}"
        elif v.op == "static_getitem":
            rhs = f"{name_of(v.value.name)}[{ref(v.index)}]"
        elif v.op == "getitem":
            rhs = f"{name_of(v.value.name)}[{name_of(v.index.name)}]"
        elif v.op == "build_tuple":
            rhs = "(" + "".join(f"{name_of(i.name)}, " for i in v.items) + ")"
        elif v.op == "binop":
            rhs = f"{ref(v.fn)}({name_of(v.lhs.name)}, {name_of(v.rhs.name)})"
        elif v.op == "unary":
            fn = {"-": operator.neg, "+": operator.pos, "not": operator.not_, "~": operator.invert}.get(v.fn, v.fn)
            rhs = f"{ref(fn)}({name_of(v.value.name)})"
        elif v.op == "cast":
            rhs = name_of(v.value.name)
        elif v.op == "call":
            fn = try_static(state, v.func)
            args = [name_of(a.name) for a in v.args]
            if fn is spaces.range_dim and len(args) == 1:   # the common range(n): no call
                rhs = f"((0, {args[0]}, 1),)"
            elif fn is spaces.space_total and _one_dim_range(v.args[0]):
                rhs = f"max(0, {name_of(v.args[0].name)}[0][1])"
            elif fn is spaces.shape_space:
                root = v.args[0].name
                while len(assigns.get(root, ())) == 1 and isinstance(assigns[root][0][1].value, ir.Var):
                    root = assigns[root][0][1].value.name
                ndim = param_ndims.get(root)
                rhs = f"tuple((0, int(s), 1) for s in tuple({args[0]}.shape)[:{ref(ndim)}])"
            else:
                py = {spaces.range_dim: spaces.host_range_dim, spaces.ndrange_dim: spaces.host_ndrange_dim,
                      spaces.space_total: spaces.host_space_total}.get(fn, MISSING)
                if py is MISSING:
                    return False
                rhs = f"{ref(py)}({', '.join(args)})"
        else:
            return False
        lines.append(f"    {t} = {rhs}")
        emitted.add(id(stmt))
        return True

    def _one_dim_range(var):
        defs = assigns.get(var.name, ())
        if len(defs) != 1 or not isinstance(defs[0][1].value, ir.Expr) or defs[0][1].value.op != "call":
            return False
        d = defs[0][1].value
        return try_static(state, d.func) is spaces.range_dim and len(d.args) == 1

    any_loop = False
    for unit in units:
        if unit.kind != "range_for":
            continue
        any_loop = True
        name = unit.loop.total_var.name
        sl = slicer.slice(name)
        arg_stmts = []
        if sl is not None:
            for s in sl:
                for v in _value_vars(ir, s.value):
                    for _, d in assigns.get(v.name, []):
                        if isinstance(d.value, ir.Arg):
                            arg_stmts.append(d)
        if sl is None or not all(emit(s) for s in _dedupe(arg_stmts + sl)):
            results.append("None")
        else:
            results.append(name_of(name))
    if not any_loop:
        return None, env
    src = "def totals(args):\n" + "\n".join(lines) + f"\n    return ({''.join(r + ', ' for r in results)})\n"
    return src, env
