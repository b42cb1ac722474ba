"""Offload: every top-level ``for`` becomes a range-for Task over a canonical iteration space.

Input: the kernel IR after inlining, static folding and subscript rewrites. For each top-level
loop (``range``, ``qd.ndrange``, ``qd.grouped``, struct-for over a field/ndarray) this pass

1. replaces the iterable by an iteration space (tuple of ``(start, stop, step)``, see
   lowering/spaces.py) and the loop by ``for flat in range(space_total(space))``;
2. binds the loop target(s) from ``space_index(space, flat)`` at the top of the body
   (one index, several indices, or one vector index for ``qd.grouped``);
3. records an :class:`OffloadedLoop` (the IR pieces the targets need) and a range-for
   :class:`Task` — for the loops every run of the kernel reaches once; a top-level loop under
   runtime control flow (an ``if``, a ``while``) is canonicalised but stays serial code.

A serialised loop (``qd.loop_config(serialize=True)`` or ``parallelize=1``) that ``break``s out
or whose locals are read after it is not a task: it runs as serial code, in order.

PlanTasks (passes/plan_tasks.py) then adds the serial Tasks. Rejected here: ``return`` out of a
top-level loop, ``break`` out of a parallel one, a loop target count that does not match the
space, and locals assigned inside a parallel loop but read after it (except the kernel-scope
reductions that ReduceAtomics, passes/reductions.py, rewrites).
"""

from __future__ import annotations

import dataclasses

from ..errors import QuadrantsIndexError, QuadrantsSyntaxError
from ..field import ArrayData
from ..lang import grouped as qd_grouped
from ..lang import loop_config as qd_loop_config
from ..lang import ndrange as qd_ndrange
from ..lowering import spaces, subscripts
from ..task import Task
from .base import MISSING, argument_of, try_static
from .bounds import task_bounds
from .dead_code import remove_dead_pure
from .fold_static import bypass_jump_only_headers, loop_shape
from .liveness import Liveness
from .plan_tasks import launched_headers, task_prefix
from .reductions import kernel_scope_reduction


@dataclasses.dataclass
class OffloadedLoop:
    task_index: int
    header: int
    body: set              # labels, header included
    preheader: int
    exit: int
    iter_var: object       # the variable iternext reads (defined in the preheader)
    space_var: object      # the iteration space (defined in the preheader)
    total_var: object      # number of iterations (defined in the preheader)
    plumbing: list         # preheader statements that build the iterator (range/getiter)
    setup: list            # preheader statements that compute the space and the total


def _loc_str(loc) -> str:
    return f"{loc.filename}:{loc.line}" if loc is not None else "?"


class Offload:
    name = "offload"

    def run(self, state) -> bool:
        analysis = state.tools.analysis
        state.refresh_definitions()
        bypassed = bypass_jump_only_headers(state)  # FoldStatic did; Offload must not depend on it
        cfg = analysis.compute_cfg_from_blocks(state.func_ir.blocks)
        loops = sorted(analysis.find_top_level_loops(cfg), key=lambda lp: cfg.topo_order().index(lp.header))
        launched = launched_headers(state)
        state.loops, state.tasks = [], []
        preheaders, candidates = [], []
        for loop in loops:
            shape = loop_shape(state, loop.header, loop)
            if shape is None:  # a top-level while loop: serial code
                continue
            serialize = self._take_loop_config(state, shape)
            # a serialised loop that leaves early runs as serial code: one thread, in order
            is_task = shape.header in launched and not self._check_exits(state, shape, serialize)
            # every top-level loop gets a canonical iteration space; one under runtime control
            # flow then runs as an ordinary serial loop inside its serial task
            info = self._canonicalize(state, shape)
            preheaders.append(shape.preheader)
            if is_task:
                lp = OffloadedLoop(-1, shape.header, set(shape.body), shape.preheader, shape.exit,
                                   shape.iternext.value.value, info["space"], info["total"],
                                   info["plumbing"], info["setup"])
                candidates.append((lp, shape, info, serialize))
        # what canonicalisation left dead (``range(n)`` ...), once for all preheaders: per loop
        # it would make the pass quadratic in the number of loops
        remove_dead_pure(state, preheaders)
        grouped = []
        for lp, shape, info, serialize in self._check_live_outs(state, candidates):
            index = lp.task_index = len(state.tasks)
            state.loops.append(lp)
            grouped.append(info["grouped"])
            state.tasks.append(Task.make(task_prefix(state), index, "range_for",
                                         ndim=info["ndim"], loc=_loc_str(shape.loc), serialize=serialize,
                                         header=shape.header, body=frozenset(shape.body),
                                         stream_group=state.stream_groups.get(shape.header, 0)))
        state.refresh_definitions()
        state.tasks = [task.renumbered(task.index, bounds=task_bounds(state, lp.space_var, grouped=g))
                       for task, lp, g in zip(state.tasks, state.loops, grouped)]
        return bypassed or bool(preheaders)

    # -- checks ----------------------------------------------------------------------------
    def _check_exits(self, state, shape, serialize: bool) -> bool:
        """Whether a ``break`` leaves the loop (allowed when it is serialised); ``return`` never is."""
        ir = state.ir
        leaves = False
        for lbl in shape.body:
            for stmt in state.func_ir.blocks[lbl].body:
                if isinstance(stmt, ir.Return):
                    raise state.error(QuadrantsSyntaxError,
                                      "'return' inside a parallel (top-level) for loop is not supported",
                                      stmt.loc)
            term = state.func_ir.blocks[lbl].body[-1]
            targets = [term.target] if isinstance(term, ir.Jump) else \
                [term.truebr, term.falsebr] if isinstance(term, ir.Branch) else []
            for t in targets:
                if t not in shape.body and not (lbl == shape.header and t == shape.exit):
                    if not serialize:
                        raise state.error(QuadrantsSyntaxError,
                                          "'break' out of a parallel (top-level) for loop is not supported; "
                                          "serialise the loop (qd.loop_config(serialize=True)), put it inside "
                                          "a serial loop or use a flag", term.loc)
                    leaves = True
        return leaves

    def _take_loop_config(self, state, shape) -> bool:
        """Remove a ``qd.loop_config(...)`` call placed before the loop; return ``serialize``."""
        ir = state.ir
        pre = state.func_ir.blocks[shape.preheader]
        for k, stmt in enumerate(pre.body):
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call" \
                    and try_static(state, stmt.value.func) is qd_loop_config:
                kws = {key: try_static(state, var) for key, var in stmt.value.kws}
                pre.body[k] = ir.Assign(ir.Const(None, stmt.loc), stmt.target, stmt.loc)
                # ``parallelize=1`` is Quadrants' other spelling of ``serialize=True``
                serialize, threads = kws.get("serialize", False), kws.get("parallelize")
                return (bool(serialize) and serialize is not MISSING) or (threads == 1 and threads is not MISSING)
        return False

    def _check_live_outs(self, state, candidates) -> list:
        """Locals assigned in a parallel loop are per-thread: reading them afterwards is an error.
        A serialised loop whose locals are read afterwards runs as serial code instead (one
        thread, in order, as its program says). Returns the candidates that stay tasks."""
        ir = state.ir
        blocks = state.func_ir.blocks
        liveness = Liveness(state.tools.analysis, ir, blocks)   # one for the kernel, linear in its IR
        tasks = []
        for lp, shape, info, serialize in candidates:
            defined = {}
            for lbl in lp.body:
                for stmt in blocks[lbl].body:
                    if isinstance(stmt, ir.Assign) and not state.is_temp(stmt.target):
                        defined.setdefault(stmt.target.name, stmt.loc)
            leaked = [name for name in sorted(liveness.live_at(lp.exit, defined))   # assigned in the body
                      if kernel_scope_reduction(state, lp, name) is None]   # ReduceAtomics rewrites those
            if leaked and serialize:
                continue
            if leaked:
                raise state.error(
                    QuadrantsSyntaxError,
                    f"local variable '{leaked[0]}' is assigned inside a parallel for loop and read after it; "
                    "loop iterations run in parallel, so store results in a field (0-d fields: x[None]), "
                    "update it with +=, qd.atomic_min/max, or serialise the loop",
                    defined[leaked[0]])
            tasks.append((lp, shape, info, serialize))
        return tasks

    # -- canonical iteration spaces ------------------------------------------------------------
    def _canonicalize(self, state, shape):
        ir = state.ir
        blocks = state.func_ir.blocks
        pre = blocks[shape.preheader]
        scope = pre.scope
        loc = shape.loc
        new = []

        def call(fn, args, name):
            fvar = scope.redefine(f"$qd_{fn.__name__}", loc)
            out = scope.redefine(name, loc)
            new.append(ir.Assign(ir.Global(fn.__name__, fn, loc), fvar, loc))
            new.append(ir.Assign(ir.Expr.call(fvar, list(args), (), loc), out, loc))
            return out

        space, ndim, is_grouped = self._space(state, shape.iterable, call, new, loc, scope)
        total = call(spaces.space_total, [space], "$qd_total")
        rng = scope.redefine("$qd_range", loc)
        new.append(ir.Assign(ir.Global("range", range, loc), rng, loc))
        rng_call = scope.redefine("$qd_range_call", loc)
        plumbing = [ir.Assign(ir.Expr.call(rng, [total], (), loc), rng_call, loc)]
        it = scope.redefine("$qd_iter", loc)
        plumbing.append(ir.Assign(ir.Expr.getiter(rng_call, loc), it, loc))
        plumbing.append(ir.Assign(it, shape.iternext.value.value, loc))
        # preheader: <user serial code> <space/total setup> <plumbing> jump header
        body = [s for s in pre.body[:-1] if s not in shape.plumbing]
        pre.body = body + new + plumbing + [pre.body[-1]]
        self._bind_targets(state, shape, space, ndim, is_grouped)
        return {"space": space, "total": total, "ndim": ndim, "grouped": is_grouped, "plumbing": plumbing,
                "setup": new}

    def _space(self, state, iterable, call, new, loc, scope):
        """(space var, ndim, grouped) for a loop iterable."""
        ir = state.ir
        d = state.definition(iterable)
        if isinstance(d, ir.Expr) and d.op == "call":
            fn = try_static(state, d.func)
            if fn is range:
                return call(spaces.range_dim, d.args, "$qd_space"), 1, False
            if fn is qd_ndrange:
                dims = [call(spaces.ndrange_dim, [a], "$qd_dim") for a in d.args]
                tup = scope.redefine("$qd_space", loc)
                new.append(ir.Assign(ir.Expr.build_tuple(dims, loc), tup, loc))
                return tup, len(dims), False
            if fn is qd_grouped:
                if len(d.args) != 1:
                    raise state.error(QuadrantsSyntaxError, "qd.grouped() takes one argument", loc)
                space, ndim, _ = self._space(state, d.args[0], call, new, loc, scope)
                return space, ndim, True
        ndim = self._static_ndim(state, iterable)
        if ndim is None:
            raise state.error(QuadrantsSyntaxError,
                              "a top-level for loop must iterate over range(), qd.ndrange(), qd.grouped() "
                              "or a field/ndarray", loc)
        return call(spaces.shape_space, [iterable], "$qd_space"), ndim, False

    @staticmethod
    def _static_ndim(state, var):
        value = try_static(state, var)
        if isinstance(value, ArrayData):
            return len(value.shape)
        d = argument_of(state, var)
        if d is not None and d.name in state.param_types:
            ty = state.param_types[d.name]
            return getattr(ty, "ndim", None)
        return None

    def _bind_targets(self, state, shape, space, ndim, is_grouped):
        ir = state.ir
        entry = state.func_ir.blocks[shape.body_entry]
        scope = entry.scope
        loc = shape.loc
        flat = shape.index_var
        fvar = scope.redefine("$qd_space_index", loc)
        idx = scope.redefine("$qd_idx", loc)
        prologue = [ir.Assign(ir.Global("space_index", spaces.space_index, loc), fvar, loc),
                    ir.Assign(ir.Expr.call(fvar, [space, flat], (), loc), idx, loc)]
        first = entry.body[0]
        if isinstance(first, ir.Assign) and isinstance(first.value, ir.Expr) and first.value.op == "exhaust_iter" \
                and first.value.value.name == flat.name:
            if is_grouped or first.value.count != ndim:
                raise state.error(QuadrantsSyntaxError,
                                  f"the loop has {first.value.count} targets but iterates over {ndim} "
                                  "dimension(s)", first.loc)
            entry.body[0] = ir.Assign(idx, first.target, first.loc)
        elif isinstance(first, ir.Assign) and isinstance(first.value, ir.Var) and first.value.name == flat.name:
            if is_grouped:
                vec = scope.redefine("$qd_grouped", loc)
                prologue += [ir.Assign(ir.Global("index_vector", subscripts.index_vector, loc), vec, loc),
                             ir.Assign(ir.Expr.call(vec, [idx], (), loc), first.target, loc)]
                entry.body.pop(0)
            elif ndim == 1:
                entry.body[0] = ir.Assign(ir.Expr.static_getitem(idx, 0, None, loc), first.target, first.loc)
            else:
                raise state.error(QuadrantsSyntaxError,
                                  f"a loop over {ndim} dimensions needs {ndim} targets (for i, j in ...) "
                                  "or qd.grouped(...)", first.loc)
        elif is_grouped or ndim == 1:
            return  # the loop target is never read (``for _ in range(n)``): nothing to bind
        else:       # ``for _ in x`` over a 0-d or 2-d x: one target, as Quadrants, is an error
            raise state.error(QuadrantsIndexError,
                              f"a loop over {ndim} dimensions needs {ndim} targets (for i, j in ...) "
                              "or qd.grouped(...)", loc)
        entry.body[:0] = prologue
