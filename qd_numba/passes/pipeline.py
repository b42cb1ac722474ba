"""The untyped pipeline as data: named stages, each an ordered tuple of passes.

``UNTYPED_PIPELINE`` is what every target runs on a kernel's IR before it splits the tasks
into target code; a target adds its own codegen stages (``Target.codegen_stages``) for
:func:`describe`. ``QD_DUMP_IR=1`` prints the description at each compile, then the IR after
every pass that changed it. The verifier (passes/verify.py) runs after every pass.
"""

from __future__ import annotations

import dataclasses
import sys

from ..errors import QuadrantsCompilationError
from .ad_validation import RecordReads
from .array_access import DirectArrayAccess
from .asserts import RewriteAsserts
from .autodiff import ReverseMode
from .base import dump_ir
from .bind_arguments import BindArguments
from .cfg_optimize import CfgOptimize
from .check_writes import CheckArgumentWrites, CheckReadonlyWrites
from .dead_code import RemoveDeadPure
from .fold_static import FoldStatic
from .forward_mode import ForwardMode
from .fuse_tasks import FuseAdjacentTasks
from .inline_funcs import InlineFuncs
from .offload import Offload
from .plan_tasks import PlanTasks
from .random_streams import BindRandomStreams
from .reductions import ReduceAtomics
from .resolve_globals import CheckGlobals, ResolveGlobals
from .return_rules import ReturnRules
from .rewrite_subscripts import RewriteSubscripts
from .sparse import RewriteSparse
from .stream_blocks import MarkStreamBlocks, TagSerialStreamGroups
from .structs import RewriteStructs
from .verify import verify_final, verify_ir
from .weak_literals import WeakFloatLiterals

MAX_FIXED_POINT_ROUNDS = 64


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    passes: tuple                 # pass classes, run in order
    fixed_point: bool = False     # repeat the stage until no pass changes the IR

    def describe(self) -> str:
        names = ", ".join(p.name for p in self.passes)
        return f"{self.name}: {names}" + (" (to a fixed point)" if self.fixed_point else "")


UNTYPED_PIPELINE = (
    Stage("bind", (BindArguments,)),
    Stage("compile-time evaluation", (RewriteStructs, ResolveGlobals, InlineFuncs, RewriteAsserts, FoldStatic,
                                      RemoveDeadPure), fixed_point=True),
    Stage("rewrites", (MarkStreamBlocks, CheckGlobals, ReturnRules, CheckArgumentWrites, RewriteSparse,
                       RewriteSubscripts, CheckReadonlyWrites, DirectArrayAccess, WeakFloatLiterals, ResolveGlobals,
                       RemoveDeadPure)),
    Stage("tasks", (Offload, BindRandomStreams, FuseAdjacentTasks, ReduceAtomics, PlanTasks, TagSerialStreamGroups,
                    CfgOptimize)),
    Stage("autodiff", (ReverseMode, ForwardMode, RecordReads)),
)


def describe(stages=UNTYPED_PIPELINE, codegen_stages=()) -> str:
    """The pipeline, one line per stage (the codegen stages are the target's, as text)."""
    lines = [f"  {k}. {stage.describe()}" for k, stage in enumerate(stages, 1)]
    lines += [f"  {k}. {text}" for k, text in enumerate(codegen_stages, len(stages) + 1)]
    return "\n".join(lines)


def run_untyped_pipeline(state, stages=UNTYPED_PIPELINE, codegen_stages=()) -> None:
    """Run ``stages`` on ``state``; the IR is verified after every pass and in full at the end."""
    if state.config.print_ir:
        print(f"=== qd_numba pipeline of kernel '{state.kernel_name}' ===\n{describe(stages, codegen_stages)}",
              file=sys.stderr)
    for stage in stages:
        if not stage.fixed_point:
            for pass_class in stage.passes:
                _run_pass(state, pass_class())
            continue
        for _ in range(MAX_FIXED_POINT_ROUNDS):
            changed = False
            for pass_class in stage.passes:
                changed |= _run_pass(state, pass_class())
            if not changed:
                break
        else:
            raise state.error(QuadrantsCompilationError, f"{stage.name} did not converge")
    verify_final(state, "the untyped pipeline")


def _run_pass(state, p) -> bool:
    changed = p.run(state)
    verify_ir(state, p.name)
    if changed:
        dump_ir(state, p.name)
    return bool(changed)
