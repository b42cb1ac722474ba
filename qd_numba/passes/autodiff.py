"""ReverseMode: the gradient kernel of ``kernel.grad`` — a reverse-mode task per forward task.

Runs only in a compile with ``state.autodiff_mode == "reverse"`` (the gradient kernel is a
separate compile of the same kernel), after PlanTasks. Input: the kernel's range-for tasks;
serial code between them must be pure (loop bounds, shapes). Output: the same tasks in reverse
order, each body replaced by

1. the forward body, recomputed with every assignment renamed to a fresh *version* (so each
   value the adjoints read survives), global stores and atomics dropped (the forward kernel made
   them), and each block with several predecessors recording which one it came from;
2. the adjoint body: each block's statements in reverse, every rule from one table
   (``ops/math_ops.py``: ``MATH_OPS`` and ``OPERATOR_ADJOINTS``), traced into IR; the walk over
   the blocks replays the recorded path backwards (an ``if``/``else`` comes out mirrored);
   adjoints of global data accumulate atomically into ``.grad`` fields.

Adjoints are typed by the compiled helpers of lowering/autodiff.py (``zero_like``, ``ad_acc``):
this pass never knows a type, so integers carry float adjoints nobody reads, and integer casts
stop gradients by rule.

Loops inside a task (any CFG: nested ``for``, ``while``, ``break``/``continue``): each block
inside a loop pushes, at the end of its forward execution, its path record and its non-constant
versions onto the thread's adstack (lowering/adstack.py), and its adjoint block pops them first,
so the walk replays every iteration backwards. The task's stack depth is a size expression from
the loops' trip counts (bounds.size_expr), evaluated before each launch (adstack.py); a loop it
cannot bound is a compile error unless ``qd.init(ad_stack_size=N)`` is set. The pass then
reorders the tasks and re-runs PlanTasks; it never touches the forward compile.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import math
import operator

import numpy as np
from numba.core import types

from .. import math as qd_math
from ..adstack import AdStack, render
from ..errors import QuadrantsCompilationError, QuadrantsSyntaxError
from ..field import Field
from ..frontend.args import grad_parameter
from ..lang import random as qd_random
from ..lowering import adstack as ad_stack
from ..lowering import array_access, spaces, subscripts
from ..lowering import autodiff as ad_helpers
from ..lowering import sparse as sparse_helpers
from ..matrix import Matrix, Vector
from ..ops.math_ops import MATH_OPS, OPERATOR_ADJOINTS
from ..ops.matrix_methods import MATRIX_METHODS
from ..task import Task
from ..typing.matrix import MatrixType
from .base import MISSING, argument_of, hidden_argument, is_global_data, try_static
from .bounds import _arg_name, _index_parts, has_index, simplify_size, size_expr, space_sizes, task_bounds
from .ir_builder import successors
from .offload import OffloadedLoop
from .plan_tasks import PlanTasks, task_prefix
from .reductions import ReduceAtomics, _uses

# callees with a MATH_OPS rule: qd.<op>, Python's math.<op> and the builtins abs/min/max
_MATH_CALLEES = {getattr(qd_math, name): name for name in MATH_OPS}
_MATH_CALLEES.update({getattr(math, name): name for name in MATH_OPS if hasattr(math, name)})
_MATH_CALLEES.update({builtins.abs: "abs", builtins.min: "min", builtins.max: "max", math.fabs: "abs"})
_FLOAT_CASTS = (builtins.float, np.float32, np.float64)
# calls that carry no gradient (indices, iteration spaces, integer conversions, random numbers)
_NO_GRADIENT = {builtins.int, builtins.bool, builtins.len, builtins.range, ad_helpers.stop_grad,
                spaces.range_dim, spaces.ndrange_dim, spaces.shape_space, spaces.space_total,
                spaces.space_index, subscripts.index_vector, subscripts.as_index_tuple,
                sparse_helpers.activate_cell, sparse_helpers.activate_block, sparse_helpers.deactivate_cell,
                sparse_helpers.free_block, sparse_helpers.set_flag}
_COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3}
_LOCAL_SUM_MAX = 32         # elements of a field whose adjoints a thread sums per iteration
_ARRAY_LOADS = (array_access.array_load, array_access.checked_array_load)
_ARRAY_STORES = (array_access.array_store, array_access.checked_array_store)


def _is_no_gradient(callee) -> bool:
    try:
        if callee in _NO_GRADIENT:
            return True
    except TypeError:           # unhashable
        return False
    return isinstance(callee, (types.Integer, types.Boolean)) or callee is qd_random


class ReverseMode:
    name = "reverse_mode"

    def run(self, state) -> bool:
        if getattr(state, "autodiff_mode", None) != "reverse":
            return False
        if state.returns_value:
            raise state.error(QuadrantsCompilationError,
                              "kernel.grad: a kernel that returns a value cannot be differentiated")
        serial = [u for u in state.task_plan.units if u.kind == "serial"]
        for unit in reversed(serial):       # last first: a new task shifts the indices after it
            _serial_as_loop(state, unit)
        if serial:
            _renumber_loops(state)
        _, dead = _uses(state)      # loads nobody reads (``G[I]`` of ``G[I] += V``): no adjoint
        transforms = [_Transform(state, lp, dead) for lp in state.loops]
        for t in transforms:          # loop analysis reads the definitions before any rewrite
            t.find_inner_loops()
        for t in transforms:
            t.run()
        _reverse_task_order(state)
        state.refresh_definitions()
        PlanTasks().run(state)
        if ReduceAtomics().run(state, adjoints=True):   # adjoints accumulated at one address: per warp/chunk
            PlanTasks().run(state)
        uids = {t.header: t.uid for t in state.tasks}
        for stack in state.adstacks:
            stack.task_uid = uids[stack.header]
        return True


# -- tracing adjoint rules into IR -------------------------------------------------------------------

class _Emitter:
    """Appends statements to ``out``: fresh temporaries, constants, binops, calls."""

    def __init__(self, state, scope, loc, out):
        self.state, self.ir, self.scope, self.loc, self.out = state, state.ir, scope, loc, out

    def var(self, name="$ad"):
        return self.scope.redefine(name, self.loc)

    def assign(self, value, name="$ad"):
        target = self.var(name)
        self.out.append(self.ir.Assign(value, target, self.loc))
        return target

    def const(self, value):
        return self.assign(self.ir.Const(value, self.loc), "$ad_const")

    def call(self, fn, args, name="$ad"):
        fvar = self.assign(self.ir.Global(getattr(fn, "__name__", "fn"), fn, self.loc), "$ad_fn")
        return self.assign(self.ir.Expr.call(fvar, list(args), (), self.loc), name)

    def binop(self, fn, a, b):
        return self.assign(self.ir.Expr.binop(fn, self.value(a), self.value(b), self.loc))

    def value(self, x):
        return x.var if isinstance(x, _Sym) else self.const(x) if not isinstance(x, self.ir.Var) else x


class _Sym:
    """An IR value inside a traced adjoint rule: Python operators emit IR."""

    def __init__(self, e, var):
        self.e, self.var = e, var

    def _bin(self, fn, other, swap=False):
        a, b = (other, self) if swap else (self, other)
        return _Sym(self.e, self.e.binop(fn, a, b))

    def __add__(self, o): return self._bin(operator.add, o)
    def __radd__(self, o): return self._bin(operator.add, o, True)
    def __sub__(self, o): return self._bin(operator.sub, o)
    def __rsub__(self, o): return self._bin(operator.sub, o, True)
    def __mul__(self, o): return self._bin(operator.mul, o)
    def __rmul__(self, o): return self._bin(operator.mul, o, True)
    def __truediv__(self, o): return self._bin(operator.truediv, o)
    def __rtruediv__(self, o): return self._bin(operator.truediv, o, True)
    def __gt__(self, o): return self._bin(operator.gt, o)
    def __lt__(self, o): return self._bin(operator.lt, o)
    def __ge__(self, o): return self._bin(operator.ge, o)
    def __le__(self, o): return self._bin(operator.le, o)
    def __and__(self, o): return self._bin(operator.and_, o)
    def __matmul__(self, o): return self._bin(operator.matmul, o)
    def __rmatmul__(self, o): return self._bin(operator.matmul, o, True)

    def __getattr__(self, name):
        """A vector/matrix method (``a.transpose()``): emits the getattr and the call."""
        if name not in MATRIX_METHODS:
            raise AttributeError(name)
        e = self.e
        method = e.assign(e.ir.Expr.getattr(self.var, name, e.loc), "$ad_method")
        return lambda *args: _Sym(e, e.assign(e.ir.Expr.call(method, [e.value(a) for a in args], (), e.loc)))

    def __neg__(self):
        return _Sym(self.e, self.e.assign(self.e.ir.Expr.unary(operator.neg, self.var, self.e.loc)))


class _QdCalls:
    """The ``qd`` a rule calls (``qd.cos(x)``): emits calls of qd_numba.math's functions, and of
    the adjoint helpers of lowering/autodiff.py for names starting with ``ad_``."""

    def __init__(self, e):
        self.e = e

    def __getattr__(self, name):
        fn = getattr(ad_helpers, name) if name.startswith("ad_") else getattr(qd_math, name)
        return lambda *args: _Sym(self.e, self.e.call(fn, [self.e.value(a) for a in args]))


def trace_rule(e, rule, args, out, g) -> list:
    """The contributions of ``rule`` (one per argument) as IR variables appended to ``e.out``."""
    grads = rule([_Sym(e, a) for a in args], _Sym(e, out), _Sym(e, g), _QdCalls(e))
    return [e.value(x) for x in grads]


# -- the per-task transform -------------------------------------------------------------------------

@dataclasses.dataclass
class _Block:
    label: int
    reverse: int                    # label of its adjoint block
    items: list                     # ("entry"|"exit", version, name) or ("stmt", original stmt, forward stmt)
    versions: list                  # version vars defined here, in order
    preds: list                     # predecessor labels inside the body
    came_from: object = None        # blocks with several predecessors: the var recording which one


class _Transform:
    def __init__(self, state, lp, dead=frozenset()):
        self.state, self.lp, self.ir = state, lp, state.ir
        self.dead = dead            # ids of body statements whose value nothing reads
        self.blocks = state.func_ir.blocks
        header = self.blocks[lp.header]
        self.scope, self.loc = header.scope, header.loc
        self.entry = header.body[-1].truebr
        self.body = sorted(lp.body - {lp.header})
        self.assigned = {stmt.target.name for lbl in self.body for stmt in self.blocks[lbl].body
                         if isinstance(stmt, self.ir.Assign)}
        self.adjoint = {}           # version name -> adjoint var
        self.constant = set()       # versions assigned a constant or a global
        self.fwd_value = {}         # version name -> its value in the forward recomputation
        self.fwd_values = {}        # body variable -> the values of its assignments there
        self.canonical = {}         # user variable name -> adjoint var of its value across blocks
        self.own = self._own_element_grads()
        self.local = self._locally_summed_grads()

    # -- adjoints of global reads at the iteration's own index: plain adds -------------------------
    def _grad_key(self, base):
        """What the gradient of global data ``base`` may share memory with: a field's ``.grad``
        (its ``id``); every ndarray gradient is one key (two parameters may be the same array)."""
        field = try_static(self.state, base)
        if isinstance(field, Field):
            return None if field.grad is None else id(field.grad)
        return "ndarray" if argument_of(self.state, base) is not None else None

    def _own_element_grads(self) -> set:
        """The gradient keys this task accumulates into only at the element of its own iteration
        (``x[i]`` in ``for i in x``, ``x[i, j]``, ``x[I]`` of ``qd.grouped``): no other iteration
        adds there, so the adjoint is a plain read-add-store instead of an atomic. One read of the
        key elsewhere (``x[i + 1]``, ``x[idx[i]]``, ``x[0]``) keeps all its adjoints atomic."""
        ir, state = self.ir, self.state
        task = next((t for t in state.tasks if t.header == self.lp.header), None)
        ndim = getattr(task, "ndim", 0)
        own_index = [("index", k) for k in range(ndim)]
        verdict = {}
        for lbl in self.body:
            for stmt in self.blocks[lbl].body:
                if not isinstance(stmt, ir.Assign) or not isinstance(stmt.value, ir.Expr) or id(stmt) in self.dead:
                    continue
                value = stmt.value
                if value.op in ("getitem", "static_getitem") and is_global_data(state, value.value):
                    base, index = value.value, value.index if value.op == "getitem" else None
                elif value.op == "call" and try_static(state, value.func) in _ARRAY_LOADS:
                    base, index = value.args[0], value.args[1]
                else:
                    continue
                key = self._grad_key(base)
                if key is None:
                    continue
                parts = None if index is None or not ndim else _index_parts(state, index, 0, self.lp.space_var)
                own = parts is not None and list(parts) == own_index and len(parts) == self._data_ndim(base)
                verdict[key] = verdict.get(key, True) and own
        return {key for key, own in verdict.items() if own}

    def _locally_summed_grads(self) -> dict:
        """The small fields (at most ``_LOCAL_SUM_MAX`` scalar elements: weights, coefficients)
        this task reads at indices that vary (``w[0, c]`` in a loop over ``c``): the adjoints of
        one iteration go to a per-thread buffer (lowering/autodiff.py: ``ad_local_*``) and the
        end of the iteration adds each element once, at a constant index, which ReduceAtomics
        then sums per thread chunk / warp — instead of an atomic per read on a few contended
        addresses. Not for a field this task also writes (a store's adjoint reads the ``.grad``
        the reads add to), nor one read only at constant indices (ReduceAtomics alone does it).
        Only with ``warp_reduce`` on (else each iteration would add every element atomically).
        Key -> (field, buffer variable name)."""
        ir, state = self.ir, self.state
        if not state.config.warp_reduce:
            return {}
        varying, excluded = {}, set(self.own)
        for lbl in self.body:
            for stmt in self.blocks[lbl].body:
                if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
                    excluded.add(self._grad_key(stmt.target) if is_global_data(state, stmt.target) else None)
                if not isinstance(stmt, ir.Assign) or not isinstance(stmt.value, ir.Expr) or id(stmt) in self.dead:
                    continue
                value = stmt.value
                if value.op == "call" and value.args and is_global_data(state, value.args[0]):
                    excluded.add(self._grad_key(value.args[0]))     # an atomic, an ndarray access
                elif value.op == "getitem" and is_global_data(state, value.value):
                    field = try_static(state, value.value)
                    if isinstance(field, Field) and field.grad is not None and field.elem_type is None \
                            and field.shape and int(np.prod(field.shape)) <= _LOCAL_SUM_MAX:
                        varying[id(field.grad)] = field
        return {key: (field, f"$ad_sum_{k}") for k, (key, field) in enumerate(varying.items())   # first-read order
                if key not in excluded}

    def _open_sums(self):
        """Zeroed buffers at the start of each iteration; their sums added at its end (``done``)."""
        ir = self.ir
        opening, flush = [], []
        e = _Emitter(self.state, self.scope, self.loc, flush)
        for field, buf in self.local.values():
            size = int(np.prod(field.shape))
            o = _Emitter(self.state, self.scope, self.loc, opening)
            opening.append(ir.Assign(ir.Expr.call(o.assign(ir.Global("ad_local_open", ad_helpers.ad_local_open,
                                                                     self.loc), "$ad_fn"),
                                                  [o.const(size)], (), self.loc), self._fixed(buf), self.loc))
            grad = hidden_argument(self.state, field.grad, self.loc)
            for k in range(size):
                index = tuple(int(i) for i in np.unravel_index(k, field.shape))
                value = e.call(ad_helpers.ad_local_get, [self._fixed(buf), e.const(k)])
                e.call(subscripts.atomic_update, [grad, e.const(index if len(index) > 1 else index[0]), value,
                                                  e.const("add")])
        self.blocks[self.entry].body[:0] = opening
        self.blocks[self.done].body[:0] = flush

    def _data_ndim(self, base):
        """Axes of global data ``base`` (an index with fewer reads a row: left to the atomic's error)."""
        field = try_static(self.state, base)
        if isinstance(field, Field):
            return len(field.shape)
        arg = argument_of(self.state, base)
        return getattr(self.state.param_types.get(arg.name), "ndim", None) if arg is not None else None

    def _accumulate(self, e, base, grad, index, g):
        """``grad[index] += g`` for a read of ``base[index]``: into the iteration's buffer of a
        small field, atomic, or plain (above)."""
        key = self._grad_key(base)
        if key in self.local:
            field, buf = self.local[key]
            shape = tuple(int(n) for n in field.shape)
            strides = tuple(int(np.prod(shape[k + 1:])) for k in range(len(shape)))
            e.call(ad_helpers.ad_local_add, [self._fixed(buf), index, g, e.const(strides),
                                             e.const(int(np.prod(shape)))])
            return
        if key not in self.own:
            e.call(subscripts.atomic_update, [grad, index, g, e.const("add")])
            return
        ir = self.ir
        current = e.assign(ir.Expr.getitem(grad, index, e.loc))
        e.out.append(ir.SetItem(grad, index, e.binop(operator.add, current, g), e.loc))

    # -- loops inside the task: adstacks ----------------------------------------------------------
    def find_inner_loops(self):
        """The loops of the body (natural loops of its back edges), the blocks each contains, and
        each one's trip count as a size expression (None where the sizer cannot express it)."""
        ir = self.ir
        inside = set(self.body)
        state_of, back = {}, []
        preds = {lbl: [] for lbl in inside}

        def visit(lbl):
            state_of[lbl] = "open"
            for succ in successors(ir, self.blocks[lbl]):
                if succ not in inside:
                    continue
                preds[succ].append(lbl)
                if state_of.get(succ) == "open":
                    back.append((lbl, succ))
                elif succ not in state_of:
                    visit(succ)
            state_of[lbl] = "done"

        visit(self.entry)
        self.loops, self.tails = {}, {}
        for tail, head in back:
            self.tails.setdefault(head, []).append(tail)
            members = self.loops.setdefault(head, {head})
            work = [tail]
            while work:
                lbl = work.pop()
                if lbl not in members:
                    members.add(lbl)
                    work.extend(preds[lbl])
        if self.entry in self.loops:
            raise self.state.error(QuadrantsSyntaxError, "kernel.grad: a parallel loop whose body starts with a "
                                   "loop cannot be differentiated; put a statement before it",
                                   self.blocks[self.entry].loc)
        self.trips = {head: self._trip_count(head) for head in self.loops}

    def _is_for(self, head) -> bool:
        ir = self.ir
        return any(isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "iternext"
                   for stmt in self.blocks[head].body)

    def _trip_count(self, head):
        """The iterations of the loop headed by ``head``: a ``for`` over ``range(...)``."""
        ir, state = self.ir, self.state
        for stmt in self.blocks[head].body:
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "iternext":
                it = _resolved(state, stmt.value.value)
                if not (isinstance(it, ir.Expr) and it.op == "getiter"):
                    return None
                rng = _resolved(state, it.value)
                if not (isinstance(rng, ir.Expr) and rng.op == "call" and try_static(state, rng.func) is range) \
                        or rng.kws or not 1 <= len(rng.args) <= 3:
                    return None
                parts = [size_expr(state, a, space=self.lp.space_var) for a in rng.args]
                if any(p is None for p in parts):
                    return None
                start, stop, step = ([("const", 0)] + parts if len(parts) == 1 else parts) + [("const", 1)] * (
                    3 - max(2, len(parts)))
                if step[0] != "const" or step[1] <= 0:
                    return None
                span = ("-", stop, start) if step[1] == 1 else ("//", ("+", ("-", stop, start),
                                                                       ("const", step[1] - 1)), step)
                return ("max", ("const", 0), span)
        return None

    def _stack_size(self, info):
        """Words one thread pushes in one iteration of the task: per block inside loops, its
        words times the product of (trips + 1) of the loops holding it (headers run once more)."""
        total = ("const", 0)
        for lbl in sorted(self.stacked):
            b = info[lbl]
            term = ("const", sum(self._words(v) for v in self._saved(b)))
            for head in sorted(h for h, members in self.loops.items() if lbl in members):
                term = ("*", term, ("+", self.trips[head], ("const", 1)))
            total = term if total == ("const", 0) else ("+", total, term)
        return total

    def _open_stack(self, info):
        """The task's AdStack, and ``$ad_stack``/``$ad_top`` at the start of each iteration."""
        state, ir = self.state, self.ir
        unbounded = [h for h, trip in self.trips.items() if trip is None]
        if unbounded and not state.config.ad_stack_size:
            head = min(unbounded)
            # a for loop's header starts at its line; a while loop's test ends the block looping back
            loc = self.blocks[head].body[0].loc if self._is_for(head) else \
                self.blocks[max(self.tails[head])].body[-1].loc
            raise state.error(QuadrantsCompilationError,
                              "kernel.grad: the adstack sizer cannot bound this loop inside a parallel loop (it "
                              "sizes for loops over range() of constants, scalar arguments, ndarray shapes, the "
                              "parallel loop's index and field/ndarray elements at constant indices or at the "
                              "parallel loop's index, with + - * // max min); "
                              "set qd.init(ad_stack_size=N) to give the depth", loc)
        size = None if unbounded else simplify_size(self._stack_size(info))
        if size is not None and has_index(size):    # a per-thread bound: the max over the loop's space
            dims = space_sizes(state, self.lp.space_var)
            if dims is None and not state.config.ad_stack_size:
                raise state.error(QuadrantsCompilationError,
                                  "kernel.grad: a loop bound inside this parallel loop reads its index, and the "
                                  "sizer cannot express the parallel loop's iteration space to take the maximum "
                                  "over; set qd.init(ad_stack_size=N) to give the depth",
                                  self.blocks[self.lp.header].loc)
            size = None if dims is None else ("maxover", dims, size)
        task = next(t for t in state.tasks if t.header == self.lp.header)
        text = render(size, lambda k: _arg_name(state, k)) if size is not None else "qd.init(ad_stack_size)"
        stack = AdStack(state.kernel_name, task.loc, size, text)
        stack.header = self.lp.header
        state.adstacks.append(stack)
        desc = hidden_argument(state, stack.desc, self.loc)
        entry = self.blocks[self.entry]
        opening = [ir.Assign(ir.Global("ad_stack_open", ad_stack.ad_stack_open, self.loc), self._fixed("$ad_open"),
                             self.loc),
                   ir.Assign(ir.Expr.call(self._fixed("$ad_open"), [desc], (), self.loc), self._fixed("$ad_stack"),
                             self.loc),
                   ir.Assign(ir.Const(0, self.loc), self._fixed("$ad_top"), self.loc)]
        entry.body[:0] = opening
        # an overflowed stack cannot replay the path: skip the reverse (the launch raises)
        latch = self.blocks[self.latch]
        e = _Emitter(state, self.scope, self.loc, latch.body)
        jump = latch.body.pop()
        full = e.call(ad_stack.ad_overflowed, [self._fixed("$ad_stack"), self._fixed("$ad_top")])
        latch.body.append(ir.Branch(full, self.done, jump.target, self.loc))

    def _read_by_adjoints(self, labels) -> set:
        """Names whose values the adjoint blocks read (a ``zero_like`` argument gives only its type)."""
        ir = self.ir
        stmts = [stmt for lbl in labels for stmt in self.blocks[lbl].body]
        zero_fns = {stmt.target.name for stmt in stmts if isinstance(stmt, ir.Assign)
                    and isinstance(stmt.value, ir.Global) and stmt.value.value is ad_helpers.zero_like}
        out = set()
        for stmt in stmts:
            value = getattr(stmt, "value", None)
            if isinstance(value, ir.Expr) and value.op == "call" and value.func.name in zero_fns:
                continue
            out.update(v.name for v in stmt.list_vars() if not (isinstance(stmt, ir.Assign) and v is stmt.target))
        return out

    def _saved(self, b):
        """What a block inside a loop pushes: its path record and the versions the adjoints read
        (constants are the same in every execution: not pushed)."""
        return ([b.came_from] if b.came_from is not None else []) + \
            [v for v in b.versions if v.name not in self.constant and v.name in self.needed]

    def _words(self, var) -> int:
        """Adstack words of a pushed value: its element count where the value is a vector/matrix
        the shape inference follows, its component count for a tuple built in the body (an index
        ``(0, c)``), else 1 (the push checks at typing time that it is enough)."""
        value = self._fwd_def(var)
        if isinstance(value, self.ir.Expr) and value.op == "build_tuple":
            return max(1, len(value.items))
        shape = _Shapes(self).of(var)
        return int(np.prod(shape)) if shape else 1

    def _push_all(self, b):
        """At the end of the block's forward execution (before its terminator)."""
        block = self.blocks[b.label]
        out = []
        e = _Emitter(self.state, self.scope, self.loc, out)
        top = self._fixed("$ad_top")
        for var in self._saved(b):
            words = e.const(self._words(var))
            out.append(self.ir.Assign(e.call(ad_helpers.ad_push_words, [self._fixed("$ad_stack"), top, var, words]),
                                      top, self.loc))
        block.body[-1:-1] = out

    def _pop_all(self, b):
        """At the start of the block's adjoint."""
        ir = self.ir
        out = []
        e = _Emitter(self.state, self.scope, self.loc, out)
        top = self._fixed("$ad_top")
        for var in reversed(self._saved(b)):
            words = e.const(self._words(var))
            out.append(ir.Assign(e.call(ad_helpers.ad_pop_top_words, [top, var, words]), top, self.loc))
            out.append(ir.Assign(e.call(ad_helpers.ad_pop_words, [self._fixed("$ad_stack"), top, var, words]), var,
                                 self.loc))
        self.blocks[b.reverse].body[:0] = out

    def run(self):
        ir = self.ir
        order = self._block_order()
        self.stacked = set().union(*self.loops.values()) if self.loops else set()
        latch = self.latch = self.state.new_label()
        self.blocks[latch] = ir.Block(self.scope, self.loc)
        self.blocks[latch].body = [ir.Jump(self.lp.header, self.loc)]
        for lbl in self.body:
            term = self.blocks[lbl].body[-1]
            if self.lp.header in successors(ir, self.blocks[lbl]):
                self.blocks[lbl].body[-1] = _retargeted(ir, term, {self.lp.header: latch})
        order.append(latch)
        preds = {lbl: [] for lbl in order}
        for lbl in order:
            for succ in successors(ir, self.blocks[lbl]):
                if succ in preds:
                    preds[succ].append(lbl)
        info = {}
        for lbl in order:
            info[lbl] = _Block(lbl, self.state.new_label(), [], [], preds[lbl])
            self.blocks[info[lbl].reverse] = ir.Block(self.scope, self.loc)
        done = self.done = self.state.new_label()
        self.blocks[done] = ir.Block(self.scope, self.loc)
        self.blocks[done].body.append(ir.Jump(self.lp.header, self.loc))
        self.counted = self._counted_headers(info)
        for lbl in order:
            self._forward(info[lbl])
        self.blocks[self.entry].body[:0] = [ir.Assign(ir.Const(0, self.loc), self._counter(head), self.loc)
                                            for head in sorted(self.counted)]
        new_labels = {done}
        for lbl in reversed(order):
            new_labels |= self._reverse(info[lbl], info, done, latch)
        if self.local:
            self._open_sums()
        if self.stacked:
            _prune_unread(self.state, new_labels)
            self.needed = self._read_by_adjoints(new_labels)
            for lbl in self.stacked:
                self._push_all(info[lbl])
                self._pop_all(info[lbl])
            self._open_stack(info)
        self.lp.body |= {latch} | new_labels
        self.state.tasks = [dataclasses.replace(t, body=frozenset(self.lp.body)) if t.header == self.lp.header
                            else t for t in self.state.tasks]

    def _counted_headers(self, info) -> dict:
        """Loop headers whose path is replayed by counting instead of a path record per execution:
        an outermost loop of the body (its one predecessor outside it is outside every loop, so
        it runs once per iteration of the task) with one latch. The forward counts the header's
        executions (``$ad_cnt_<h>``, zeroed at the task body's entry); the reverse counts down,
        and the first execution's adjoint goes back to the outside predecessor. Header -> (outside
        predecessor, latch)."""
        in_loops = set().union(*self.loops.values()) if self.loops else set()
        out = {}
        for head, members in self.loops.items():
            outside = [p for p in info[head].preds if p not in members]
            inside = [p for p in info[head].preds if p in members]
            if len(outside) == 1 and len(inside) == 1 and outside[0] not in in_loops:
                out[head] = (outside[0], inside[0])
        return out

    def _counter(self, head):
        return self._fixed(f"$ad_cnt_{head}")

    def _block_order(self):
        """The body's blocks from the entry, depth first (loops inside the body allowed)."""
        ir = self.ir
        order, seen = [], set()

        def visit(lbl):
            seen.add(lbl)
            for succ in successors(ir, self.blocks[lbl]):
                if succ != self.lp.header and succ in self.lp.body and succ not in seen:
                    visit(succ)
            order.append(lbl)

        visit(self.entry)
        return order[::-1]

    # -- forward: renamed recomputation -----------------------------------------------------------
    def _forward(self, b: _Block):
        ir, state = self.ir, self.state
        block = self.blocks[b.label]
        out = []
        e = _Emitter(state, self.scope, block.loc, out)
        if b.label in self.counted:
            counter = self._counter(b.label)
            out.append(ir.Assign(ir.Expr.binop(operator.add, counter, e.const(1), block.loc), counter, block.loc))
        elif len(b.preds) > 1:
            b.came_from = e.assign(self._fixed("$ad_cur"), "$ad_pred")
        out.append(ir.Assign(ir.Const(b.label, block.loc), self._fixed("$ad_cur"), block.loc))
        current = {}

        def renamed(var):
            name = var.name
            if name not in self.assigned:
                return var
            if name not in current:
                version = e.var(f"$ad_{_clean(name)}")
                out.append(ir.Assign(ir.Var(self.scope, name, var.loc), version, var.loc))
                self.fwd_value[version.name] = ir.Var(self.scope, name, var.loc)
                b.items.append(("entry", version, name))
                b.versions.append(version)
                current[name] = version
            return current[name]

        written = []
        for stmt in block.body[:-1]:
            if isinstance(stmt, ir.Del):
                continue
            read = stmt.list_vars() if not isinstance(stmt, ir.Assign) else \
                [stmt.value] if isinstance(stmt.value, ir.Var) else stmt.value.list_vars() \
                if isinstance(stmt.value, ir.Expr) else []
            mapping = {v.name: renamed(v) for v in read}
            fwd = _renamed_copy(state, stmt, mapping)
            if isinstance(stmt, ir.Assign):
                version = e.var(f"$ad_{_clean(stmt.target.name)}")
                if isinstance(stmt.value, (ir.Const, ir.Global, ir.FreeVar)):
                    self.constant.add(version.name)
                fwd.target = version
                self.fwd_value[version.name] = self.fwd_value[stmt.target.name] = fwd.value
                self.fwd_values.setdefault(stmt.target.name, []).append(fwd.value)
                out.append(self._forward_effect(stmt, fwd))
                current[stmt.target.name] = version
                b.versions.append(version)
                written.append(stmt.target.name)
                if id(stmt) not in self.dead:
                    b.items.append(("stmt", stmt, fwd))
            elif isinstance(stmt, (ir.SetItem, ir.StaticSetItem)) and is_global_data(state, stmt.target):
                b.items.append(("store", stmt, fwd))    # the forward kernel stored it: not again
            elif isinstance(stmt, ir.Print):
                continue
            else:
                raise state.error(QuadrantsSyntaxError,
                                  f"kernel.grad: this statement cannot be differentiated ({type(stmt).__name__})",
                                  stmt.loc)
        term = block.body[-1] if b.label != self.latch else ir.Jump(b.reverse, block.loc)
        if isinstance(term, ir.Branch):
            term = ir.Branch(renamed(term.cond), term.truebr, term.falsebr, term.loc)
        for name in dict.fromkeys(written):
            out.append(ir.Assign(current[name], ir.Var(self.scope, name, block.loc), block.loc))
            b.items.append(("exit", current[name], name))
        out.append(term)
        block.body = out

    def _forward_effect(self, stmt, fwd):
        """An atomic update of global data: the forward kernel did it; the old value is read.
        A store to an ndarray argument: the forward kernel made it."""
        ir = self.ir
        value = stmt.value
        if isinstance(value, ir.Expr) and value.op == "call":
            callee = try_static(self.state, value.func)
            if callee is subscripts.atomic_update:
                base, index = fwd.value.args[0], fwd.value.args[1]
                return ir.Assign(ir.Expr.getitem(base, index, stmt.loc), fwd.target, stmt.loc)
            if callee in _ARRAY_STORES:
                return ir.Assign(ir.Const(None, stmt.loc), fwd.target, stmt.loc)
        return fwd

    # -- adjoint ----------------------------------------------------------------------------------
    def _reverse(self, b: _Block, info, done, latch) -> set:
        ir = self.ir
        out = []
        e = _Emitter(self.state, self.scope, self.loc, out)
        if b.label == latch:
            for name in sorted({name for other in info.values() for kind, _, name in other.items
                                if kind == "exit"}):
                self.canonical[name] = self._fixed(f"$ad_adjc_{_clean(name)}")
                e.out.append(ir.Assign(e.call(ad_helpers.zero_like, [ir.Var(self.scope, name, self.loc)]),
                                       self.canonical[name], self.loc))
        for version in b.versions:
            self.adjoint[version.name] = e.call(ad_helpers.zero_like, [version], "$ad_adj")
        for item in reversed(b.items):
            kind = item[0]
            if kind == "exit":
                _, version, name = item
                self._add(e, version, self.canonical[name])
                e.out.append(ir.Assign(e.call(ad_helpers.zero_like, [version]), self.canonical[name], self.loc))
            elif kind == "entry":
                _, version, name = item
                adj = self.adjoint[version.name]
                e.out.append(ir.Assign(e.call(ad_helpers.ad_acc, [self.canonical[name], adj]), self.canonical[name],
                                       self.loc))
            elif kind == "store":
                self._store_adjoint(e, item[1], item[2])
            else:
                self._stmt_adjoint(e, item[1], item[2])
        new = {b.reverse}
        if b.label == self.entry:
            out.append(ir.Jump(done, self.loc))
        elif len(b.preds) == 1:
            out.append(ir.Jump(info[b.preds[0]].reverse, self.loc))
        elif b.label in self.counted:     # the count down reaches 0 at the first execution
            outside, latch_pred = self.counted[b.label]
            counter = self._counter(b.label)
            out.append(ir.Assign(ir.Expr.binop(operator.sub, counter, e.const(1), self.loc), counter, self.loc))
            first = e.binop(operator.eq, counter, e.const(0))
            out.append(ir.Branch(first, info[outside].reverse, info[latch_pred].reverse, self.loc))
        else:
            new |= self._dispatch(e, b, info)
        self.blocks[b.reverse].body = out
        return new

    def _dispatch(self, e, b, info) -> set:
        """Branch to the adjoint of the predecessor this block came from."""
        ir = self.ir
        new = set()
        for pred in b.preds[:-1]:
            hit = e.binop(operator.eq, b.came_from, e.const(pred))
            nxt = self.state.new_label()
            e.out.append(ir.Branch(hit, info[pred].reverse, nxt, self.loc))
            self.blocks[nxt] = ir.Block(self.scope, self.loc)
            self.blocks[nxt].body = e.out = []
            new.add(nxt)
        e.out.append(ir.Jump(info[b.preds[-1]].reverse, self.loc))
        return new

    def _fixed(self, name):
        """A variable of this name, assigned in several blocks (not renamed)."""
        self.scope.get_or_define(name, self.loc)
        return self.ir.Var(self.scope, name, self.loc)

    def _add(self, e, var, contribution):
        """``adj(var) += contribution`` when ``var`` is a version of this task body."""
        adj = self.adjoint.get(var.name)
        if adj is not None:
            self.adjoint[var.name] = e.call(ad_helpers.ad_acc, [adj, contribution], "$ad_adj")

    def _grad_field(self, e, base_stmt_var):
        """The variable of the gradient of global data ``base_stmt_var``: the ``.grad`` field of a
        field (a hidden argument), the hidden gradient parameter of an ndarray parameter
        (kernel.py passes ``arg.grad`` there), or None (no gradient: a constant)."""
        field = try_static(self.state, base_stmt_var)
        if isinstance(field, Field):
            return None if field.grad is None else hidden_argument(self.state, field.grad, self.loc)
        arg = argument_of(self.state, base_stmt_var)
        return None if arg is None else _grad_parameter(self.state, arg.name, self.loc)

    def _store_adjoint(self, e, stmt, fwd):
        grad = self._grad_field(e, stmt.target)
        if grad is None:
            return
        index = fwd.index if isinstance(stmt, self.ir.SetItem) else e.const(stmt.index)
        self._add(e, fwd.value, e.assign(self.ir.Expr.getitem(grad, index, self.loc)))

    def _stmt_adjoint(self, e, stmt, fwd):
        ir, state = self.ir, self.state
        value, new = stmt.value, fwd.value
        g = self.adjoint[fwd.target.name]
        if isinstance(value, ir.Var):
            self._add(e, new, g)
            return
        if not isinstance(value, ir.Expr):
            return                      # constants, globals, arguments
        op = value.op
        if op in ("binop", "inplace_binop", "unary"):
            fn = value.fn if op != "inplace_binop" else value.immutable_fn
            rule = OPERATOR_ADJOINTS.get(fn)
            if rule is not None:
                args = [new.lhs, new.rhs] if op != "unary" else [new.value]
                self._apply(e, rule, args, fwd.target, g)
            return
        if op in ("getitem", "static_getitem"):
            index = new.index if op == "getitem" else e.const(new.index)
            if is_global_data(state, value.value):
                grad = self._grad_field(e, value.value)
                if grad is not None:
                    self._accumulate(e, value.value, grad, index, g)
            else:
                self._add(e, new.value, e.call(ad_helpers.ad_item_adjoint, [new.value, index, g]))
            return
        if op == "getattr":
            if value.attr in _COMPONENTS:
                index = e.const(_COMPONENTS[value.attr])
                self._add(e, new.value, e.call(ad_helpers.ad_item_adjoint, [new.value, index, g]))
            return
        if op == "call":
            self._call_adjoint(e, stmt, fwd, g)

    def _call_adjoint(self, e, stmt, fwd, g):
        state = self.state
        callee = try_static(state, stmt.value.func)
        args = fwd.value.args
        if callee in _ARRAY_LOADS or callee in _ARRAY_STORES:    # an ndarray parameter's element
            grad = self._grad_field(e, stmt.value.args[0])
            if grad is None:
                return
            if callee in _ARRAY_LOADS:      # at the read's line: an error there names it
                self._accumulate(_Emitter(state, self.scope, stmt.loc, e.out), stmt.value.args[0], grad, args[1], g)
            else:
                self._add(e, args[2], e.assign(self.ir.Expr.getitem(grad, args[1], self.loc)))
            return
        if callee is subscripts.atomic_update:
            base, index = stmt.value.args[0], args[1]
            op = try_static(state, stmt.value.args[3])
            grad = self._grad_field(e, base) if is_global_data(state, base) else None
            if grad is None:
                return
            if op not in ("add", "sub"):
                raise state.error(QuadrantsSyntaxError,
                                  f"kernel.grad: atomic '{op}' on a field with a gradient cannot be "
                                  "differentiated", stmt.loc)
            load = e.assign(self.ir.Expr.getitem(grad, index, self.loc))
            self._add(e, args[2], load if op == "add" else e.assign(self.ir.Expr.unary(operator.neg, load, self.loc)))
            return
        if callee in _MATH_CALLEES:
            name = _MATH_CALLEES[callee]
            if len(args) != MATH_OPS[name].arity:
                raise state.error(QuadrantsSyntaxError,
                                  f"kernel.grad: {name} with {len(args)} arguments cannot be differentiated",
                                  stmt.loc)
            self._apply(e, MATH_OPS[name].adjoint, args, fwd.target, g)
            return
        if callee is subscripts.true_divide:
            self._apply(e, OPERATOR_ADJOINTS[operator.truediv], args, fwd.target, g)
            return
        if callee is qd_math.cast:
            dtype = try_static(state, stmt.value.args[1])
            if isinstance(dtype, types.Float) or dtype in _FLOAT_CASTS:
                self._add(e, args[0], g)
            return
        if callee in _FLOAT_CASTS or isinstance(callee, types.Float):
            self._add(e, args[0], g)
            return
        method = self._method(fwd.value.func)
        if method is not None:
            base, name = method
            self._apply(e, MATRIX_METHODS[name].adjoint, [base, *args], fwd.target, g)
            return
        if callee is not MISSING and _is_constructor(callee):
            items = self._flat_items(args)
            tup = e.assign(self.ir.Expr.build_tuple(items, self.loc))
            for k, item in enumerate(items):
                self._add(e, item, e.call(ad_helpers.ad_ctor_part, [g, e.const(k), tup]))
            return
        if callee is not MISSING and (_is_no_gradient(callee) or _is_constant_matrix(callee)):
            return
        what = getattr(callee, "__name__", None) or "this function"
        raise state.error(QuadrantsSyntaxError,
                          f"kernel.grad: a call to {what} cannot be differentiated (use a qd.func, a "
                          "qd math function, or qd.stop_grad)", stmt.loc)

    def _method(self, func):
        """``(base, name)`` when ``func`` is a vector/matrix method of a local (``v.dot``)."""
        value = self._fwd_def(func)
        if isinstance(value, self.ir.Expr) and value.op == "getattr" and value.attr in MATRIX_METHODS:
            return value.value, value.attr
        return None

    def _fwd_def(self, var):
        """The forward value of ``var`` (a version, or a body variable it copies)."""
        value = self.fwd_value.get(var.name)
        if isinstance(value, self.ir.Var):
            value = self.fwd_value.get(value.name)
        return value

    def _flat_items(self, args) -> list:
        """A constructor's arguments with its literal lists flattened, row-major."""
        out = []
        for arg in args:
            value = self._fwd_def(arg)
            if isinstance(value, self.ir.Expr) and value.op in ("build_list", "build_tuple"):
                out.extend(self._flat_items(value.items))
            else:
                out.append(arg)
        return out

    def _apply(self, e, rule, args, out, g):
        for arg, contribution in zip(args, trace_rule(e, rule, args, out, g)):
            self._add(e, arg, contribution)


class _Shapes:
    """Shapes of values of a task body, from the untyped IR (``()`` a scalar, ``(n,)`` a vector,
    ``(n, m)`` a matrix, None unknown): what the adstack sizer needs to count the words of a
    vector/matrix value (the transform runs before typing)."""

    _SCALAR_METHODS = ("dot", "norm", "norm_sqr", "sum", "max", "min", "trace", "determinant")

    def __init__(self, t):
        self.t, self.ir, self.state = t, t.ir, t.state

    def of(self, var, seen=frozenset()):
        if var.name in seen:
            return None
        seen = seen | {var.name}
        ir = self.ir
        if var.name in self.t.fwd_values:       # a body variable: the shape of one of its values
            shapes = [self._value(value, seen) for value in self.t.fwd_values[var.name]]
            return next((sh for sh in shapes if sh is not None), None)
        value = self.t.fwd_value.get(var.name)
        if isinstance(value, ir.Var):
            return self.of(value, seen)
        return self._value(value, seen)

    def _value(self, value, seen):
        ir = self.ir
        if isinstance(value, ir.Var):
            return self.of(value, seen)
        if isinstance(value, ir.Const):
            return () if isinstance(value.value, (int, float, bool, np.number)) else None
        if not isinstance(value, ir.Expr):
            return None
        op = value.op
        if op in ("binop", "inplace_binop"):
            fn = value.fn if op == "binop" else value.immutable_fn
            a, b = self.of(value.lhs, seen), self.of(value.rhs, seen)
            if fn is operator.matmul:
                return _matmul_shape(a, b)
            return a if b == () else b if a == () else a if a == b else None
        if op == "unary":
            return self.of(value.value, seen)
        if op == "getattr":
            return () if value.attr in _COMPONENTS else None
        if op in ("getitem", "static_getitem"):
            return self._item(value, seen)
        if op == "call":
            return self._call(value, seen)
        return None

    def _item(self, value, seen):
        state = self.state
        base = value.value
        while isinstance(self.t.fwd_value.get(base.name), self.ir.Var):     # a version: its original
            base = self.t.fwd_value[base.name]
        if base.name not in self.t.fwd_value and is_global_data(state, base):
            field = try_static(state, base)
            elem = getattr(field, "elem_type", None)
            return tuple(elem.shape) if isinstance(elem, MatrixType) else () if isinstance(field, Field) else None
        base = self.of(value.value, seen)
        if value.op == "static_getitem":
            count = len(value.index) if isinstance(value.index, tuple) else 1
        else:
            index = self.t._fwd_def(value.index)
            count = len(index.items) if isinstance(index, self.ir.Expr) and index.op == "build_tuple" else 1
        return None if base is None or count > len(base) else base[count:]

    def _static(self, var):
        """The compile-time value of ``var`` (a version: of what it copies), or MISSING."""
        while True:
            value = self.t.fwd_value.get(var.name)
            if isinstance(value, (self.ir.Global, self.ir.FreeVar)):
                return value.value
            if not isinstance(value, self.ir.Var):
                return try_static(self.state, var) if value is None else MISSING
            var = value

    def _call(self, value, seen):
        callee = self._static(value.func)
        args = value.args
        method = self.t._method(value.func)
        if method is not None:
            base, name = method
            shape = self.of(base, seen)
            if name in self._SCALAR_METHODS or (name == "cross" and shape == (2,)):
                return ()
            if name == "transpose":
                return None if shape is None else tuple(reversed(shape))
            if name == "outer_product":
                other = self.of(args[0], seen) if args else None
                return None if shape is None or other is None else shape + other
            return shape            # normalized, inverse, cross of 3-d vectors
        if isinstance(callee, MatrixType):
            return tuple(callee.shape)
        if callee is not MISSING and _is_constructor(callee):
            if len(args) != 1:
                return None
            return self._literal(args[0], seen)
        math_op = _hashable(callee) and callee in _MATH_CALLEES
        if callee is subscripts.true_divide:
            math_op, args = True, args[:2]
        if math_op or callee is qd_math.cast or _hashable(callee) and callee in _FLOAT_CASTS \
                or callee is ad_helpers.stop_grad:
            shapes = [self.of(a, seen) for a in (args if math_op else args[:1])]
            vectors = [sh for sh in shapes if sh != ()]
            return () if not vectors else vectors[0] if all(sh == vectors[0] for sh in vectors) else None
        if callee is subscripts.atomic_update:
            return self._item(self.ir.Expr.getitem(args[0], args[1], value.loc), seen)
        if callee is not MISSING and _is_no_gradient(callee):
            return ()
        return None

    def _literal(self, var, seen):
        """The shape a constructor makes of its list argument."""
        value = self.t._fwd_def(var)
        if not (isinstance(value, self.ir.Expr) and value.op in ("build_list", "build_tuple")):
            return None
        inner = [self._literal(item, seen) or self.of(item, seen) for item in value.items]
        if not inner or any(sh is None for sh in inner) or any(sh != inner[0] for sh in inner) or len(inner[0]) > 1:
            return None
        return (len(inner),) + inner[0]


_PURE_EXPRS = ("binop", "inplace_binop", "unary", "getattr", "build_tuple", "static_getitem", "getitem")
# the calls adjoint rules emit that only compute a value (qd math functions, the adjoint helpers)
_PURE_CALLS = {id(fn) for fn in (ad_helpers.zero_like, ad_helpers.ad_acc, ad_helpers.ad_item_adjoint,
                                 ad_helpers.ad_ctor_part, ad_helpers.ad_matmul_adjoint, ad_helpers.ad_eye_like,
                                 ad_helpers.ad_extreme, ad_helpers.ad_cross_lhs)}
_PURE_CALLS.update(id(getattr(qd_math, name)) for name in qd_math.__all__ if callable(getattr(qd_math, name)))


def _prune_unread(state, labels) -> None:
    """Drop the assignments of the adjoint blocks ``labels`` whose value nothing reads (the
    contribution a rule computes for a constant operand, the adjoint of a value nothing depends
    on), to a fixed point: then the values an adjoint reads are the ones it needs, and only those
    are pushed onto the adstack (the anchor's ``sin(v)``, read only by the adjoint of ``1.01``,
    is not)."""
    ir = state.ir
    blocks = state.func_ir.blocks
    pure_fns = set()
    for lbl in labels:
        for stmt in blocks[lbl].body:
            value = getattr(stmt, "value", None)
            if isinstance(stmt, ir.Assign) and isinstance(value, ir.Global) and id(value.value) in _PURE_CALLS:
                pure_fns.add(stmt.target.name)

    def pure(stmt):
        if not isinstance(stmt, ir.Assign):
            return False
        value = stmt.value
        if isinstance(value, (ir.Var, ir.Const, ir.Global, ir.FreeVar)):
            return True
        return isinstance(value, ir.Expr) and (value.op in _PURE_EXPRS or value.op == "call" and not value.kws
                                               and value.func.name in pure_fns)

    reads = {}
    for block in blocks.values():
        for stmt in block.body:
            for v in stmt.list_vars():
                if not (isinstance(stmt, ir.Assign) and v is stmt.target):
                    reads[v.name] = reads.get(v.name, 0) + 1
    changed = True
    while changed:
        changed = False
        for lbl in labels:
            keep = []
            for stmt in blocks[lbl].body:
                if pure(stmt) and not reads.get(stmt.target.name):
                    for v in stmt.list_vars():
                        if v is not stmt.target:
                            reads[v.name] -= 1
                    changed = True
                else:
                    keep.append(stmt)
            blocks[lbl].body = keep


def _hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _matmul_shape(a, b):
    if a is None or b is None or not a or not b:
        return None
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return (b[1],)
    return (a[0],) if len(b) == 1 else (a[0], b[1])


def _is_constructor(callee) -> bool:
    """``qd.Vector``/``qd.Matrix`` and vector/matrix types (``qd.math.vec3``)."""
    return isinstance(callee, MatrixType) or getattr(callee, "_qd_matrix_constructor", False) is True


def _is_constant_matrix(callee) -> bool:
    """Constructors of constant matrices (no gradient flows through their arguments)."""
    return any(callee is fn for fn in (Matrix.zero, Matrix.identity, Vector.zero, Vector.unit))


def _renamed_copy(state, stmt, mapping):
    """A copy of ``stmt`` reading the variables ``mapping`` renames (its target unchanged)."""
    ir = state.ir
    mapping = {name: var for name, var in mapping.items() if var.name != name}

    def rename(node, mapping):
        return state.tools.ir_utils.replace_vars_inner(node, mapping) if mapping and node is not None else node

    if isinstance(stmt, ir.Assign):
        value = stmt.value
        if isinstance(value, ir.Expr):
            value = copy.copy(value)
            value._kws = dict(value._kws)
        return ir.Assign(rename(value, mapping), stmt.target, stmt.loc)
    if isinstance(stmt, ir.SetItem):
        return ir.SetItem(rename(stmt.target, mapping), rename(stmt.index, mapping), rename(stmt.value, mapping),
                          stmt.loc)
    return ir.StaticSetItem(rename(stmt.target, mapping), stmt.index, rename(stmt.index_var, mapping),
                            rename(stmt.value, mapping), stmt.loc)


def _resolved(state, var):
    """The definition of ``var`` through copies (None if it has several)."""
    for _ in range(20):
        d = state.definition(var)
        if not isinstance(d, state.ir.Var):
            return d
        var = d
    return None


def _retargeted(ir, term, mapping):
    if isinstance(term, ir.Jump):
        return ir.Jump(mapping.get(term.target, term.target), term.loc)
    return ir.Branch(term.cond, mapping.get(term.truebr, term.truebr), mapping.get(term.falsebr, term.falsebr),
                     term.loc)


def _grad_parameter(state, name: str, loc):
    """The variable of the hidden gradient parameter of ndarray parameter ``name``, bound at the
    front of the entry block the first time; None when the call passed no gradient for it."""
    grad_name = grad_parameter(name)
    if grad_name not in state.runtime_params:
        return None
    ir = state.ir
    entry = state.func_ir.blocks[min(state.func_ir.blocks)]
    var = ir.Var(entry.scope, grad_name, loc)
    if grad_name not in state.hidden_vars:
        state.hidden_vars[grad_name] = grad_name
        entry.scope.get_or_define(grad_name, loc)
        entry.body.insert(0, ir.Assign(ir.Arg(grad_name, state.runtime_params.index(grad_name), loc), var, loc))
    return var


def _clean(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


# -- serial code between the loops ---------------------------------------------------------------------

def _serial_as_loop(state, unit) -> None:
    """A serial region with side effects, in the gradient kernel.

    The region stays where it is with its global stores and atomics removed (the forward kernel
    made them): it recomputes the values the later tasks read, and like all serial code it runs
    before the reversed loops. Where it stores to, or atomically updates, a field with a gradient,
    a copy of it (its variables renamed) becomes the body of a one-iteration range-for task placed
    before it, so that the reverse transform gives it adjoints like any task and the task order
    runs them at its place in reverse (serial tasks between loops reversed too)."""
    ir = state.ir
    blocks = state.func_ir.blocks
    labels = sorted(unit.labels)
    effects = []                # (stmt, its replacement or None, the global it updates)
    for lbl in labels:
        for stmt in blocks[lbl].body:
            if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)) and is_global_data(state, stmt.target):
                effects.append((stmt, None, stmt.target))
                continue
            value = getattr(stmt, "value", None)
            if isinstance(stmt, ir.Assign) and isinstance(value, ir.Expr) and value.op == "call" \
                    and try_static(state, value.func) is subscripts.atomic_update:
                load = ir.Assign(ir.Expr.getitem(value.args[0], value.args[1], stmt.loc), stmt.target, stmt.loc)
                effects.append((stmt, load, value.args[0]))
    if any(_has_grad(state, target) for _, _, target in effects):
        labels = _one_iteration_task(state, unit, labels)
    replaced = {id(stmt): replacement for stmt, replacement, _ in effects}
    for lbl in labels:
        block = blocks[lbl]
        block.body = [replaced.get(id(stmt), stmt) for stmt in block.body if replaced.get(id(stmt), 0) is not None]


def _renumber_loops(state) -> None:
    """Loop tasks numbered 0..n-1 in program order (the serial tasks are planned again later)."""
    by_header = {t.header: t for t in state.tasks if t.kind == "range_for"}
    state.loops = sorted(state.loops, key=lambda lp: lp.task_index)
    for k, lp in enumerate(state.loops):
        lp.task_index = k
    state.tasks = [by_header[lp.header].renumbered(lp.task_index) for lp in state.loops]


def _has_grad(state, var) -> bool:
    return getattr(try_static(state, var), "grad", None) is not None


def _one_iteration_task(state, unit, labels) -> list:
    ir = state.ir
    blocks = state.func_ir.blocks
    start_label = unit.start
    if start_label == min(blocks):      # the kernel's entry: its arguments stay there, the rest moves
        first = blocks[start_label]
        args = [s for s in first.body if isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg)]
        moved = state.new_label()
        blocks[moved] = ir.Block(first.scope, first.loc)
        blocks[moved].body = [s for s in first.body if not any(s is a for a in args)]
        first.body = args + [ir.Jump(moved, first.loc)]
        labels = sorted((set(labels) - {start_label}) | {moved})
        for lp in state.loops:
            if lp.preheader == start_label:
                lp.preheader = moved
        start_label = moved
    start = blocks[start_label]
    scope, loc = start.scope, start.loc
    inside = set(labels)
    # the copy: fresh labels, the region's variables renamed, exits looping back to the header
    def new_block():
        label = state.new_label()
        blocks[label] = ir.Block(scope, loc)
        return label

    header, pre, exit_, entry = (new_block() for _ in range(4))
    relabel = {lbl: new_block() for lbl in labels}
    assigned = {stmt.target.name for lbl in labels for stmt in blocks[lbl].body if isinstance(stmt, ir.Assign)}
    rename = {name: scope.redefine(f"$ad_serial_{_clean(name)}", loc) for name in sorted(assigned)}
    for lbl in labels:
        new = ir.Block(scope, blocks[lbl].loc)
        for stmt in blocks[lbl].body:
            if isinstance(stmt, ir.Return):     # the kernel's end: the task's iteration ends
                stmt = ir.Jump(header, stmt.loc)
            elif isinstance(stmt, (ir.Jump, ir.Branch)):
                stmt = _retargeted(ir, stmt, {t: relabel.get(t, header) for t in successors(ir, blocks[lbl])})
                if isinstance(stmt, ir.Branch):
                    stmt.cond = rename.get(stmt.cond.name, stmt.cond)
            elif isinstance(stmt, (ir.Assign, ir.SetItem, ir.StaticSetItem)):
                stmt = _renamed_copy(state, stmt, rename)
                if isinstance(stmt, ir.Assign):
                    stmt.target = rename[stmt.target.name]
            else:
                continue            # del, print: nothing to differentiate
            new.body.append(stmt)
        blocks[relabel[lbl]] = new
    blocks[entry].body = [ir.Jump(relabel[start_label], loc)]
    # the loop: ``for _ in range(1)``, entered from the region's predecessors, leaving into the region
    one = scope.redefine("$ad_serial_one", loc)
    fn = scope.redefine("$ad_serial_range_dim", loc)
    space = scope.redefine("$ad_serial_space", loc)
    total_fn = scope.redefine("$ad_serial_space_total", loc)
    total = scope.redefine("$ad_serial_total", loc)
    rng = scope.redefine("$ad_serial_range", loc)
    rng_call = scope.redefine("$ad_serial_range_call", loc)
    it = scope.redefine("$ad_serial_iter", loc)
    setup = [ir.Assign(ir.Const(1, loc), one, loc),
             ir.Assign(ir.Global("range_dim", spaces.range_dim, loc), fn, loc),
             ir.Assign(ir.Expr.call(fn, [one], (), loc), space, loc),
             ir.Assign(ir.Global("space_total", spaces.space_total, loc), total_fn, loc),
             ir.Assign(ir.Expr.call(total_fn, [space], (), loc), total, loc),
             ir.Assign(ir.Global("range", range, loc), rng, loc)]
    plumbing = [ir.Assign(ir.Expr.call(rng, [total], (), loc), rng_call, loc),
                ir.Assign(ir.Expr.getiter(rng_call, loc), it, loc)]
    blocks[pre].body = setup + plumbing + [ir.Jump(header, loc)]
    pair, index, ok = (scope.redefine(f"$ad_serial_{n}", loc) for n in ("pair", "index", "ok"))
    blocks[header].body = [ir.Assign(ir.Expr.iternext(it, loc), pair, loc),
                           ir.Assign(ir.Expr.pair_first(pair, loc), index, loc),
                           ir.Assign(ir.Expr.pair_second(pair, loc), ok, loc),
                           ir.Branch(ok, entry, exit_, loc)]
    blocks[exit_].body = [ir.Jump(start_label, loc)]
    for lbl, block in list(blocks.items()):
        if lbl not in inside and lbl != exit_ and start_label in successors(ir, block):
            block.body[-1] = _retargeted(ir, block.body[-1], {start_label: pre})
    for lp in state.loops:
        if lp.exit == start_label:
            lp.exit = pre
    body = {header, entry} | set(relabel.values())
    later = [lp for lp in state.loops if lp.task_index >= unit.task.index]
    lp = OffloadedLoop(unit.task.index, header, body, pre, exit_, it, space, total, plumbing, setup)
    for other in later:
        other.task_index += 1
    state.loops = sorted(state.loops + [lp], key=lambda x: x.task_index)
    state.refresh_definitions()
    task = Task.make(task_prefix(state), lp.task_index, "range_for", ndim=1, loc=unit.task.loc, serialize=True,
                     header=header, body=frozenset(body), bounds=task_bounds(state, space))
    state.tasks = sorted([t.renumbered(t.index + 1) if t.index >= lp.task_index else t for t in state.tasks
                          if t.kind == "range_for"] + [task], key=lambda t: t.index)
    state.refresh_definitions()
    return labels


# -- task order ----------------------------------------------------------------------------------------

def _reverse_task_order(state):
    """Run the (pure) serial code first, then the loops last to first.

    Each loop's preheader skips its loop (its iteration space is still computed there); a new
    preheader per loop holds the iterator plumbing; the kernel's return block starts the chain
    ``loop n-1 -> ... -> loop 0 -> return``."""
    ir = state.ir
    blocks = state.func_ir.blocks
    loops = sorted(state.loops, key=lambda lp: lp.task_index)
    if not loops:
        return
    in_loops = set().union(*(lp.body for lp in loops))
    returns = [lbl for lbl, block in blocks.items() if lbl not in in_loops and isinstance(block.body[-1], ir.Return)]
    if len(returns) != 1:
        raise state.error(QuadrantsCompilationError, "kernel.grad: a kernel with several returns cannot be "
                          "differentiated")
    ret_label = returns[0]
    ret_block = blocks[ret_label]
    loc = ret_block.loc
    final = max(blocks) + 1
    blocks[final] = ir.Block(ret_block.scope, loc)
    blocks[final].body = [ret_block.body[-1]]
    new_pre = {}
    for lp in loops:
        pre = blocks[lp.preheader]
        plumbing = {id(s) for s in lp.plumbing}
        label = max(blocks) + 1
        blocks[label] = ir.Block(pre.scope, pre.loc)
        blocks[label].body = [s for s in pre.body[:-1] if id(s) in plumbing] + [ir.Jump(lp.header, pre.loc)]
        pre.body = [s for s in pre.body[:-1] if id(s) not in plumbing] + [ir.Jump(lp.exit, pre.loc)]
        new_pre[lp.header] = label
    ret_block.body[-1] = ir.Jump(new_pre[loops[-1].header], loc)
    for k, lp in enumerate(loops):
        exit_to = new_pre[loops[k - 1].header] if k > 0 else final
        header = blocks[lp.header]
        header.body[-1] = _retargeted(ir, header.body[-1], {lp.exit: exit_to})
        lp.preheader, lp.exit = new_pre[lp.header], exit_to
    n = len(loops)
    by_header = {t.header: t for t in state.tasks}
    for lp in loops:
        lp.task_index = n - 1 - lp.task_index
    state.loops = sorted(loops, key=lambda lp: lp.task_index)
    state.tasks = [by_header[lp.header].renumbered(lp.task_index) for lp in state.loops]
