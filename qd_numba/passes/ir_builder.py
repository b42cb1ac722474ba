"""Small shared pieces for reading and building Numba IR: one table of expression traits,
block successors, jump retargeting, call emission.

Every pass and task splitter uses these instead of its own copy. All functions take the IR
module (``state.ir``: Numba's or numba-cuda's copy) so they work on either flavour.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class OpTraits:
    removable: bool     # no side effect: an assignment of it that nobody reads may be dropped
    recomputable: bool  # a deterministic function of its operands: another task may recompute it
    work: bool          # has an effect a serial task must carry out (else it is evaluated where needed)


EXPR_OPS = {
    "getattr":        OpTraits(removable=True, recomputable=True, work=False),
    "static_getitem": OpTraits(removable=True, recomputable=True, work=False),  # of global data: a load (work)
    "build_tuple":    OpTraits(removable=True, recomputable=True, work=False),
    "cast":           OpTraits(removable=True, recomputable=True, work=False),
    "build_list":     OpTraits(removable=True, recomputable=False, work=True),   # allocates
    "build_map":      OpTraits(removable=True, recomputable=False, work=True),
    "binop":          OpTraits(removable=False, recomputable=True, work=False),  # may raise: kept when dead
    "unary":          OpTraits(removable=False, recomputable=True, work=False),
    "exhaust_iter":   OpTraits(removable=False, recomputable=False, work=False),
    "pair_first":     OpTraits(removable=False, recomputable=False, work=False),
    "pair_second":    OpTraits(removable=False, recomputable=False, work=False),
    "phi":            OpTraits(removable=False, recomputable=False, work=False),
}
"""Traits of ``ir.Expr`` ops; an op not listed (``call``, ``getitem``, ``getiter``, ...) has
:data:`OTHER_OP`. Calls and item loads are refined by the caller (pure builtins, global data)."""

OTHER_OP = OpTraits(removable=False, recomputable=False, work=True)


def op_traits(op: str) -> OpTraits:
    return EXPR_OPS.get(op, OTHER_OP)


def successors(ir, block) -> list[int]:
    """Labels ``block``'s terminator jumps to."""
    term = block.body[-1]
    if isinstance(term, ir.Jump):
        return [term.target]
    if isinstance(term, ir.Branch):
        return [term.truebr, term.falsebr]
    return []


def retarget(ir, block, new_target) -> None:
    """Rewrite the jump targets of ``block``'s terminator: ``new_target`` is a function
    ``label -> label`` or a mapping (labels it lacks stay)."""
    fn = new_target if callable(new_target) else (lambda t: new_target.get(t, t))
    term = block.body[-1]
    if isinstance(term, ir.Jump):
        block.body[-1] = ir.Jump(fn(term.target), term.loc)
    elif isinstance(term, ir.Branch):
        block.body[-1] = ir.Branch(term.cond, fn(term.truebr), fn(term.falsebr), term.loc)


def emit_call(ir, fn, args, target, loc, fn_var) -> list:
    """``fn_var = global(fn); target = fn_var(*args)`` as two statements."""
    return [ir.Assign(ir.Global(fn.__name__, fn, loc), fn_var, loc),
            ir.Assign(ir.Expr.call(fn_var, list(args), (), loc), target, loc)]
