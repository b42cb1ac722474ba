"""FoldStatic: ``qd.static(...)`` is evaluated at compile time.

* ``qd.static(expr)`` calls become constants (``QuadrantsSyntaxError`` if ``expr`` is not
  compile-time known).
* A branch whose condition is compile-time known becomes a jump; unreachable blocks are
  removed (so the dead side of ``if qd.static(...)`` is never typed).
* ``for x in qd.static(iterable)`` is unrolled: one copy of the body per element, with the
  loop target bound to that element (ints, fields, funcs, tuples of them). A ``for`` over a
  Python list or tuple without ``qd.static`` is an error, and so is ``in`` / ``not in``
  outside ``qd.static`` (as in Quadrants); what only a folded ``qd.static`` read is removed.
* ``qd.static_print(...)`` prints and ``qd.static_assert(cond, msg)`` checks, once per
  compile, after unrolling (so each unrolled copy prints its own values); both calls are
  removed. The CUDA compile check (a second compile on the CPU arch) does not print again.

It also puts every ``for`` loop in the shape :func:`loop_shape` recognises (the header is the
block that calls ``iternext``; see :func:`bypass_jump_only_headers`), for itself and Offload.
"""

from __future__ import annotations

import operator

from ..errors import QuadrantsCompilationError, QuadrantsSyntaxError, QuadrantsTypeError
from ..lang import static as qd_static
from ..lang import static_assert as qd_static_assert
from ..lang import static_print as qd_static_print
from .base import MISSING, copy_ir, try_static
from .ir_builder import retarget


def _static_calls(state):
    """(block, index, statement, callee) of each call whose callee is known at compile time
    (a list, so callers may replace the statements as they go)."""
    ir = state.ir
    found = []
    for block in state.func_ir.blocks.values():
        for k, stmt in enumerate(block.body):
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call":
                fn = try_static(state, stmt.value.func)
                if fn is not MISSING:
                    found.append((block, k, stmt, fn))
    return found


class FoldStatic:
    name = "fold_static"

    def run(self, state) -> bool:
        changed = bypass_jump_only_headers(state)
        changed |= _split_negated_membership(state)
        _reject_runtime_sequence_loops(state)
        changed |= self._fold_calls(state, strict=False)
        # a qd.static(...) that reads the target of a static loop folds once the loop is unrolled
        while self._unroll_one_loop(state):
            self._fold_calls(state, strict=False)
            changed = True
        changed |= self._fold_calls(state, strict=True)
        _reject_runtime_membership(state)
        changed |= self._fold_branches(state)
        changed |= self._run_static_prints_and_asserts(state)
        if changed:
            state.refresh_definitions()
        return changed

    # -- qd.static(...) calls -------------------------------------------------------------
    def _fold_calls(self, state, strict: bool) -> bool:
        """Fold the ``qd.static`` calls known at compile time; with ``strict``, an unknown one is
        an error."""
        ir = state.ir
        changed = False
        state.refresh_definitions()
        inputs = set()
        for block, k, stmt, fn in _static_calls(state):
            if fn is not qd_static:
                continue
            inputs |= _computed_from(state, stmt.value.args)
            value = try_static(state, stmt.target, permissive=True)
            if value is MISSING and not strict:
                continue
            if value is MISSING:
                raise state.error(QuadrantsSyntaxError,
                                  "the argument of qd.static() must be known at compile time", stmt.loc)
            const = ir.Const(value, stmt.loc) if isinstance(value, (bool, int, float, str, type(None))) \
                else ir.Global(stmt.target.name, value, stmt.loc)
            block.body[k] = ir.Assign(const, stmt.target, stmt.loc)
            changed = True
        if changed:
            _remove_dead_inputs(state, inputs)
        return changed

    # -- qd.static_print / qd.static_assert ----------------------------------------------------
    def _run_static_prints_and_asserts(self, state) -> bool:
        ir = state.ir
        changed = False
        state.refresh_definitions()
        for block, k, stmt, fn in _static_calls(state):
            if fn is qd_static_print:
                _static_print(state, stmt.value, stmt.loc)
            elif fn is qd_static_assert:
                _static_assert(state, stmt.value, stmt.loc)
            else:
                continue
            block.body[k] = ir.Assign(ir.Const(None, stmt.loc), stmt.target, stmt.loc)
            changed = True
        return changed

    # -- branches ---------------------------------------------------------------------------
    def _fold_branches(self, state) -> bool:
        ir = state.ir
        changed = False
        for block in state.func_ir.blocks.values():
            term = block.body[-1]
            if not isinstance(term, ir.Branch):
                continue
            value = try_static(state, term.cond)
            if value is MISSING or not isinstance(value, (bool, int, float, type(None))):
                continue
            block.body[-1] = ir.Jump(term.truebr if value else term.falsebr, term.loc)
            changed = True
        if changed:
            remove_unreachable(state)
        return changed

    # -- loops --------------------------------------------------------------------------------
    def _unroll_one_loop(self, state) -> bool:
        analysis = state.tools.analysis
        state.refresh_definitions()
        cfg = analysis.compute_cfg_from_blocks(state.func_ir.blocks)
        for header, loop in cfg.loops().items():
            shape = loop_shape(state, header, loop)
            if shape is None:
                continue
            iterable_def = state.definition(shape.iterable)
            if not _is_static_call_result(state, shape.iterable, iterable_def):
                continue
            values = try_static(state, shape.iterable, permissive=True)
            if values is MISSING:
                continue
            shape.body = set(shape.body) | _return_tails(cfg, shape)
            try:
                values = list(values)
            except TypeError as e:
                raise state.error(QuadrantsSyntaxError, f"qd.static loop over a non-iterable {values!r}",
                                  shape.loc) from e
            self._unroll(state, shape, values)
            return True
        return False

    def _unroll(self, state, shape, values):
        ir = state.ir
        blocks = state.func_ir.blocks
        body_labels = sorted(shape.body - {shape.header})
        entries = []
        next_label = state.new_label()
        copies = []
        for _ in values:
            mapping = {}
            for lbl in body_labels:
                mapping[lbl] = next_label
                next_label += 1
            copies.append(mapping)
            entries.append(mapping[shape.body_entry])
        private = _body_private_names(ir, blocks, shape, body_labels)
        # a new name must be no name of the IR: Scope.redefine hands back names the IR already
        # uses when they are not in the scope's table, and replace_vars follows chains of renames
        taken = private | {v.name for b in blocks.values() for stmt in b.body for v in stmt.list_vars()}
        scope = blocks[shape.body_entry].scope
        for n, (value, mapping) in enumerate(zip(values, copies)):
            continue_to = entries[n + 1] if n + 1 < len(values) else shape.exit
            # each copy gets its own names for variables that live only in the body, so every
            # copy's loop target (a field, a func) has a single definition later passes can follow
            renames = {name: _fresh(scope, name, taken, shape.loc) for name in sorted(private)}
            # a renamed temporary of an inlined func stays a temporary (qd.atomic_add(x[i], v)
            # in a func called in the body must still target x[i], passes/rewrite_subscripts.py)
            state.inlined_temps.update(new.name for old, new in renames.items() if old in state.inlined_temps)
            for lbl in body_labels:
                new = copy_ir(ir, blocks[lbl])
                retarget(ir, new, {**mapping, shape.header: continue_to})
                if lbl == shape.body_entry:
                    new.body.insert(0, ir.Assign(_constant(ir, value, shape.loc, shape.index_var.name),
                                                 shape.index_var, shape.loc))
                state.tools.ir_utils.replace_vars({0: new}, renames)
                blocks[mapping[lbl]] = new
        pre = blocks[shape.preheader]
        pre.body = [s for s in pre.body if s not in shape.plumbing]
        pre.body[-1] = ir.Jump(entries[0] if entries else shape.exit, pre.body[-1].loc)
        for lbl in shape.body:
            del blocks[lbl]
        remove_unreachable(state)


def _computed_from(state, args) -> set:
    """Names of the variables ``args`` are computed from (the inputs of a ``qd.static`` call)."""
    work, seen = list(args), set()
    while work:
        var = work.pop()
        if var.name not in seen:
            seen.add(var.name)
            definition = state.definition(var)
            work.extend(definition.list_vars() if isinstance(definition, state.ir.Expr) else ())
    return seen


def _remove_dead_inputs(state, inputs: set) -> None:
    """Drop what only a folded ``qd.static`` read: Python evaluated it at compile time, so it
    needs no Numba type (``qd.static(k in SIZES)`` with a global list ``SIZES``)."""
    ir = state.ir
    while True:
        state.refresh_definitions()
        used = {v.name for b in state.func_ir.blocks.values() for s in b.body for v in s.list_vars()
                if not (isinstance(s, ir.Assign) and v is s.target)}
        dead = False
        for block in state.func_ir.blocks.values():
            keep = [s for s in block.body if not (isinstance(s, ir.Assign) and s.target.name in inputs
                                                  and s.target.name not in used and s.target.is_temp)]
            dead |= len(keep) != len(block.body)
            block.body = keep
        if not dead:
            return


_BUILT_SEQUENCES = {"build_list": "list", "build_tuple": "tuple"}


def _reject_runtime_sequence_loops(state) -> None:
    """A ``for`` over a Python list or tuple is compile-time only (``qd.static``), as in Quadrants."""
    ir = state.ir
    cfg = state.tools.analysis.compute_cfg_from_blocks(state.func_ir.blocks)
    state.refresh_definitions()
    for header, loop in cfg.loops().items():
        shape = loop_shape(state, header, loop)
        if shape is None:
            continue
        d = state.definition(shape.iterable)
        if isinstance(d, (ir.Const, ir.Global, ir.FreeVar)):
            kind = type(d.value).__name__ if isinstance(d.value, (list, tuple)) else None
        else:
            kind = _BUILT_SEQUENCES.get(d.op) if isinstance(d, ir.Expr) else None
        if kind is not None:
            raise state.error(QuadrantsTypeError,
                              f"cannot loop over a {kind} at run time in a kernel: only fields, "
                              "ndarrays, range(), qd.ndrange() and qd.grouped() are; unroll a loop over a "
                              "Python list or tuple with 'for v in qd.static(...)'", shape.loc)


def _split_negated_membership(state) -> bool:
    """Numba spells ``a not in b`` as ``t = b contains a; t = not t``: give the first ``t`` a
    name of its own, so that ``qd.static(a not in b)`` has one definition to evaluate."""
    ir = state.ir
    changed = False
    for block in state.func_ir.blocks.values():
        for k, stmt in enumerate(block.body[1:], 1):
            prev = block.body[k - 1]
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "unary" \
                    and stmt.value.fn is operator.not_ and stmt.value.value.name == stmt.target.name \
                    and isinstance(prev, ir.Assign) and prev.target.name == stmt.target.name:
                fresh = block.scope.redefine("$qd_contains", prev.loc)
                block.body[k - 1] = ir.Assign(prev.value, fresh, prev.loc)
                stmt.value.value = fresh
                changed = True
    if changed:
        state.refresh_definitions()
    return changed


def _reject_runtime_membership(state) -> None:
    """``in`` / ``not in`` are compile-time only (inside ``qd.static``), as in Quadrants."""
    ir = state.ir
    negated = {stmt.value.value.name for block in state.func_ir.blocks.values() for stmt in block.body
               if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "unary"
               and stmt.value.fn is operator.not_}
    for block in state.func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "binop" \
                    and stmt.value.fn is operator.contains:
                name = "not in" if stmt.target.name in negated else "in"
                raise state.error(QuadrantsSyntaxError,
                                  f"'{name}' is only supported inside qd.static(...) in a kernel", stmt.loc)


def _static_print(state, call, loc) -> None:
    args = [_printable(state, a) for a in call.args]
    if call.vararg is not None:
        more = try_static(state, call.vararg)
        if more is MISSING:
            raise state.error(QuadrantsSyntaxError, "qd.static_print(*args): args must be known at compile time", loc)
        args.extend(more)
    kws = {}
    for name, var in call.kws:
        kws[name] = try_static(state, var)
        if kws[name] is MISSING:
            raise state.error(QuadrantsSyntaxError, f"qd.static_print({name}=...) must be known at compile time", loc)
    # the CUDA compile check is a second compile of a CPU kernel: it stays quiet
    if state.tools.flavour == "numba.core" or state.config.arch != "cpu":
        qd_static_print(*args, **kws)


class _Runtime:
    """How ``qd.static_print`` shows a value known only at run time."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<runtime {self.name}>"

    __str__ = __repr__


def _printable(state, var):
    value = try_static(state, var)
    if value is MISSING:
        return _Runtime("value" if state.is_temp(var) else var.name)
    return value


def _static_assert(state, call, loc) -> None:
    bound = dict(zip(("cond", "msg"), call.args))
    for name, var in call.kws:
        if name not in ("cond", "msg") or name in bound:
            bound = {}
            break
        bound[name] = var
    if "cond" not in bound or len(call.args) > 2 or call.vararg is not None:
        raise state.error(QuadrantsSyntaxError, "qd.static_assert(cond, msg=None) takes a condition and a message",
                          loc)
    cond = try_static(state, bound["cond"], permissive=True)
    if cond is MISSING:
        raise state.error(QuadrantsSyntaxError, "the condition of qd.static_assert() must be known at compile time",
                          loc)
    msg = try_static(state, bound["msg"], permissive=True) if "msg" in bound else None
    if msg is MISSING:
        raise state.error(QuadrantsSyntaxError, "the message of qd.static_assert() must be known at compile time",
                          loc)
    if not cond:
        raise state.error(QuadrantsCompilationError,
                          "static assertion failed" + (f": {msg}" if msg is not None else ""), loc)


def _return_tails(cfg, shape) -> set:
    """The blocks outside the loop that only its body reaches (``if qd.static(k == 2): return
    a[k]``: the ``return`` leaves the loop, so the CFG's loop body does not hold it). Unrolling
    copies them with each iteration, so each copy reads its own loop target."""
    dominators = cfg.dominators()
    return {lbl for lbl, doms in dominators.items()
            if shape.body_entry in doms and lbl not in shape.body and lbl != shape.header}


def _body_private_names(ir, blocks, shape, body_labels) -> set:
    """Variables defined in the loop body (or the loop target) and never mentioned outside it."""
    defined = {shape.index_var.name}
    for lbl in body_labels:
        defined.update(s.target.name for s in blocks[lbl].body if isinstance(s, ir.Assign))
    outside = set()
    for lbl, block in blocks.items():
        if lbl not in shape.body:
            for stmt in block.body:
                outside.update(v.name for v in stmt.list_vars())
    return defined - outside


def _fresh(scope, name, taken: set, loc):
    while True:
        var = scope.redefine(name, loc)
        if var.name not in taken:
            taken.add(var.name)
            return var


def _constant(ir, value, loc, name):
    if isinstance(value, (bool, int, float, str, type(None))):
        return ir.Const(value, loc)
    return ir.Global(name, value, loc)


def _is_static_call_result(state, var, d):
    ir = state.ir
    return isinstance(d, (ir.Const, ir.Global)) or (
        isinstance(d, ir.Expr) and d.op == "call" and try_static(state, d.func) is qd_static)


class LoopShape:
    """The pieces of a Python ``for`` loop in Numba IR."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def bypass_jump_only_headers(state) -> bool:
    """Make the predecessors of a loop header that only jumps on jump straight to its target.

    CPython prefixes a loop's ``FOR_ITER`` with ``EXTENDED_ARG`` once its exit is more than 255
    code units away (a body of ~40 statements or more); the prefix is a jump target, so Numba
    makes it a block of its own that just jumps to the ``iternext`` block. Bypassing such
    blocks (whatever produced them, chains included) leaves the ``iternext`` block as the
    header, the shape :func:`loop_shape` describes on every Python version."""
    ir = state.ir
    blocks = state.func_ir.blocks
    entry = min(blocks)
    changed = False
    while True:  # again only if a bypassed block jumped to a block that only jumps on
        cfg = state.tools.analysis.compute_cfg_from_blocks(blocks)
        jumps = {h: blocks[h].body[-1].target for h in cfg.loops() if h != entry and _jump_only(ir, blocks[h])}
        bypass = {}
        for header, target in jumps.items():
            seen = {header}
            while target in jumps and target not in seen:  # a chain of such headers
                seen.add(target)
                target = jumps[target]
            if target not in seen:  # not an empty endless loop
                bypass[header] = target
        if not bypass:
            break
        for block in blocks.values():
            retarget(ir, block, bypass)
        for header in bypass:
            del blocks[header]
        changed = True
    if changed:
        state.refresh_definitions()
    return changed


def _jump_only(ir, block) -> bool:
    return len(block.body) == 1 and isinstance(block.body[0], ir.Jump)


def loop_shape(state, header, loop):
    """Describe a ``for`` loop (getiter/iternext form), or None for ``while`` loops.

    Expects loop headers without a jump-only prefix (:func:`bypass_jump_only_headers`)."""
    ir = state.ir
    blocks = state.func_ir.blocks
    hblock = blocks[header]
    term = hblock.body[-1]
    if not isinstance(term, ir.Branch):
        return None
    iternext = next((s for s in hblock.body if isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr)
                     and s.value.op == "iternext"), None)
    if iternext is None or len(loop.entries) != 1:
        return None
    preheader = next(iter(loop.entries))
    iter_var = iternext.value.value
    pre = blocks[preheader]
    plumbing, iterable = [], None
    for s in pre.body:
        if isinstance(s, ir.Assign) and s.target.name == iter_var.name:
            plumbing.append(s)
            src = s.value
            getiter = next((t for t in pre.body if isinstance(t, ir.Assign) and isinstance(src, ir.Var)
                            and t.target.name == src.name and isinstance(t.value, ir.Expr)
                            and t.value.op == "getiter"), None)
            if getiter is not None:
                plumbing.append(getiter)
                iterable = getiter.value.value
            elif isinstance(src, ir.Expr) and src.op == "getiter":
                iterable = src.value
    if iterable is None:
        return None
    pair_first = next(s for s in hblock.body if isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr)
                      and s.value.op == "pair_first")
    index_var = pair_first.target
    for s in hblock.body:  # the index is copied to a $phi variable read by the body
        if isinstance(s, ir.Assign) and isinstance(s.value, ir.Var) and s.value.name == pair_first.target.name:
            index_var = s.target
    body_entry = term.truebr if term.truebr in loop.body else term.falsebr
    exit_label = term.falsebr if body_entry == term.truebr else term.truebr
    return LoopShape(header=header, body=set(loop.body), preheader=preheader, iterable=iterable,
                     plumbing=plumbing, index_var=index_var, body_entry=body_entry, exit=exit_label,
                     loc=iternext.loc, iternext=iternext)


def remove_unreachable(state) -> None:
    ir = state.ir
    blocks = state.func_ir.blocks
    entry = min(blocks)
    seen, todo = set(), [entry]
    while todo:
        lbl = todo.pop()
        if lbl in seen or lbl not in blocks:
            continue
        seen.add(lbl)
        term = blocks[lbl].body[-1]
        if isinstance(term, ir.Jump):
            todo.append(term.target)
        elif isinstance(term, ir.Branch):
            todo.extend((term.truebr, term.falsebr))
    for lbl in list(blocks):
        if lbl not in seen:
            del blocks[lbl]
    state.refresh_definitions()
