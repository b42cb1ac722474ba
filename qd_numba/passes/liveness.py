"""Live variables of a kernel's IR in time linear in the IR: what Numba's
``numba.core.analysis.compute_live_map`` computes, asked for the names a caller needs.

Input: the blocks of a FunctionIR (never modified). :class:`Liveness` answers "which of these
names are live at the entry of this block" (:meth:`Liveness.live_at`), with Numba's definition:
a name is live at a block when some path from it reaches a use before a redefinition, *and* a
definition or use of the name lies in the block or an ancestor of it (Numba's ``def_reach``).

Why not Numba's function: its ``def_reach`` sets hold every name touched in any ancestor, and
its live sets every name live anywhere below, so a kernel of K loops, each over its own fields,
builds K² entries (fields are hidden arguments, assigned in the entry block and read in their
loop only): Offload, PlanTasks and the CPU driver each paid that per compile. Here a *pinned*
name — assigned once, in the entry block, which nothing jumps back to: arguments, the hidden
field arguments — is never propagated: it is live at every block from which one of its uses can
be reached, which is what a caller asking about names used in a region reachable from the block
already knows. The other names get standard backward liveness, intersected with "reached by a
definition or use" computed forward over the live sets only (x live at b and not touched in b
is live out of every predecessor, so the intersection never needs the full ``def_reach``).
"""

from __future__ import annotations

from .ir_builder import successors


class Liveness:
    """Live names at block entries of ``blocks`` (label -> Block), Numba's definition."""

    def __init__(self, analysis, ir, blocks):
        usedefs = analysis.compute_use_defs(blocks)
        self.use, self.defs = usedefs.usemap, usedefs.defmap
        entry = min(blocks)
        succs = {lbl: [s for s in successors(ir, blk) if s in blocks] for lbl, blk in blocks.items()}
        preds = {lbl: [] for lbl in blocks}
        for lbl, targets in succs.items():
            for s in targets:
                preds[s].append(lbl)
        self.order = _reverse_postorder(entry, succs)
        self.reachable = set(self.order)
        self.entry = entry
        self.pinned = _pinned(ir, blocks, entry, preds, self.use)
        self.live = self._solve(succs, preds)

    def live_at(self, label, names) -> set:
        """The names among ``names`` live at the entry of block ``label``. A pinned name (see the
        module docstring) counts as live at any block but the entry: pass only names used in
        blocks reachable from ``label`` (a loop body from its header, a region from its start)."""
        names = set(names)
        if label not in self.reachable:        # Numba: only the block's own upward-exposed uses
            return names & self.use.get(label, set())
        pinned = names & self.pinned if label != self.entry else set()
        return (names & self.live[label]) | pinned

    def _solve(self, succs, preds) -> dict:
        order, pinned = self.order, self.pinned
        use = {lbl: self.use[lbl] - pinned for lbl in order}
        live_in = {lbl: set(use[lbl]) for lbl in order}
        live_out = {lbl: set() for lbl in order}
        changed = True
        while changed:                          # backward, reverse postorder: ~2 rounds
            changed = False
            for lbl in reversed(order):
                out = live_out[lbl]
                for s in succs[lbl]:
                    out |= live_in[s]
                new = use[lbl] | (out - self.defs[lbl])
                if len(new) != len(live_in[lbl]):
                    live_in[lbl] = new
                    changed = True
        # reached[b]: names live out of b that a definition or use in b or an ancestor reaches
        touched = {lbl: use[lbl] | self.defs[lbl] for lbl in order}
        reached = {lbl: set() for lbl in order}
        changed = True
        while changed:                          # forward: ~2 rounds
            changed = False
            for lbl in order:
                incoming = set(touched[lbl])
                for p in preds[lbl]:
                    if p in reached:
                        incoming |= reached[p]
                new = live_out[lbl] & incoming
                if len(new) != len(reached[lbl]):
                    reached[lbl] = new
                    changed = True
        live = {}
        for lbl in order:
            incoming = set(touched[lbl])
            for p in preds[lbl]:
                if p in reached:
                    incoming |= reached[p]
            live[lbl] = live_in[lbl] & incoming
        return live


def _reverse_postorder(entry, succs) -> list:
    seen, post = {entry}, []
    stack = [(entry, iter(succs[entry]))]
    while stack:
        lbl, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            stack.pop()
            post.append(lbl)
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(succs[nxt])))
    post.reverse()
    return post


def _pinned(ir, blocks, entry, preds, use) -> set:
    """Names assigned exactly once, in the entry block, not read there before (the entry block
    must have no predecessor: a jump back to it would redefine them)."""
    if preds[entry]:
        return set()
    count, in_entry = {}, set()
    for lbl, block in blocks.items():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign):
                name = stmt.target.name
                count[name] = count.get(name, 0) + 1
                if lbl == entry:
                    in_entry.add(name)
    return {name for name in in_entry if count[name] == 1} - use[entry]
