"""The task cutter: one planned Task's own FunctionIR, cut out of the kernel IR, for every target.

Input: the kernel IR after PlanTasks, one :class:`~qd_numba.passes.plan_tasks.Unit` of its
``state.task_plan`` (blocks, live-ins, values loaded from temporaries or recomputed, live-outs) and
a target's :class:`TaskABI`, which decides what the target's task functions look like: their
leading parameters, which live-ins arrive as parameters, what binds the others (a field table,
temporaries), the flat index range a range-for walks, and how a serial task hands its live-outs
and the kernel's return value on.

Output: a :class:`TaskIR` — a FunctionIR whose entry block binds the parameters and the rest of
the inputs, then either starts the range-for over the ABI's flat range (jumping to the loop's
header) or enters the serial region; leaving the task returns None. Labels are the kernel's
shifted by one (label 0 is the new entry).

A loop over ``range(n)`` or a 1-d field binds its variable to the flat index itself
(:func:`flat_is_index`, :func:`_direct_flat_index`), and a GPU task recomputing ``range(n)`` loops
to ``n`` (:func:`recomputed_range_stop`): the space and ``space_index`` the offloader writes for
every loop are left out of such a task (Numba types and lowers each statement of a task, ~0.4 ms
apiece on a GPU host).

Cost: linear in the task's own size. Each call copies only the unit's blocks and recomputed
statements, sharing the kernel's variable scope (``copy_ir``), and reads the live-ins PlanTasks
found with its one liveness analysis of the kernel: no whole-kernel analysis per task.
:data:`CUT_COUNTS` counts what cutting created and copied (tests check it grows linearly).
Never changes the kernel IR.
"""

from __future__ import annotations

import collections
import dataclasses
import keyword

from ..field import ArrayData
from ..lowering import spaces
from .base import MISSING, copy_ir, derive_ir, exec_stub, try_static
from .ir_builder import emit_call, retarget, successors
from .plan_tasks import _PURE_CALLS, Unit

CUT_COUNTS = collections.Counter()   # "statements" copied or created, "tasks" cut
LABEL_SHIFT = 1                      # a task function's label of a kernel block: the kernel's + 1


@dataclasses.dataclass
class TaskIR:
    unit: Unit
    func_ir: object
    params: list            # kernel variables the function takes after the ABI's leading parameters


class Emitter:
    """Statements of a block being built: fresh temporaries in the kernel's scope, calls."""

    def __init__(self, ir, scope, loc, body=None):
        self.ir, self.scope, self.loc = ir, scope, loc
        self.body = [] if body is None else body
        self._fn_vars = {}     # id(fn) -> the variable holding fn, bound once per block

    def var(self, name):
        return self.ir.Var(self.scope, name, self.loc)

    def temp(self, hint):
        return self.var(f"$qd_{hint}_{len(self.body)}")

    def assign(self, value, target):
        self.body.append(self.ir.Assign(value, target, self.loc))
        return target

    def const(self, value, hint):
        return self.assign(self.ir.Const(value, self.loc), self.temp(f"c_{hint}"))

    def glob(self, value, hint):
        return self.assign(self.ir.Global(hint, value, self.loc), self.temp(f"g_{hint}"))

    def call(self, fn, args, target):
        """``target = fn(*args)``; the global ``fn`` is bound at its first call in this block
        (every statement is typed and lowered: a field per task costs one less)."""
        fn_var = self._fn_vars.get(id(fn))
        if fn_var is None:
            self._fn_vars[id(fn)] = fn_var = self.temp(f"fn_{fn.__name__}")
            self.body += emit_call(self.ir, fn, args, target, self.loc, fn_var)
        else:
            self.body.append(self.ir.Assign(self.ir.Expr.call(fn_var, list(args), (), self.loc), target, self.loc))
        return target


class TaskABI:
    """A target's task functions (the cutter's hooks). The defaults: every live-in a parameter."""

    leading_params: tuple = ()      # parameters before the live-ins (names the ABI binds itself)
    recomputes = False              # emit the plan's recomputed statements (else they are live-ins)

    def parameters(self, state, unit, reads) -> list:
        """The kernel variables that become parameters, in order. ``reads``: every variable the
        task's code reads (its blocks, recomputed statements, the loop's iteration count)."""
        return list(unit.live_ins)

    def bind_inputs(self, state, unit, emit: Emitter, leading: list, reads: set) -> None:
        """Statements binding inputs that are not parameters (``leading``: the leading params' vars)."""

    def flat_range(self, state, unit, emit: Emitter, leading: list):
        """``(start, stop, step)`` variables of the range a range-for task's flat index walks
        (``step`` None: 1)."""
        raise NotImplementedError

    def loop_iterable(self, state, unit, emit: Emitter, leading: list):
        """The variable a range-for task's loop iterates: ``range(*flat_range)`` by default."""
        start, stop, step = self.flat_range(state, unit, emit, leading)
        rng = emit.glob(range, "range")
        return emit.assign(emit.ir.Expr.call(rng, [start, stop] + ([step] if step is not None else []), (), emit.loc),
                           emit.var("$qd_range_call"))

    def store_live_outs(self, state, unit, emit: Emitter, leading: list) -> None:
        """A serial task's exit: store what later tasks read."""

    def store_return(self, state, unit, emit: Emitter, leading: list, value) -> None:
        """A serial task's ``return value`` of the kernel."""

    def function_name(self, unit) -> str:
        return f"qd_task{unit.task.index}"

    def stable_id(self, unit) -> int | None:
        return None


def _sole_argument(state, var, fn):
    """The argument of ``fn(x)`` when the kernel's ``var`` is defined by exactly that call."""
    d = state.definition(var)
    if getattr(d, "op", None) == "call" and len(d.args) == 1 and try_static(state, d.func) is fn:
        return d.args[0]
    return None


def range_stop(state, space):
    """``n`` when the kernel's ``space`` variable is ``range_dim(n)`` (``range(n)``: start 0, step
    1, one dimension, so the flat index is the loop variable and the trip count is ``max(n, 0)``);
    else None."""
    return _sole_argument(state, space, spaces.range_dim)


def flat_is_index(state, space) -> bool:
    """Whether the index of flat position k in the kernel's ``space`` variable is k itself: a
    ``range(n)``, or the space of a 1-d field or array known at compile time with no offset."""
    if range_stop(state, space) is not None:
        return True
    shaped = _sole_argument(state, space, spaces.shape_space)
    data = MISSING if shaped is None else try_static(state, shaped)
    return (isinstance(data, ArrayData) and data.shape is not None and len(data.shape) == 1
            and not any(data.offset or ()))


def recomputed_range_stop(state, unit, emit: Emitter):
    """``n`` when ``unit``'s trip count is ``space_total(range_dim(n))``, recomputed by the task
    from an ``n`` bound in it (``emit``'s statements: the count is not loaded); else None."""
    ir = emit.ir
    bound = {s.target.name: s.value for s in emit.body if isinstance(s, ir.Assign)}
    total = bound.get(unit.loop.total_var.name)
    if not (isinstance(total, ir.Expr) and total.op == "call" and len(total.args) == 1):
        return None
    fn = bound.get(total.func.name)
    if not (isinstance(fn, ir.Global) and fn.value is spaces.space_total):
        return None
    stop = range_stop(state, total.args[0])
    return stop if stop is not None and stop.name in bound else None


_PURE_SETUP = (*_PURE_CALLS, spaces.space_index)


def _drop_unused_setup(ir, entry: list, mentions) -> None:
    """Drop the entry's constants, globals and pure calls (``_PURE_SETUP``: the planner's, and
    ``space_index``) that nothing
    in the task reads (what a direct range loop left unused). ``mentions``: the body's counts."""
    uses = collections.Counter()
    for stmt in entry:
        uses.update(v.name for v in stmt.list_vars() if not (isinstance(stmt, ir.Assign) and v is stmt.target))
    pure = {s.target.name for s in entry if isinstance(s, ir.Assign) and isinstance(s.value, ir.Global)
            and any(s.value.value is fn for fn in _PURE_SETUP)}
    kept = []
    for stmt in reversed(entry):
        value = getattr(stmt, "value", None)
        if isinstance(stmt, ir.Assign) and uses[stmt.target.name] == 0 and mentions[stmt.target.name] == 0 and (
                isinstance(value, (ir.Const, ir.Global, ir.FreeVar))
                or (isinstance(value, ir.Expr) and value.op == "call" and value.func.name in pure)):
            for v in stmt.list_vars():
                if v is not stmt.target:
                    uses[v.name] -= 1
            continue
        kept.append(stmt)
    entry[:] = reversed(kept)


def _direct_flat_index(state, body: dict, mentions) -> None:
    """In a copied range-for body, ``i = static_getitem(space_index(space, flat), 0)`` (the
    offloader's binding of the loop variable) becomes ``i = flat`` where the flat index is the index
    (:func:`flat_is_index`; both are int64), with the ``space_index`` call and its global dropped
    when nothing else reads them. ``mentions`` (variable -> statements naming it) is kept up to
    date."""
    ir = state.ir
    defs = {}
    for blk in body.values():
        for stmt in blk.body:
            value = getattr(stmt, "value", None)
            if isinstance(stmt, ir.Assign) and isinstance(value, (ir.Global, ir.Expr)):
                defs[stmt.target.name] = (blk, stmt)
    for blk in body.values():
        for k, stmt in enumerate(blk.body):
            value = getattr(stmt, "value", None)
            if not (isinstance(stmt, ir.Assign) and isinstance(value, ir.Expr) and value.op == "static_getitem"
                    and value.index == 0 and mentions[value.value.name] == 2 and value.value.name in defs):
                continue   # (the index tuple: defined once, read here only)
            idx_blk, idx_stmt = defs[value.value.name]
            call = idx_stmt.value
            if not (call.op == "call" and len(call.args) == 2 and call.func.name in defs):
                continue
            fn_blk, fn_stmt = defs[call.func.name]
            space, flat = call.args
            if not (isinstance(fn_stmt.value, ir.Global) and fn_stmt.value.value is spaces.space_index
                    and flat_is_index(state, space)):
                continue
            blk.body[k] = ir.Assign(flat, stmt.target, stmt.loc)
            idx_blk.body.remove(idx_stmt)
            mentions[value.value.name] = 0
            mentions[space.name] -= 1
            mentions[call.func.name] -= 1
            if mentions[call.func.name] == 1:     # its definition only
                fn_blk.body.remove(fn_stmt)
                mentions[call.func.name] = 0


def _param_name(var_name: str, k: int, taken) -> str:
    if var_name.isidentifier() and not keyword.iskeyword(var_name) and var_name not in taken:
        return var_name
    clean = "".join(ch if ch.isalnum() else "_" for ch in var_name)
    return f"v{k}_{clean}"


def cut_task(state, unit: Unit, abi: TaskABI) -> TaskIR:
    """The FunctionIR of one planned unit on the target ``abi`` describes (module docstring)."""
    ir = state.ir
    blocks = state.func_ir.blocks
    scope = blocks[min(blocks)].scope
    first = unit.loop.header if unit.kind == "range_for" else unit.start
    loc = blocks[first].loc
    shift = LABEL_SHIFT  # label 0 is the new entry block

    # the unit's blocks (and recomputed statements), copied once, sharing the kernel's scope;
    # argument bindings are the entry's job
    copied = copy_ir(ir, {lbl: blocks[lbl] for lbl in unit.labels})
    body = {}
    for lbl, blk in copied.items():
        blk.body = [s for s in blk.body if not (isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg))]
        body[lbl + shift] = blk
    recompute = []
    if abi.recomputes and unit.recompute:
        holder = ir.Block(scope, loc)
        holder.body = list(unit.recompute)
        recompute = [s for s in copy_ir(ir, holder).body if not isinstance(s.value, ir.Arg)]
    mentions = collections.Counter()    # variable -> statements of the body naming it (targets too)
    for blk in body.values():
        for s in blk.body:
            mentions.update(v.name for v in s.list_vars())
    if unit.kind == "range_for":
        _direct_flat_index(state, body, mentions)

    reads = {name for name, n in mentions.items() if n > 0}
    for s in recompute:
        reads.update(v.name for v in s.list_vars())
    if unit.kind == "range_for":
        reads.add(unit.loop.total_var.name)
    live = abi.parameters(state, unit, reads)
    leading = list(abi.leading_params)
    params = leading + [_param_name(name, k, leading) for k, name in enumerate(live)]

    emit = Emitter(ir, scope, loc)
    lead_vars = [emit.assign(ir.Arg(p, k, loc), emit.var(f"${p}")) for k, p in enumerate(leading)]
    for k, name in enumerate(live):
        emit.assign(ir.Arg(params[len(leading) + k], len(leading) + k, loc), emit.var(name))
    abi.bind_inputs(state, unit, emit, lead_vars, reads)
    emit.body += recompute

    done = Emitter(ir, scope, loc)
    none = done.assign(ir.Const(None, loc), done.var("$qd_none"))
    ret = done.assign(ir.Expr.cast(none, loc), done.var("$qd_ret"))
    done.body.append(ir.Return(ret, loc))
    done_label = max(body, default=0) + 1
    new_blocks = {0: ir.Block(scope, loc), done_label: ir.Block(scope, loc)}
    new_blocks[done_label].body = done.body

    if unit.kind == "range_for":
        lp = unit.loop
        call = abi.loop_iterable(state, unit, emit, lead_vars)
        it = emit.assign(ir.Expr.getiter(call, loc), emit.var("$qd_iter"))
        emit.assign(it, emit.var(lp.iter_var.name))
        emit.body.append(ir.Jump(lp.header + shift, loc))
        outside = {lp.exit: done_label}
    else:
        emit.body.append(ir.Jump(unit.start + shift, loc))
        # leaving the region (to the next loop's header) ends the task: store the values later
        # tasks read, then return
        epi_label = done_label + 1
        epilogue = Emitter(ir, scope, loc)
        abi.store_live_outs(state, unit, epilogue, lead_vars)
        epilogue.body.append(ir.Jump(done_label, loc))
        new_blocks[epi_label] = ir.Block(scope, loc)
        new_blocks[epi_label].body = epilogue.body
        outside = {t: epi_label for blk in body.values() for t in successors(ir, blk) if t not in unit.labels}
    for blk in body.values():
        retarget(ir, blk, lambda t: outside[t] if t in outside else t + shift)
    if unit.kind == "serial":
        for blk in body.values():
            term = blk.body[-1]
            if isinstance(term, ir.Return):
                tail = Emitter(ir, scope, term.loc)
                if unit.returns:
                    unit.ret_var = term.value.name
                    abi.store_return(state, unit, tail, lead_vars, term.value)
                blk.body = blk.body[:-1] + tail.body + [ir.Jump(epi_label, term.loc)]
    if unit.kind == "range_for":
        _drop_unused_setup(ir, emit.body, mentions)
    new_blocks[0].body = emit.body
    new_blocks.update(body)
    CUT_COUNTS["tasks"] += 1
    CUT_COUNTS["statements"] += sum(len(b.body) for b in new_blocks.values())
    stub = exec_stub(abi.function_name(unit), params)
    return TaskIR(unit, derive_ir(state, stub, new_blocks, params, stable_id=abi.stable_id(unit)), live)
