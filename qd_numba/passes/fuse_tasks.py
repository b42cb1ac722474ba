"""FuseAdjacentTasks: merge adjacent range-for tasks when that is provably safe.

Input: the kernel IR right after Offload, with ``state.loops`` (one OffloadedLoop per
range-for task) and ``state.tasks``. Output: the same IR where some loops were merged into
one, ``state.loops``/``state.tasks`` renumbered, and each fused Task listing the source loops
it came from (``Task.fused_from``). Every target consumes the result, so every backend
benefits. docs/fusion.md explains the rules; in short, two range-for tasks A then B fuse when

* they are adjacent: no serial task between them (statements between them are pure and are
  hoisted before A), the same ``stream_group``, neither is ``serialize``d;
* their iteration spaces are identical: the same constants, arguments, shapes, or values
  computed once by earlier serial code (the Task's ``bounds``, passes/bounds.py);
* every global resource (field, ndarray argument) that one of them writes and the other
  touches is accessed, by every access in both bodies, at one per-thread address that is
  injective in the loop index (:class:`_BodyAccesses`) — so thread *t* of the fused loop only
  ever meets its own data. Resources only read by both, or touched by one, need nothing.
  ``aggressive_kernel_fusion_raw=False`` turns this same-thread rule off (disjoint only);
* the merged body stays within ``kernel_fusion_budget`` IR statements.

Anything the analysis does not recognise (an unknown use of an array, an index it cannot
prove injective) blocks fusion. Distinct ndarray arguments are assumed not to alias.

The merge itself: B's header becomes a trampoline binding B's flat index to A's; A's body
jumps to it, B's body jumps back to A's header, A's exit is B's exit; B's pure preheader code
(its iteration space) moves before A's loop; variables private to B's body are renamed so
that typing never unifies them with A's. The pass never touches serial code other than the
hoisted preheader statements, and does nothing when fusion is off.
"""

from __future__ import annotations

import dataclasses
import operator
import sys

from ..lowering import spaces
from ..lowering import subscripts as sub_impl
from .base import MISSING, try_static
from .bounds import space_key
from .ir_builder import retarget
from .plan_tasks import does_work

# -- injective index expressions -------------------------------------------------------------------

_ADD, _SUB, _MUL = (operator.add, operator.iadd), (operator.sub, operator.isub), (operator.mul, operator.imul)
_SHL, _XOR = (operator.lshift, operator.ilshift), (operator.xor, operator.ixor)


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """The per-thread address of one access: ``key`` is a structural description in terms of
    loop-index components (comparable between the two loops, whose spaces are identical);
    ``covers`` is the set of loop-index components it is injective in, or None if it is not
    injective in anything (a constant, an opaque value, a non-injective operation)."""
    key: tuple
    covers: frozenset | None

    def text(self) -> str:
        return _render(self.key)


def _render(key) -> str:
    tag = key[0]
    if tag == "idx":
        return "ijklmn"[key[1]] if key[1] < 6 else f"i{key[1]}"
    if tag == "const":
        return repr(key[1])
    if tag == "tuple":
        return ", ".join(_render(k) for k in key[1:])
    if tag == "add":
        return f"{_render(key[1])} {'-' if key[2] < 0 else '+'} {abs(key[2])}"
    if tag in ("mul", "shl", "xor"):
        return f"{_render(key[1])} {dict(mul='*', shl='<<', xor='^')[tag]} {key[2]}"
    if tag == "rsub":
        return f"{key[1]} - {_render(key[2])}"
    if tag in ("neg", "bitnot"):
        return f"{'-' if tag == 'neg' else '~'}{_render(key[1])}"
    if tag == "nonlinear":
        return key[1]
    return "?"


def _opaque(what: str) -> Fingerprint:
    # never equal to another fingerprint: the analysis does not know the address
    return Fingerprint(("nonlinear", what, object()), None)


# -- one loop body: definitions and accesses ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Access:
    resource: int           # kernel argument index (runtime parameter or hidden field)
    kind: str               # "read" | "write" (stores, atomics, views that may be written through)
    where: Fingerprint
    what: str               # "load", "store", "atomic", "unknown use" ...


class _BodyAccesses:
    """The global accesses of one offloaded loop body, with their address fingerprints."""

    def __init__(self, state, lp, serial_defs):
        self.state, self.lp = state, lp
        ir = state.ir
        blocks = state.func_ir.blocks
        self.local = {}
        for lbl in lp.body:
            for stmt in blocks[lbl].body:
                if isinstance(stmt, ir.Assign):
                    self.local.setdefault(stmt.target.name, []).append(stmt.value)
        self.serial_defs = serial_defs
        self.space_key = space_key(state, lp.space_var)
        header = blocks[lp.header]
        self.flat = next((s.target.name for s in header.body if isinstance(s, ir.Assign)
                          and isinstance(s.value, ir.Expr) and s.value.op == "pair_first"), None)
        self.accesses: list[Access] = []
        self.statements = sum(len(blocks[lbl].body) for lbl in lp.body)
        for lbl in sorted(lp.body):
            for stmt in blocks[lbl].body:
                self._visit(stmt)

    # definitions as seen from inside the body
    def definition(self, var):
        """The value a body-local name always holds, a unique outside definition, or None."""
        name = var.name if hasattr(var, "name") else var
        local = self.local.get(name)
        if local is not None:
            return local[0] if len(local) == 1 and name not in self.serial_defs else None
        return self.state.definition(name)

    def resolve(self, var, limit=50):
        ir = self.state.ir
        for _ in range(limit):
            d = self.definition(var)
            if isinstance(d, ir.Var):
                var = d
                continue
            return var, d
        return var, None

    def int_const(self, var):
        ir = self.state.ir
        var, d = self.resolve(var)
        if isinstance(d, ir.Const):
            value = d.value
        elif var.name in self.local:
            return None
        else:
            value = try_static(self.state, var)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return None

    def resources(self, var) -> set:
        """Argument indices of the global data ``var`` may be (through copies; any definition)."""
        ir = self.state.ir
        out, todo, seen = set(), [var.name], set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for d in self.state.func_ir._definitions.get(name, ()):
                if isinstance(d, ir.Var):
                    todo.append(d.name)
                elif isinstance(d, ir.Arg) and self._is_data_arg(d):
                    out.add(d.index)
        return out

    def _is_data_arg(self, arg) -> bool:
        if self.state.hidden_by_arg_index(arg.index) is not None:
            return True
        ty = self.state.param_types.get(arg.name)
        return ty is not None and hasattr(ty, "ndim")

    def ndim_of(self, resource: int):
        field = self.state.hidden_by_arg_index(resource)
        if field is not None:
            return len(field.shape)
        return getattr(self.state.param_types.get(self.state.runtime_params[resource]), "ndim", None)

    # fingerprints
    def fingerprint(self, var, depth=0) -> Fingerprint:
        ir = self.state.ir
        c = self.int_const(var)
        if c is not None:
            return Fingerprint(("const", c), None)
        var, d = self.resolve(var)
        if depth > 30 or d is None:
            return _opaque(var.name)
        if isinstance(d, ir.Const) and d.value is None:
            return Fingerprint(("const", None), None)
        if not isinstance(d, ir.Expr):
            return _opaque(var.name)
        if d.op == "static_getitem" and isinstance(d.index, int) and self._is_space_index(d.value):
            return Fingerprint(("idx", d.index), frozenset({d.index}))
        if d.op == "call" and try_static(self.state, d.func) is sub_impl.index_vector and d.args \
                and self._is_space_index(d.args[0]):
            # the vector index of qd.grouped is the tuple of all loop indices
            ndim = self._loop_ndim()
            return Fingerprint(("tuple", *(("idx", k) for k in range(ndim))), frozenset(range(ndim)))
        if d.op == "build_tuple":
            parts = [self.fingerprint(v, depth + 1) for v in d.items]
            key = ("tuple", *(p.key for p in parts))
            if any(p.covers is None and p.key[0] != "const" for p in parts):
                return Fingerprint(key, None)
            covers = frozenset().union(*(p.covers or () for p in parts))
            return Fingerprint(key, covers or None)
        if d.op in ("binop", "inplace_binop"):
            return self._binop(d, depth)
        if d.op == "unary":
            inner = self.fingerprint(d.value, depth + 1)
            if d.fn in ("+", operator.pos):
                return inner
            tag = {"-": "neg", operator.neg: "neg", "~": "bitnot", operator.invert: "bitnot"}.get(d.fn)
            if tag is None or inner.covers is None:
                return _opaque(f"{d.fn}(...)")
            return Fingerprint((tag, inner.key), inner.covers)
        return _opaque(self._describe(d))

    def _binop(self, d, depth) -> Fingerprint:
        fn = d.fn
        lc, rc = self.int_const(d.lhs), self.int_const(d.rhs)
        text = f"{self._describe(d)}"
        if (lc is None) == (rc is None):   # both variable, or both constant (not folded: rare)
            return _opaque(text)
        const = lc if lc is not None else rc
        inner = self.fingerprint(d.rhs if lc is not None else d.lhs, depth + 1)
        if inner.covers is None:
            return _opaque(text)
        if fn in _ADD:
            return Fingerprint(("add", inner.key, const), inner.covers)
        if fn in _SUB:
            if rc is not None:
                return Fingerprint(("add", inner.key, -const), inner.covers)
            return Fingerprint(("rsub", const, inner.key), inner.covers)
        if fn in _MUL and const != 0:
            return Fingerprint(("mul", inner.key, const), inner.covers)
        if fn in _SHL and rc is not None and 0 <= const < 63:
            return Fingerprint(("shl", inner.key, const), inner.covers)
        if fn in _XOR:
            return Fingerprint(("xor", inner.key, const), inner.covers)
        return _opaque(text)

    def _describe(self, d) -> str:
        if d.op in ("binop", "inplace_binop"):
            sym = {operator.floordiv: "//", operator.mod: "%", operator.and_: "&", operator.or_: "|",
                   operator.rshift: ">>", operator.truediv: "/", operator.lt: "<", operator.gt: ">"}
            return f"(... {sym.get(d.fn, getattr(d.fn, '__name__', '?'))} ...)"
        if d.op == "call":
            fn = try_static(self.state, d.func)
            return f"{getattr(fn, '__name__', 'call')}(...)" if fn is not MISSING else "call(...)"
        if d.op in ("getitem", "static_getitem"):
            return "an indirect load"
        return d.op

    def _is_space_index(self, var) -> bool:
        ir = self.state.ir
        _, d = self.resolve(var)
        if not (isinstance(d, ir.Expr) and d.op == "call" and try_static(self.state, d.func) is spaces.space_index):
            return False
        space, flat = d.args
        flat, _ = self.resolve(flat)
        if flat.name != self.flat:
            return False
        # a fused loop's later parts index their own (identical) copy of the space
        return space.name == self.lp.space_var.name or space_key(self.state, space) == self.space_key

    def _loop_ndim(self) -> int:
        return len(self.space_key or ((),))

    def _index_arity(self, index_var):
        ir = self.state.ir
        _, d = self.resolve(index_var)
        if isinstance(d, ir.Const):
            return 0 if d.value is None else len(d.value) if isinstance(d.value, tuple) else 1
        if isinstance(d, ir.Expr):
            if d.op == "build_tuple":
                return len(d.items)
            if d.op in ("binop", "inplace_binop", "unary"):
                return 1
            if d.op == "static_getitem" and self._is_space_index(d.value):
                return 1
            if d.op == "call" and try_static(self.state, d.func) is sub_impl.index_vector:
                return self._loop_ndim()
        return None

    # accesses
    def _add(self, resource, kind, where, what):
        self.accesses.append(Access(resource, kind, where, what))

    def _visit(self, stmt):
        ir = self.state.ir
        consumed = set()          # ids of Var occurrences accounted for by a recognised access
        if isinstance(stmt, ir.Assign):
            value = stmt.value
            consumed.add(id(stmt.target))
            if isinstance(value, ir.Var):
                consumed.add(id(value))   # an alias of global data is not an access
            elif isinstance(value, ir.Expr) and value.op in ("getitem", "static_getitem"):
                res = self.resources(value.value)
                if res:
                    consumed.add(id(value.value))
                    if value.op == "getitem":
                        where, arity = self.fingerprint(value.index), self._index_arity(value.index)
                    else:
                        where = Fingerprint(("const", value.index), None)
                        arity = 0 if value.index is None else len(value.index) \
                            if isinstance(value.index, tuple) else 1
                    for r in res:
                        full = arity is not None and arity == self.ndim_of(r)
                        # a partial index yields a view that may be written through
                        self._add(r, "read" if full and len(res) == 1 else "write", where,
                                  "load" if full else "partial load")
            elif isinstance(value, ir.Expr) and value.op == "getattr" and value.attr == "shape":
                consumed.add(id(value.value))
            elif isinstance(value, ir.Expr) and value.op == "call":
                self._visit_call(value, consumed)
        elif isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            res = self.resources(stmt.target)
            if res:
                consumed.add(id(stmt.target))
                where = self.fingerprint(stmt.index) if isinstance(stmt, ir.SetItem) else \
                    Fingerprint(("const", stmt.index), None)
                for r in res:
                    self._add(r, "write", where, "store")
        for var in stmt.list_vars():
            if id(var) not in consumed:
                for r in self.resources(var):
                    self._add(r, "write", _opaque(var.name), "unknown use")

    def _visit_call(self, expr, consumed):
        fn = try_static(self.state, expr.func)
        try:
            kind = _access_callees().get(fn)
        except TypeError:      # an unhashable callee: not one of ours
            return
        if kind is None or len(expr.args) < 2:
            return
        base, index = expr.args[0], expr.args[1]
        res = self.resources(base)
        if res:
            consumed.add(id(base))
            where = self.fingerprint(index)
            arity = self._index_arity(index)
            for r in res:
                full = arity is not None and arity == self.ndim_of(r) and len(res) == 1
                self._add(r, "read" if kind == "load" and full else "write", where, kind)


def _access_callees() -> dict:
    """The compiled helpers that access global data as ``helper(base, index, ...)``: callee ->
    "load" | "store" | "atomic"."""
    table = {sub_impl.atomic_update: "atomic", sub_impl.nested_atomic: "atomic", sub_impl.write_back: "store"}
    direct = sys.modules.get("qd_numba.lowering.array_access")   # the DirectArrayAccess rewrite
    if direct is not None:
        for load in (direct.array_load, direct.checked_array_load):
            table[load] = "load"
        for store in (direct.array_store, direct.checked_array_store):
            table[store] = "store"
    return table


# -- the pass -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Candidate:
    lp: object                  # OffloadedLoop
    task: object                # Task
    sources: tuple              # (task index before fusion, loc) of each source loop


class FuseAdjacentTasks:
    name = "fuse_adjacent_tasks"

    def run(self, state) -> bool:
        cfg = state.config
        if not getattr(cfg, "aggressive_kernel_fusion", False) or len(state.loops) < 2:
            return False
        self.state = state
        self.raw = cfg.aggressive_kernel_fusion_raw
        self.budget = cfg.kernel_fusion_budget
        self.log = []
        state.refresh_definitions()
        loop_of = {lp.task_index: lp for lp in state.loops}
        merged, current = [], None
        for task in state.tasks:
            if task.kind != "range_for":
                merged.append(task)
                current = None
                continue
            cand = _Candidate(loop_of[task.index], task, ((task.index, task.loc),))
            if current is not None:
                reason = self._try_fuse(current, cand)
                if reason is None:
                    continue
                self.log.append(("kept", current.sources, cand.sources, reason))
            merged.append(cand)
            current = cand
        changed = any(len(c.sources) > 1 for c in merged if isinstance(c, _Candidate))
        if changed:
            self._renumber(merged)
        if cfg.aggressive_kernel_fusion_diag:
            self._print_diagnostics(len(loop_of), len(state.loops))
        state.refresh_definitions()
        return changed

    # -- decision ----------------------------------------------------------------------------------
    def _try_fuse(self, a: _Candidate, b: _Candidate):
        """Fuse b into a (mutating the IR and a) and return None, or return why not."""
        state = self.state
        if a.task.serialize or b.task.serialize:
            return "a loop is qd.loop_config(serialize=True)"
        if a.task.stream_group != b.task.stream_group:
            return "different qd.stream_parallel groups"
        ka, kb = a.task.bounds.dims, b.task.bounds.dims
        if ka is None or kb is None or ka != kb:
            return f"launch bounds differ or are unknown: {a.task.bounds} vs {b.task.bounds}"
        between = self._between(a.lp, b.lp)
        if isinstance(between, str):
            return between
        serial_defs = self._serial_defs({a.lp.header, b.lp.header})
        acc_a, acc_b = _BodyAccesses(state, a.lp, serial_defs), _BodyAccesses(state, b.lp, serial_defs)
        if acc_a.statements + acc_b.statements > self.budget:
            return (f"cost: the merged body would have {acc_a.statements + acc_b.statements} IR statements, "
                    f"over the budget of {self.budget}")
        reason = self._locals_conflict(a.lp, b.lp, between, serial_defs)
        if reason:
            return reason
        verdict = self._resources_verdict(acc_a, acc_b)
        if verdict.startswith("reject:"):
            return verdict[len("reject: "):]
        self._merge(a, b, between, serial_defs)
        self.log.append(("fused", a.sources, b.sources, verdict))
        a.sources = a.sources + b.sources
        return None

    def _resources_verdict(self, acc_a, acc_b) -> str:
        by_a, by_b = {}, {}
        for acc in acc_a.accesses:
            by_a.setdefault(acc.resource, []).append(acc)
        for acc in acc_b.accesses:
            by_b.setdefault(acc.resource, []).append(acc)
        same_thread = []
        for r in sorted(set(by_a) & set(by_b)):
            both = by_a[r] + by_b[r]
            if all(acc.kind == "read" for acc in both):
                continue
            name = self._resource_name(r)
            if not self.raw:
                return f"reject: both touch {name} and one writes it (same-thread rule off: " \
                       "aggressive_kernel_fusion_raw=False)"
            bad = next((acc for acc in both if acc.where.covers is None), None)
            if bad is not None:
                return f"reject: {name}[{bad.where.text()}] ({bad.what}) is not injective in the loop index"
            ndim = acc_a._loop_ndim()
            partial = next((acc for acc in both if acc.where.covers != frozenset(range(ndim))), None)
            if partial is not None:
                return f"reject: {name}[{partial.where.text()}] does not depend on every loop index"
            keys = {acc.where.key for acc in both}
            if len(keys) > 1:
                texts = sorted({acc.where.text() for acc in both})
                return f"reject: {name} is accessed at different addresses ({' vs '.join(texts)})"
            same_thread.append(name)
        if same_thread:
            return "same-thread read-after-write on " + ", ".join(same_thread)
        return "disjoint resources"

    def _resource_name(self, r: int) -> str:
        field = self.state.hidden_by_arg_index(r)
        if field is not None:
            return getattr(field, "name", None) or f"field#{r - len(self.state.runtime_params)}"
        return f"'{self.state.runtime_params[r]}'"

    def _between(self, a_lp, b_lp):
        """The blocks from A's exit to B's preheader (inclusive) if they form a straight line of
        pure code that nothing else enters, else a reason."""
        ir = self.state.ir
        blocks = self.state.func_ir.blocks
        cfg = self.state.tools.analysis.compute_cfg_from_blocks(blocks)
        chain, lbl, prev = [], a_lp.exit, a_lp.header
        while True:
            preds = {p for p, _ in cfg.predecessors(lbl)}
            if preds != {prev}:
                return "control flow joins between the loops"
            chain.append(lbl)
            loop_setup = {id(s) for s in (*b_lp.plumbing, *b_lp.setup)}
            if any(id(s) not in loop_setup and does_work(self.state, s) for s in blocks[lbl].body):
                return "serial code between the loops does work"
            if lbl == b_lp.preheader:
                return chain
            term = blocks[lbl].body[-1]
            if not isinstance(term, ir.Jump) or len(chain) > 64:
                return "control flow between the loops"
            prev, lbl = lbl, term.target

    def _serial_defs(self, headers) -> set:
        ir = self.state.ir
        in_loops = set().union(*(lp.body for lp in self.state.loops))
        out = set()
        for lbl, block in self.state.func_ir.blocks.items():
            if lbl not in in_loops:
                out.update(s.target.name for s in block.body if isinstance(s, ir.Assign))
        return out

    def _locals_conflict(self, a_lp, b_lp, between, serial_defs):
        """Why values of one body's locals could leak into the other once they share a thread."""
        uses_a, defs_a = _uses_defs(self.state, a_lp.body)
        uses_b, defs_b = _uses_defs(self.state, b_lp.body)
        ir = self.state.ir
        plumbing = {id(s) for s in b_lp.plumbing}
        hoisted = {s.target.name for lbl in between for s in self.state.func_ir.blocks[lbl].body
                   if isinstance(s, ir.Assign) and id(s) not in plumbing}
        clash = hoisted & (uses_a | defs_a)
        if clash:
            return f"code between the loops rebinds '{sorted(clash)[0]}', which the first loop uses"
        clash = (defs_b & serial_defs & (uses_a | defs_a)) | (defs_a & serial_defs & uses_b)
        if clash:
            return f"local '{sorted(clash)[0]}' is assigned in one loop and read from outside in the other"
        return None

    # -- the merge ------------------------------------------------------------------------------------
    def _merge(self, a: _Candidate, b: _Candidate, between, serial_defs):
        state = self.state
        ir = state.ir
        blocks = state.func_ir.blocks
        a_lp, b_lp = a.lp, b.lp
        a_header, b_header = blocks[a_lp.header], blocks[b_lp.header]
        a_flat = next(s.target for s in a_header.body if isinstance(s, ir.Assign)
                      and isinstance(s.value, ir.Expr) and s.value.op == "pair_first")
        # B's private locals get fresh names, so typing never unifies them with A's
        _, defs_b = _uses_defs(state, b_lp.body)
        taken = _all_names(state)
        renames = {}
        for name in sorted(defs_b - serial_defs):
            k = 1
            while f"{name}.f{k}" in taken:
                k += 1
            renames[name] = f"{name}.f{k}"
            taken.add(renames[name])
        # B's header becomes a trampoline: B's flat index is A's
        term = b_header.body[-1]
        new_body = []
        for stmt in b_header.body[:-1]:
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr):
                if stmt.value.op == "pair_first":
                    new_body.append(ir.Assign(a_flat, stmt.target, stmt.loc))
                    continue
                if stmt.value.op in ("iternext", "pair_second"):
                    continue
            new_body.append(stmt)
        b_body_entry = term.truebr if term.truebr in b_lp.body else term.falsebr
        b_header.body = new_body + [ir.Jump(b_body_entry, term.loc)]
        state.tools.ir_utils.replace_var_names({lbl: blocks[lbl] for lbl in b_lp.body}, renames)
        # control flow: A's back edges -> B's header; B's back edges -> A's header; A exits to B's exit
        for lbl in a_lp.body - {a_lp.header}:
            retarget(ir, blocks[lbl], {a_lp.header: b_lp.header})
        for lbl in b_lp.body - {b_lp.header}:
            retarget(ir, blocks[lbl], {b_lp.header: a_lp.header})
        retarget(ir, a_header, {a_lp.exit: b_lp.exit})
        # B's preheader code (its iteration space, pure serial values) moves before A's loop
        plumbing = {id(s) for s in b_lp.plumbing}
        hoisted = [s for lbl in between for s in blocks[lbl].body[:-1] if id(s) not in plumbing]
        pre = blocks[a_lp.preheader]
        first_plumbing = next(k for k, s in enumerate(pre.body) if id(s) in {id(p) for p in a_lp.plumbing})
        pre.body[first_plumbing:first_plumbing] = hoisted
        for lbl in between:
            del blocks[lbl]
        a_lp.body |= b_lp.body
        a_lp.exit = b_lp.exit
        a_lp.setup = list(a_lp.setup) + hoisted
        state.loops.remove(b_lp)
        state.refresh_definitions()

    def _renumber(self, merged):
        state = self.state
        tasks = []
        for index, item in enumerate(merged):
            if isinstance(item, _Candidate):
                lp = item.lp
                lp.task_index = index
                fused_from = tuple(loc for _, loc in item.sources) if len(item.sources) > 1 else ()
                tasks.append(item.task.renumbered(index, header=lp.header, body=frozenset(lp.body),
                                                  fused_from=fused_from))
            else:
                tasks.append(item.renumbered(index))
        state.tasks = tasks

    def _print_diagnostics(self, before: int, after: int):
        lines = [f"[qd fusion] kernel '{self.state.kernel_name}': {before} range-for tasks -> {after}"]
        for verdict, left, right, reason in self.log:
            lt = "+".join(str(i) for i, _ in left)
            rt = "+".join(str(i) for i, _ in right)
            if verdict == "fused":
                lines.append(f"  fused   {lt} with {rt} ({reason})")
            else:
                lines.append(f"  kept    {lt} | {rt} apart: {reason}")
        print("\n".join(lines), file=sys.stderr)


def _uses_defs(state, labels):
    ir = state.ir
    uses, defs = set(), set()
    for lbl in labels:
        for stmt in state.func_ir.blocks[lbl].body:
            if isinstance(stmt, ir.Assign):
                defs.add(stmt.target.name)
            uses.update(v.name for v in stmt.list_vars()
                        if not (isinstance(stmt, ir.Assign) and v is stmt.target))
    return uses, defs


def _all_names(state) -> set:
    names = set()
    for block in state.func_ir.blocks.values():
        for stmt in block.body:
            names.update(v.name for v in stmt.list_vars())
    return names
