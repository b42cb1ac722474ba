"""The GPU task kernels of a planned kernel: the CUDA hooks of the task cutter.

The task cutter (passes/task_ir.py) cuts each unit of the kernel's
:class:`~qd_numba.passes.plan_tasks.TaskPlan` out of the kernel IR (numba-cuda's IR classes);
:class:`CudaTaskABI` says what a task kernel looks like. Every range-for task becomes a grid-stride
kernel over its iteration space (``device.grid_loop``, or ``range`` for a reduction); a serial
task becomes a single-thread kernel. Every task kernel has the same leading parameters, ``(ctx,
tmp)`` (see lowering/device.py), followed by the runtime parameters it reads.

The plan's pure slices, translated to Python, give the host each loop's iteration count for an
exact grid (``totals_source``), with no device round trip.
"""

from __future__ import annotations

import operator

from ...lowering import device, reduce, spaces
from ...passes.base import MISSING, try_static
from ...passes.plan_tasks import _assignments, _dedupe, _Slicer, _value_vars
from ...passes.task_ir import TaskABI, recomputed_range_stop

PARAM_CTX, PARAM_TMP = "qd_ctx", "qd_tmp"


# -- task kernel IR ------------------------------------------------------------------------------------

class CudaTaskABI(TaskABI):
    """A task kernel: ``(ctx, tmp, *runtime args it reads)``; fields come from the context's
    field table, values of serial code from temporaries or recomputed; a range-for is a
    grid-stride loop over its flat index; a serial task stores its live-outs and the kernel's
    return value in temporaries. ``temp_types`` maps each value stored to a temporary to its
    Numba type: the tasks are cut and typed in program order, and the task that stores a value
    was typed before any task that loads it (plan.py ``compile_tasks``)."""

    leading_params = (PARAM_CTX, PARAM_TMP)
    recomputes = True

    def __init__(self, state, field_slot, field_token, ret_slot, temp_types):
        self.field_slot, self.field_token, self.ret_slot = field_slot, field_token, ret_slot
        self.temp_types = temp_types
        ir = state.ir
        entry = state.func_ir.blocks[min(state.func_ir.blocks)]
        # (variable, hidden field or None) per kernel parameter, in order: found once per kernel
        bindings = [s for s in entry.body if isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg)]
        self.args = [(s.target.name, state.hidden_by_arg_index(s.value.index))
                     for s in sorted(bindings, key=lambda s: s.value.index)]

    def parameters(self, state, unit, reads):
        return [name for name, field in self.args if name in reads and field is None]

    def bind_inputs(self, state, unit, emit, leading, reads):
        ctx, tmp = leading
        for name, field in self.args:
            if field is not None and name in reads:
                slot = emit.const(self.field_slot(field), "slot")
                token = emit.glob(self.field_token(field), "token")
                emit.call(device.field_from_ctx, [ctx, slot, token], emit.var(name))
        for name, slot in sorted(unit.loads.items(), key=lambda kv: kv[1]):
            off = emit.const(slot * device.TEMP_SLOT_BYTES, "off")
            token = emit.glob(device.TypeToken(self.temp_types[name]), "token")
            emit.call(device.temp_load, [tmp, off, token], emit.var(name))

    def flat_range(self, state, unit, emit, leading):
        start = emit.call(device.grid_start, [], emit.var("$qd_start"))
        stride = emit.call(device.grid_stride, [], emit.var("$qd_stride"))
        return start, emit.var(unit.loop.total_var.name), stride

    def loop_iterable(self, state, unit, emit, leading):
        # a reduction's partial chains the iterations of a thread: Numba's range over flat_range,
        # whose trip count lets NVVM unroll the loop and put several loads in flight (a sum over
        # 16M floats: 14% faster on an H100); independent iterations: a rolled loop in one call
        blocks = state.func_ir.blocks
        for label in unit.labels:
            for stmt in blocks[label].body if label in blocks else ():
                value = getattr(stmt, "value", None)
                if getattr(value, "op", None) == "call" and try_static(state, value.func) is reduce.reduce_step:
                    return super().loop_iterable(state, unit, emit, leading)
        # range(n) recomputed here: the loop runs to n itself (below a negative n, no iteration)
        stop = recomputed_range_stop(state, unit, emit)
        if stop is None:
            stop = emit.var(unit.loop.total_var.name)
        return emit.call(device.grid_loop, [stop], emit.var("$qd_range_call"))

    def store_live_outs(self, state, unit, emit, leading):
        for name, slot in sorted(unit.stores.items(), key=lambda kv: kv[1]):
            off = emit.assign(state.ir.Const(slot * device.TEMP_SLOT_BYTES, emit.loc), emit.var(f"$qd_off_{slot}"))
            emit.call(device.temp_store, [leading[1], off, emit.var(name)], emit.var(f"$qd_temp_store_{slot}"))

    def store_return(self, state, unit, emit, leading, value):
        if self.ret_slot is not None:
            off = emit.assign(state.ir.Const(self.ret_slot * device.TEMP_SLOT_BYTES, emit.loc), emit.var("$qd_off_ret"))
            emit.call(device.temp_store, [leading[1], off, value], emit.var("$qd_temp_store_ret"))

    def function_name(self, unit):
        return f"qd_{unit.task.kind}{unit.task.index}"

    def stable_id(self, unit):
        # a task kernel is alone in its cubin: a name from the task's content-stable uid keeps
        # the cubin the same in every process
        return int(unit.task.uid[:8], 16)


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
