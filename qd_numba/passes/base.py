"""What every pass shares: the IR module bundle, the compile state, compile-time evaluation.

Passes are written against an :class:`IRTools` bundle instead of importing ``numba.core.ir``
directly, because numba-cuda carries its own copy of Numba's IR classes; a target hands in
the bundle that matches the IR it compiles.

A pass is a class with a ``name`` and ``run(state) -> bool`` (True only if it changed the IR).
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import operator
import sys
from types import SimpleNamespace

from ..errors import QuadrantsRuntimeError, QuadrantsSyntaxError, located
from ..generated_code import exec_generated
from ..typing.matrix import MatrixType


@dataclasses.dataclass(frozen=True)
class IRTools:
    ir: object
    ir_utils: object
    analysis: object
    run_frontend: object
    inline: object          # the inline_closurecall module

    @staticmethod
    def for_cpu() -> IRTools:
        from numba.core import analysis, inline_closurecall, ir, ir_utils
        from numba.core.compiler import run_frontend

        return IRTools(ir, ir_utils, analysis, run_frontend, inline_closurecall)

    @staticmethod
    def for_cuda() -> IRTools:
        """numba-cuda's twin IR modules (``numba.cuda.core``)."""
        from numba.cuda.compiler import run_frontend
        from numba.cuda.core import analysis, inline_closurecall, ir, ir_utils

        return IRTools(ir, ir_utils, analysis, run_frontend, inline_closurecall)

    @property
    def flavour(self) -> str:
        return self.ir.__name__.rsplit(".", 1)[0]


@dataclasses.dataclass
class CompileState:
    tools: IRTools
    func_ir: object
    kernel_name: str                # short name, for messages
    config: object
    runtime_params: list            # names of the kernel's runtime parameters, in order
    param_types: dict               # runtime param name -> Numba type
    template_values: dict           # template param name -> value
    hidden: list = dataclasses.field(default_factory=list)       # Field objects, hidden-arg order
    hidden_vars: dict = dataclasses.field(default_factory=dict)  # id(field) -> hidden arg var name
    block_stacks: dict = dataclasses.field(default_factory=dict)  # label -> tuple of inlined funcs
    tasks: list = dataclasses.field(default_factory=list)
    loops: list = dataclasses.field(default_factory=list)        # offload.OffloadedLoop per range_for task
    dumps: list = dataclasses.field(default_factory=list)
    inlined_temps: set = dataclasses.field(default_factory=set)  # renamed '$' temporaries of inlined funcs
    kernel_qualname: str = ""       # '<module>.<qualname>': names tasks (stable across processes)
    returns_value: bool = False     # the kernel's annotation promises a return value
    return_type: object = None      # that annotation's type (passes/return_rules.py converts to it)
    task_plan: object = None        # plan_tasks.TaskPlan, once PlanTasks ran
    random_state: object = None     # () -> qd.random's state field (random_state.state_field)
    autodiff_mode: str | None = None  # "reverse": the gradient kernel (passes/autodiff.py)
    adstacks: list = dataclasses.field(default_factory=list)     # adstack.AdStack per gradient task with loops
    stream_groups: dict = dataclasses.field(default_factory=dict)  # label -> qd.stream_parallel group (1, 2, ...)
    graph: bool = False             # @qd.kernel(graph=True)

    @property
    def ir(self):
        return self.tools.ir

    def error(self, exc_type, message, loc=None):
        return located(exc_type, message, self.kernel_name, loc)

    def refresh_definitions(self):
        self.func_ir._definitions = self.tools.ir_utils.build_definitions(self.func_ir.blocks)

    def definition(self, var):
        """The single defining expression of ``var`` (None if it has zero or several)."""
        defs = self.func_ir._definitions.get(var.name if hasattr(var, "name") else var, [])
        return defs[0] if len(defs) == 1 else None

    def is_temp(self, var) -> bool:
        """A compiler temporary (``$...``, also after inlining renamed it), not a user local."""
        name = var.name if hasattr(var, "name") else var
        return name.startswith("$") or name in self.inlined_temps

    def hidden_by_arg_index(self, index: int):
        k = index - len(self.runtime_params)
        return self.hidden[k] if 0 <= k < len(self.hidden) else None

    def new_label(self) -> int:
        return max(self.func_ir.blocks) + 1


class NotStatic(Exception):
    """A value that is not known at compile time."""


_STATIC_BUILTINS = {builtins.bool, builtins.len, builtins.int, builtins.float, builtins.tuple,
                    builtins.range, builtins.min, builtins.max, builtins.abs, builtins.isinstance,
                    builtins.hasattr, builtins.getattr, builtins.enumerate, builtins.zip, builtins.list}


def static_value(state: CompileState, var, permissive: bool = False):
    """Evaluate ``var`` at compile time, or raise NotStatic.

    Follows single definitions through constants, globals, free variables, hidden field
    arguments, attribute and item access, operators and tuples. Calls are evaluated only for
    a few pure builtins, or for any callable when ``permissive`` (inside ``qd.static(...)``,
    whose argument Quadrants evaluates as plain Python).
    """
    ir = state.ir
    seen = 0
    while True:
        seen += 1
        if seen > 100:
            raise NotStatic(var)
        d = state.definition(var)
        if d is None:
            raise NotStatic(var)
        if isinstance(d, ir.Var):
            var = d
            continue
        break
    if isinstance(d, ir.Const):
        return d.value
    if isinstance(d, (ir.Global, ir.FreeVar)):
        return d.value
    if isinstance(d, ir.Arg):
        field = state.hidden_by_arg_index(d.index)
        if field is not None:
            return field
        raise NotStatic(var)
    if not isinstance(d, ir.Expr):
        raise NotStatic(var)
    op = d.op
    sv = lambda v: static_value(state, v, permissive)  # noqa: E731
    if op == "getattr":
        try:
            return getattr(sv(d.value), d.attr)
        except AttributeError as e:
            raise NotStatic(var) from e
    if op in ("static_getitem", "getitem") and argument_of(state, d.value) is not None:
        raise NotStatic(var)   # an element of a field or ndarray: its value when the kernel runs
    if op in ("static_getitem", "getitem") and getattr(sv(d.value), "holds_global_data", False):
        raise NotStatic(var)   # an element of a struct field (qd_numba/struct.py), as above
    if op == "static_getitem":
        return sv(d.value)[d.index]
    if op == "getitem":
        return sv(d.value)[sv(d.index)]
    if op == "binop" or op == "inplace_binop":
        return d.fn(sv(d.lhs), sv(d.rhs))
    if op == "unary":
        fn = {"-": operator.neg, "+": operator.pos, "not": operator.not_, "~": operator.invert}.get(d.fn, d.fn)
        return fn(sv(d.value))
    if op in ("build_tuple",):
        return tuple(sv(v) for v in d.items)
    if op == "build_list":
        return [sv(v) for v in d.items]
    if op == "call":
        fn = sv(d.func)
        from ..lang import static as qd_static

        inner_permissive = permissive or fn is qd_static
        args = [static_value(state, a, inner_permissive) for a in d.args]
        kws = {k: static_value(state, v, inner_permissive) for k, v in d.kws}
        if d.vararg is not None:
            args.extend(static_value(state, d.vararg, inner_permissive))
        if fn is qd_static or inner_permissive or fn in _STATIC_BUILTINS:
            if fn is qd_static:
                return args[0] if len(args) == 1 else tuple(args)
            try:
                return fn(*args, **kws)
            except Exception as e:  # a user expression failed at compile time
                raise NotStatic(var) from e
        raise NotStatic(var)
    raise NotStatic(var)


def resolve_copies(state, var, limit: int = 50):
    """(the last variable of ``var``'s chain of copies, its single definition or None)."""
    ir = state.ir
    d = None
    for _ in range(limit):
        d = state.definition(var)
        if not isinstance(d, ir.Var):
            return var, d
        var = d
    return var, None


def hidden_argument(state, obj, loc, into: list | None = None):
    """The variable of field/ndarray ``obj`` as a hidden kernel argument: a new argument (bound
    at the front of the entry block, or appended to ``into`` for the caller to place there) the
    first time the kernel uses it, the same variable after that."""
    ir = state.ir
    entry = state.func_ir.blocks[min(state.func_ir.blocks)]
    scope = entry.scope
    name = state.hidden_vars.get(id(obj))
    if name is None:
        if obj.shape is None:    # declared without a shape and never placed (snode.py)
            raise state.error(QuadrantsRuntimeError, f"{obj._describe()} is not placed: give it a shape "
                              "(qd.field(dtype, shape=...)) or place it (qd.root.dense(qd.i, n).place(x))", loc)
        index = len(state.runtime_params) + len(state.hidden)
        name = f"__qd_field_{len(state.hidden)}"
        state.hidden.append(obj)
        state.hidden_vars[id(obj)] = name
        scope.get_or_define(name, loc)
        bind = ir.Assign(ir.Arg(name, index, loc), ir.Var(scope, name, loc), loc)
        if into is None:
            entry.body.insert(0, bind)
        else:
            into.append(bind)
    return ir.Var(scope, name, loc)


def argument_of(state, var):
    """The ``ir.Arg`` that ``var`` is (a chain of copies of), or None."""
    d = resolve_copies(state, var)[1]
    return d if isinstance(d, state.ir.Arg) else None


def is_global_data(state, var) -> bool:
    """True if ``var`` is (a copy of) a kernel argument or hidden field argument; not a
    vector/matrix argument, a value like a local vector (``v.x = 0`` updates the kernel's copy)."""
    arg = argument_of(state, var)
    return arg is not None and not isinstance(state.param_types.get(arg.name), MatrixType)


_MISSING = object()


def try_static(state, var, permissive=False):
    """``static_value`` or ``MISSING`` when the value is not known at compile time."""
    try:
        return static_value(state, var, permissive)
    except (NotStatic, TypeError, IndexError, KeyError, AttributeError, ValueError):
        return _MISSING


MISSING = _MISSING


def copy_ir(ir, obj):
    """A deep copy of IR (a FunctionIR, a block, a dict of blocks) that shares the Python
    values held by ``ir.Global``/``ir.FreeVar``/``ir.Const`` nodes.

    Those values are compile-time objects (kernels, funcs, fields, modules, user objects) that
    passes look at but never mutate; deep-copying them is wrong (fields must stay the live
    buffer) and can fail (objects that cannot be pickled)."""
    if hasattr(obj, "blocks"):
        blocks = obj.blocks.values()
    elif isinstance(obj, dict):
        blocks = obj.values()
    else:
        blocks = [obj]
    memo = {}
    if hasattr(obj, "func_id"):  # it pickles the function, closure cells included
        memo[id(obj.func_id)] = obj.func_id
    if hasattr(obj, "variable_lifetime"):
        # Numba's post-processing results (variable lifetimes, block-entry variables) describe the
        # IR as it was; the copy starts without them, as a new FunctionIR does (Numba recomputes
        # them where it needs them; no pass of ours reads them)
        memo[id(obj.variable_lifetime)] = None
        memo[id(obj.block_entry_vars)] = {}
    for block in blocks:
        if not hasattr(obj, "blocks"):
            # copies of blocks inside one function share its scope, so that names the copies
            # redefine later stay unique across all of them
            memo[id(block.scope)] = block.scope
        for stmt in block.body:
            value = getattr(stmt, "value", None)
            if isinstance(value, (ir.Global, ir.FreeVar, ir.Const)):
                memo[id(value.value)] = value.value
    return copy.deepcopy(obj, memo)


def exec_stub(name: str, arg_names: list[str]):
    """A throw-away function with the given parameters, for a FunctionIdentity of generated IR.

    It lives in this importable module's namespace (Numba's environment pickles globals by
    module name)."""
    ns = {"__name__": __name__}
    params = ", ".join(arg_names)
    exec_generated(f"def {name}({params}):\n    return None\n", f"stub {name}", ns)
    return ns[name]


def derive_ir(state, stub, blocks, params, stable_id: int | None = None):
    """A new FunctionIR of the kernel's flavour over ``blocks`` (entry: the smallest label), with
    the parameters ``params`` and the identity of the generated function ``stub``.

    ``stable_id`` replaces the process-wide counter Numba numbers functions with (it shows in
    mangled symbol names), for code that must be the same in every process: a function that is
    alone in its module (a CUDA task kernel), where the name need not be unique process-wide."""
    import importlib

    bytecode = importlib.import_module(state.tools.ir.__name__.rsplit(".", 1)[0] + ".bytecode")
    blocks = dict(sorted(blocks.items()))
    new_ir = state.func_ir.derive(blocks=blocks, arg_names=tuple(params), arg_count=len(params))
    new_ir.func_id = bytecode.FunctionIdentity.from_function(stub)
    if stable_id is not None:
        new_ir.func_id.unique_id = stable_id
        new_ir.func_id.unique_name = f"{new_ir.func_id.func_qualname}${stable_id}"
    new_ir._definitions = state.tools.ir_utils.build_definitions(new_ir.blocks)
    return new_ir


def unsupported(state, message, loc):
    return state.error(QuadrantsSyntaxError, message, loc)


def dump_ir(state: CompileState, stage: str) -> None:
    if not state.config.print_ir:
        return
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        state.func_ir.dump()
    text = f"=== qd_numba IR of kernel '{state.kernel_name}' after {stage} ===\n{buf.getvalue()}"
    state.dumps.append(text)
    print(text, file=sys.stderr)


namespace = SimpleNamespace
