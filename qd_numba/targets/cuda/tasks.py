"""Build the GPU task kernels (numba-cuda IR) of a planned kernel.

Input: the kernel IR after the untyped pipeline, built with numba-cuda's IR classes, and its
:class:`~qd_numba.passes.plan_tasks.TaskPlan` (which tasks exist, which values they recompute,
load from or store to temporaries). Every range-for task becomes a grid-stride kernel over its
iteration space; a serial task becomes a single-thread kernel. Every task kernel has the same
leading parameters, ``(ctx, tmp)`` (see lowering/device.py), followed by the runtime
parameters it reads.

The plan's pure slices, translated to Python, give the host each loop's iteration count for an
exact grid (``totals_source``), with no device round trip.
"""

from __future__ import annotations

import copy
import dataclasses
import operator

from ...lowering import device, spaces
from ...passes.base import MISSING, derive_ir, exec_stub, try_static
from ...passes.ir_builder import emit_call, retarget, successors
from ...passes.plan_tasks import Unit, _assignments, _dedupe, _Slicer, _value_vars

PARAM_CTX, PARAM_TMP = "qd_ctx", "qd_tmp"


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
        return emit_call(ir, fn, args, target, loc, ir.Var(scope, f"$qd_fn_{fn.__name__}_{len(entry.body)}", loc))

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
            for t in successors(ir, blk):     # still the kernel's labels
                if t not in unit.labels:
                    outside[t] = epi_label
    for blk in body.values():
        retarget(ir, blk, lambda t: outside[t] if t in outside else t + shift)
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
