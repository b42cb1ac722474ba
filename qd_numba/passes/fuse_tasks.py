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
import sys

from .accesses import BodyAccesses, resource_name, serial_definitions
from .ir_builder import retarget
from .plan_tasks import does_work

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
        serial_defs = serial_definitions(state)
        acc_a, acc_b = BodyAccesses(state, a.lp, serial_defs), BodyAccesses(state, b.lp, serial_defs)
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
        name = resource_name(self.state, r)
        return name if self.state.hidden_by_arg_index(r) is not None else f"'{name}'"

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
