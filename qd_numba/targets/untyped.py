"""The compile set-up every target starts from: a kernel's IR through the untyped pipeline.

Kept apart from targets/base.py, which Python-scope modules (fields) import: this module
imports the passes.
"""

from __future__ import annotations

import contextlib
import gc
import threading

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
                         returns_value=kernel.return_type is not None, return_type=kernel.return_type,
                         random_state=random_state.state_field,
                         autodiff_mode=kernel.autodiff_mode, graph=bool(getattr(kernel, "graph", False)))
    take_pending()
    with profiler.stage("untyped passes"):
        run_untyped_pipeline(state, codegen_stages=codegen_stages)
    return state


_gc_lock = threading.Lock()
_gc_holders = 0              # compiles running now (threads, nested compile checks)
_gc_was_enabled = False      # whether the first of them found the collector on


@contextlib.contextmanager
def gc_paused():
    """No automatic garbage collection while a kernel compiles (CPU and CUDA compiles wrap
    themselves in this). A compile allocates hundreds of thousands of IR objects, so the
    collector otherwise runs full collections of the whole heap in the middle of it (10-14% of a
    K=32 compile, docs/compile_time.md); what the compile left behind is collected afterwards,
    as usual. Nested and concurrent compiles count: the collector comes back on when the last
    one ends, and only if it was on before the first began."""
    global _gc_holders, _gc_was_enabled
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()
