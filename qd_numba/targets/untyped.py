"""The compile set-up every target starts from: a kernel's IR through the untyped pipeline.

Kept apart from targets/base.py, which Python-scope modules (fields) import: this module
imports the passes.
"""

from __future__ import annotations

from .. import config, profiler, random_state
from ..errors import take_pending
from ..passes.base import CompileState, copy_ir
from ..passes.pipeline import run_untyped_pipeline


def untyped_compile(kernel, tools, param_types: dict, templates: dict, codegen_stages=()):
    """The kernel's IR after the untyped pipeline, on ``tools``' IR flavour: the one compile
    set-up every target starts from. Returns the CompileState (its ``tasks`` and ``task_plan``
    say what to build)."""
    cfg = config.current.for_kernel(fuse=kernel.fuse, graph=kernel.graph)
    with profiler.stage("frontend"):
        func_ir = copy_ir(tools.ir, kernel.frontend_ir(tools))
    state = CompileState(tools=tools, func_ir=func_ir, kernel_name=kernel.name, config=cfg,
                         runtime_params=[p.name for p in kernel.params if p.kind != "template"],
                         param_types=param_types, template_values=templates, kernel_qualname=kernel.qualname,
                         returns_value=kernel.return_type is not None, random_state=random_state.state_field,
                         autodiff_mode=kernel.autodiff_mode)
    take_pending()
    with profiler.stage("untyped passes"):
        run_untyped_pipeline(state, codegen_stages=codegen_stages)
    return state
