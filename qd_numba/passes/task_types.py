"""Typed Tasks: type inference once per kernel instance and target, its types handed to every Task.

Input: the kernel IR after PlanTasks (``state.task_plan``), the Numba types of the kernel's
arguments (runtime parameters, then the hidden field arguments) and a target's compiler object
(its typing context, flags, pipeline): the target's own ``Compiler`` built for those arguments.

What it does: the targets type the pieces they lower anyway — the CPU its driver and task
functions, CUDA its task kernels (in program order, a value crossing tasks typed where it is
stored) — and hand those typed pieces to :class:`TaskTyper`, so a kernel is typed once.
:func:`type_tasks` instead runs Numba's untyped pipeline and type inference of a compiler — the
same passes a task function goes through before it is lowered, SSA included — once on a copy of
the whole kernel IR: the reference the tests compare the targets' types with. The typemap is then cut per unit:
``unit.types`` (and ``unit.task.types``) maps every
variable of the unit's blocks, its live-ins, the values it loads or recomputes and its live-outs to
its Numba type (literals widened, as a value stored to a temporary or passed to a task is). A name
that SSA split into versions of one type gets that type; versions of different types in one unit
(a name reused for other values) are unified, and left out where they do not unify.

Output: ``state.task_plan.units[k].types``, ``state.tasks`` with ``types`` set, and
``state.task_plan.return_type`` (the kernel's inferred return type, or None). Never changes the
kernel IR (it types a copy).
"""

from __future__ import annotations

import dataclasses
import importlib

from .base import copy_ir, derive_ir, exec_stub


def kernel_params(state) -> list[str]:
    """The parameters of the kernel as compiled: its runtime parameters, then one per hidden
    field argument (``state.hidden``, in order)."""
    return list(state.runtime_params) + [f"__qd_field_{k}" for k in range(len(state.hidden))]


def whole_kernel_ir(state, name: str, stable_id: int | None = None):
    """A FunctionIR over the kernel IR's blocks (shared, not copied) taking :func:`kernel_params`."""
    params = kernel_params(state)
    return derive_ir(state, exec_stub(name, params), dict(state.func_ir.blocks), params, stable_id=stable_id)


def type_tasks(state, compiler) -> None:
    """Type the kernel once with ``compiler`` (a target's Numba compiler object, not yet run)
    and give each planned unit its types."""
    typer = TaskTyper(state)
    typed_ir, typemap, return_type = _infer(state, compiler)
    typer.assign([TypedPiece(typed_ir.blocks, typemap)], return_type, compiler.state.typingctx)


@dataclasses.dataclass
class TypedPiece:
    """Typed IR covering part of the kernel: its blocks, its typemap, and the kernel label of each
    block label (None: the labels are the kernel's; a block mapped to no kernel label is skipped)."""

    blocks: dict
    typemap: dict
    kernel_label: dict | None = None


class TaskTyper:
    """Gives each planned unit the types its variables have in typed IR that together covers the
    kernel: the whole kernel typed once (:func:`type_tasks`), or a target's driver and task
    functions as it typed them to lower them (the CPU). Built from the kernel IR as planned, so
    the target may rewrite that IR before :meth:`assign`."""

    def __init__(self, state):
        self.state = state
        self.names, self.origin = _origins(state)
        self.assigned_in = {}   # kernel variable -> labels assigning it
        for label, block in state.func_ir.blocks.items():
            for stmt in block.body:
                if isinstance(stmt, state.ir.Assign):
                    self.assigned_in.setdefault(stmt.target.name, set()).add(label)

    def label_types(self, piece: TypedPiece) -> dict:
        """``kernel label -> kernel variable -> set of types`` of the versions of each kernel
        variable in ``piece``'s blocks (literals widened): what :meth:`assign` takes from a piece.
        Plain data, so a worker process that typed the piece can send it (targets/cuda/fork_lowering.py)."""
        by_label: dict = {}
        for label, block in piece.blocks.items():
            if piece.kernel_label is not None:
                label = piece.kernel_label.get(label)
                if label is None:
                    continue
            found = by_label.setdefault(label, {})
            for stmt in block.body:
                for var in stmt.list_vars():
                    ty = piece.typemap.get(var.name)
                    name = self.origin(var.name)
                    if ty is not None and name in self.names:   # not a variable the target added
                        found.setdefault(name, set()).add(_widen(ty))
        return by_label

    def assign(self, pieces, return_type, typingctx) -> None:
        """Set every unit's ``types``, ``state.tasks`` and the plan's return type from ``pieces``
        (each a :class:`TypedPiece` or its :meth:`label_types`) and the kernel's inferred
        ``return_type``."""
        by_label = {}   # label -> kernel variable -> set of types of its versions there
        for piece in pieces:
            for label, found in (piece if isinstance(piece, dict) else self.label_types(piece)).items():
                into = by_label.setdefault(label, {})
                for name, tys in found.items():
                    into.setdefault(name, set()).update(tys)
        plan = self.state.task_plan
        for unit in plan.units:
            found = {}
            for label in unit.labels:
                for name, tys in by_label.get(label, {}).items():
                    found.setdefault(name, set()).update(tys)
            outside = set(unit.live_ins) | set(unit.loads) | set(unit.stores) | \
                {s.target.name for s in unit.recompute}
            if unit.kind == "range_for":
                outside.add(unit.loop.total_var.name)
            for name in outside - found.keys():
                for label in self.assigned_in.get(name, ()):
                    found.setdefault(name, set()).update(by_label.get(label, {}).get(name, ()))
            unit.types = {}
            for name, tys in sorted(found.items()):
                if not tys:     # typed nowhere: left out
                    continue
                ty = typingctx.unify_types(*tys) if len(tys) > 1 else next(iter(tys))
                if ty is not None:
                    unit.types[name] = ty
            unit.task = dataclasses.replace(unit.task, types=unit.types)
        plan.return_type = None if return_type is None else _widen(return_type)
        self.state.tasks = [unit.task for unit in plan.units]


def _infer(state, compiler):
    """(typed copy of the kernel IR, its typemap, its return type) from the compiler's own
    untyped pipeline and type inference, stopped there (no lowering)."""
    flavour = state.tools.flavour       # numba.core or numba.cuda.core
    untyped_passes = importlib.import_module(f"{flavour}.untyped_passes")
    compiler_lock = importlib.import_module(f"{flavour}.compiler_lock")
    func_ir = copy_ir(state.ir, whole_kernel_ir(state, "qd_kernel"))
    cstate = compiler.state
    cstate.func_id, cstate.lifted, cstate.lifted_from = func_ir.func_id, (), None
    cstate.func_ir, cstate.nargs = func_ir, func_ir.arg_count
    (full,) = compiler.define_pipelines()   # with func_ir set: no bytecode translation
    names = [impl.__name__ for impl, _ in full.passes]
    pm = type(full)("qd_typing")
    pm.passes.extend(full.passes[:names.index("NopythonTypeInference") + 1])
    pm.finalize()
    with compiler_lock.global_compiler_lock:
        untyped_passes.FixupArgs().run_pass(cstate)
        pm.run(cstate)
    return cstate.func_ir, cstate.typemap, cstate.return_type


def _origins(state):
    """(the kernel IR's variable names, ``name -> the kernel IR variable it is a version of``): SSA
    names a new version of ``x`` ``x.<n>`` (a fresh name in the typed copy's scope), so the
    kernel's own name is found by stripping suffixes until a name of the kernel IR remains."""
    names = {var.name for block in state.func_ir.blocks.values() for stmt in block.body
             for var in stmt.list_vars()}
    memo = {}

    def origin(name):
        if name in memo:
            return memo[name]
        base = name
        while base not in names and "." in base:
            base = base.rsplit(".", 1)[0]
        memo[name] = base if base in names else name
        return memo[name]

    return names, origin


def _widen(ty):
    from numba.core import types

    return types.unliteral(ty)
