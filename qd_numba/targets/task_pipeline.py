"""The Numba pipeline of a task function: Numba's own, with four passes that rarely have work in a
task run only when their trigger is in its IR.

A kernel of K loops is K Numba compiles (one per task function or task kernel), so every pass of
Numba's pipeline runs K times. Four of them scan the whole IR, and run Numba's post-processing
over it, to find constructs that task IRs seldom hold; :func:`gate` replaces each by a pass that
first looks for its trigger (one walk over the statements) and runs the original only when it is
there, so the compile is the same whenever the pass could change anything:

* ``with_lifting``: a ``with`` block;
* ``inline_closure_likes``: a closure (``make_function``), a list display (an array
  comprehension), ``functools.reduce`` or a stencil; without one only what it does after
  inlining runs (Numba's post-processing and ``fixup_var_define_in_scope``: later passes rely on
  the CFG it canonicalises);
* ``make_function_op_code_to_jit_function``: a ``make_function``;
* ``nopython_rewrites`` (after typing): a value typed as an array or a string literal (array
  expressions, string-literal subscripts, arrays of constants); without one, the post-processing
  only.

Numba's post-processing runs after every pass that changes the CFG and inside several passes
(about seven times per task); besides canonicalising the CFG it computes, eagerly, the variables
live on entry to each block, which only object-mode lowering and generators read. While a gated
pipeline runs (on its thread) that mapping is computed when first read instead
(:func:`_install_lean_post_processing`): the rest of the post-processing is unchanged, as is
every result.

Numba's compile flags (a ``TargetConfig``) compute all their ~50 options, one property each,
whenever they are hashed or compared: the overload templates key their cache by the flags in force
(``_get_impl``, about 18 times per task, each a hash and a comparison) and the pass manager renders
them for every pass's event. :func:`lean_flags` is the flags class whose values are computed once
per set of explicitly set options and whose comparison with a flags object of the same class and
the same explicit options is immediate; hashes and comparisons give what Numba's give.

Numba resolves a call (an operator, a function, an intrinsic) by trying the callee's templates in
order, each for literal and non-literal arguments, until one gives a signature: ~7 template
applications per operator, and lowering resolves every binary operator again. While a gated
pipeline runs, :func:`_install_call_memo` remembers which template resolved a callee for given
argument types (and target and flags) and applies that template alone the next time: its
``apply`` still runs (an overload or an intrinsic refreshes what its lowering reads), only the
templates that failed before are skipped. A call the memo cannot resolve takes Numba's path,
errors included. Looking up a lowering implementation, Numba reads the implementation's Python
signature (whether it takes ``loc``) every time: :func:`_install_loc_memo` keeps the answers.

``QD_TASK_PIPELINE=full`` (``qd.init(task_pipeline="full")``) runs Numba's pipeline unchanged
(the differential check: tests/test_task_pipeline.py compiles programs both ways).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading

from .. import config


def _walk(func_ir):
    for block in func_ir.blocks.values():
        yield from block.body


def _values(func_ir):
    """The right-hand sides of the IR's assignments."""
    for stmt in _walk(func_ir):
        value = getattr(stmt, "value", None)
        if value is not None and type(stmt).__name__ == "Assign":
            yield stmt, value


def _has_with(state) -> bool:
    return any(type(stmt).__name__ == "EnterWith" for stmt in _walk(state.func_ir))


def _has_closure_like(state) -> bool:
    from numba.stencils.stencil import StencilFunc

    for _stmt, value in _values(state.func_ir):
        op = getattr(value, "op", None)
        if op in ("make_function", "build_list"):
            return True
        if type(value).__name__ in ("Global", "FreeVar"):
            target = value.value
            if isinstance(target, StencilFunc) or getattr(target, "__name__", None) == "reduce":
                return True
    return False


def _has_make_function(state) -> bool:
    return any(getattr(value, "op", None) == "make_function" for _stmt, value in _values(state.func_ir))


def _has_array_or_string_literal(state) -> bool:
    from numba.core import types

    return any(isinstance(ty, (types.Array, types.StringLiteral)) for ty in state.typemap.values())


def _post_process(flavour: str, state) -> None:
    """What ``inline_closure_likes`` and ``nopython_rewrites`` do to an IR they change nothing
    in: Numba's post-processing (the CFG canonicalised, variable lifetimes) and the scope
    fix-up."""
    importlib.import_module(f"{flavour}.postproc").PostProcessor(state.func_ir).run()
    importlib.import_module(f"{flavour}.ir_utils").fixup_var_define_in_scope(state.func_ir.blocks)


# pass name -> (trigger, what runs without it, or None)
_GATES = {
    "with_lifting": (_has_with, None),
    "inline_closure_likes": (_has_closure_like, _post_process),
    "make_function_op_code_to_jit_function": (_has_make_function, None),
    "nopython_rewrites": (_has_array_or_string_literal, _post_process),
}


@functools.cache
def _gated_pass(base, flavour: str):
    """``base`` (a pass class of ``flavour``: numba.core or numba.cuda.core) run only when its
    trigger is in the IR; registered with the flavour's pass registry under its own name."""
    machinery = importlib.import_module(f"{flavour}.compiler_machinery")
    info = machinery._pass_registry.get(base)

    def run_pass(self, state):
        trigger, otherwise = _GATES[base._name]
        if trigger(state):
            return base.run_pass(self, state)
        if otherwise is not None:
            otherwise(flavour, state)
        return False

    gated = type(f"Gated{base.__name__}", (base,), {"_name": f"qd_gated_{base._name}", "run_pass": run_pass,
                                                    "__module__": __name__})
    return machinery.register_pass(mutates_CFG=info.mutates_CFG, analysis_only=info.analysis_only)(gated)


# -- post-processing without the eager block-entry variables ----------------------------------------

_lean = threading.local()     # depth: gated pipelines running on this thread


class _EntryVars(dict):
    """``FunctionIR.block_entry_vars`` as Numba's post-processing leaves it for the IR's blocks
    (block -> the variables live on entry), computed from the post-processing's
    ``VariableLifetime`` when first read. (Numba updates one mapping in place, so it also keeps
    entries of blocks the IR no longer has; nothing reads those.)"""

    def __init__(self, flavour: str, lifetime):
        super().__init__()
        self._pending = (flavour, lifetime)

    def _force(self) -> None:
        if self._pending is None:
            return
        flavour, vlt = self._pending
        self._pending = None
        analysis = importlib.import_module(f"{flavour}.analysis")
        blocks = vlt._blocks
        live = analysis.compute_live_variables(vlt.cfg, blocks, vlt.usedefs.defmap, vlt.deadmaps.combined)
        for offset, block in blocks.items():
            dict.__setitem__(self, block, live[offset])


def _forcing(name: str):
    """The dict method ``name`` of :class:`_EntryVars`, computing the mapping first."""
    method = getattr(dict, name)

    def forced(self, *args, **kwargs):
        self._force()
        return method(self, *args, **kwargs)

    forced.__name__ = name
    return forced


for _name in ("__getitem__", "__contains__", "__iter__", "__len__", "__repr__", "__eq__", "get", "keys", "values",
              "items", "copy", "pop", "setdefault", "__setitem__", "__delitem__", "update"):
    setattr(_EntryVars, _name, _forcing(_name))
del _name


@functools.cache
def _install_lean_post_processing(flavour: str) -> None:
    """Wrap ``flavour``'s ``PostProcessor.run``: inside a gated pipeline (and not for a generator,
    nor when deleting variables) the block-entry variables become an :class:`_EntryVars`."""
    postproc = importlib.import_module(f"{flavour}.postproc")
    transforms = importlib.import_module(f"{flavour}.transforms")
    original = postproc.PostProcessor.run

    def run(self, emit_dels: bool = False, extend_lifetimes: bool = False):
        func_ir = self.func_ir
        if emit_dels or not getattr(_lean, "depth", 0) or func_ir.is_generator:
            if isinstance(func_ir.block_entry_vars, _EntryVars):
                func_ir.block_entry_vars = {}    # Numba's run fills in every block
            return original(self, emit_dels, extend_lifetimes)
        func_ir.blocks = transforms.canonicalize_cfg(func_ir.blocks)
        lifetime = postproc.VariableLifetime(func_ir.blocks)
        func_ir.variable_lifetime = lifetime
        func_ir.block_entry_vars = _EntryVars(flavour, lifetime)
        func_ir.generator_info = None
        return None

    run.__wrapped__ = original
    postproc.PostProcessor.run = run


# -- call resolution: the template that resolved a call before ---------------------------------------

_resolved: dict = {}   # (callee type, context, args, kws, target, flags) -> (template class, literal args)


@functools.cache
def _install_call_memo() -> None:
    """Wrap ``BaseFunction.get_call_type`` (Numba's, which numba-cuda shares): inside a gated
    pipeline the template that resolved the same call before is applied first (see the module's
    docstring); anywhere else, and when that template no longer gives a signature, Numba's."""
    from numba.core import targetconfig
    from numba.core.errors import NumbaError
    from numba.core.target_extension import get_local_target
    from numba.core.types import functions
    from numba.core.utils import order_by_target_specificity

    original = functions.BaseFunction.get_call_type
    unliteral = functions._unlit_non_poison

    def resolve(self, template, context, literal, args, kws):
        """``template``'s signature for the call (None if it gives none), its impl key recorded."""
        if not literal:
            args, kws = tuple(unliteral(a) for a in args), {k: unliteral(v) for k, v in kws.items()}
        applied = template(context)
        sig = applied.apply(args, kws)
        if sig is not None:
            self._impl_keys[sig.args] = applied.get_impl_key(sig)
        return sig

    def get_call_type(self, context, args, kws):
        if not getattr(_lean, "depth", 0):
            return original(self, context, args, kws)
        target = get_local_target(context)
        try:
            key = (self, context, tuple(args), tuple(kws.items()), target, targetconfig.ConfigStack.top_or_none())
            hit = _resolved.get(key)
        except TypeError:            # an unhashable literal
            return original(self, context, args, kws)
        if hit is not None:
            try:
                template, literal = hit
                sig = resolve(self, template, context, literal, args, kws)
            except NumbaError:
                sig = None
            if sig is not None:
                return sig
        for template in order_by_target_specificity(target, self.templates, fnkey=self.key[0]):
            for literal in ((True, False) if template.prefer_literal else (False, True)):
                try:
                    sig = resolve(self, template, context, literal, args, kws)
                except NumbaError:
                    continue
                if sig is not None:
                    _resolved[key] = (template, literal)
                    return sig
        return original(self, context, args, kws)    # Numba's error, with every template's failure

    get_call_type.__wrapped__ = original
    functions.BaseFunction.get_call_type = get_call_type


@functools.cache
def _install_loc_memo(flavour: str) -> None:
    """Remember ``flavour``'s answer to whether a lowering implementation takes ``loc``: Numba
    reads the function's signature (``inspect.signature``) at every implementation it looks up,
    ~9 times per task. Everywhere, not only in gated pipelines: the answer cannot change."""
    base = importlib.import_module(f"{flavour}.base")
    original = base._has_loc
    known: dict = {}

    def has_loc(fn):
        try:
            return known[fn]
        except KeyError:
            answer = known[fn] = original(fn)
            return answer
        except TypeError:       # an unhashable implementation
            return original(fn)

    has_loc.__wrapped__ = original
    base._has_loc = has_loc


@contextlib.contextmanager
def _lean_post_processing():
    _lean.depth = getattr(_lean, "depth", 0) + 1
    try:
        yield
    finally:
        _lean.depth -= 1


@contextlib.contextmanager
def lean_post_processing(flavour: str):
    """Numba's post-processing on this thread leaves the block-entry variables for when they are
    read (as in a gated pipeline), unless ``task_pipeline`` is ``"full"``: for the bytecode
    frontend (frontend/diagnostics.py), which post-processes every function it reads twice."""
    if config.current.task_pipeline == "full":
        yield
        return
    _install_lean_post_processing(flavour)
    _install_call_memo()
    _install_loc_memo(flavour)
    with _lean_post_processing():
        yield


@functools.cache
def _lean_manager(base):
    """``base`` (a PassManager class) whose ``run`` post-processes leanly."""

    def run(self, state):
        with _lean_post_processing():
            return base.run(self, state)

    return type(f"Lean{base.__name__}", (base,), {"run": run, "__module__": __name__})


def lean_flags(base):
    """``base`` (a Numba flags class) with its :meth:`values` kept between changes and a quick
    equality for two objects of this class with the same explicit options (see the module's
    docstring); ``base`` itself under ``task_pipeline="full"``."""
    return base if config.current.task_pipeline == "full" else _lean_flags(base)


@functools.cache
def _lean_flags(base):
    def values(self):
        explicit = tuple(self._values.items())
        memo = getattr(self, "_qd_memo", None)
        if memo is None or memo[0] != explicit:
            memo = self._qd_memo = (explicit, base.values(self))
        return dict(memo[1])

    def __eq__(self, other):
        if type(other) is type(self) and self._values == other._values:
            return True
        return base.__eq__(self, other)

    return type(f"Lean{base.__name__}", (base,), {"__slots__": ("_qd_memo",), "values": values, "__eq__": __eq__,
                                                  "__hash__": base.__hash__, "__module__": __name__})


def gate(pass_manager, flavour: str):
    """A copy of ``pass_manager`` (finalised) with the passes of :data:`_GATES` gated and lean
    post-processing, unless ``task_pipeline`` is ``"full"``."""
    if config.current.task_pipeline == "full":
        return pass_manager
    _install_lean_post_processing(flavour)
    _install_call_memo()
    _install_loc_memo(flavour)
    gated = _lean_manager(type(pass_manager))(pass_manager.pipeline_name)
    for cls, description in pass_manager.passes:
        if getattr(cls, "_name", None) in _GATES:
            cls = _gated_pass(cls, flavour)
        gated.add_pass(cls, description)
    gated.finalize()
    return gated
