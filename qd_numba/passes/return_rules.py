"""ReturnRules: Quadrants' rules for a kernel's ``return``, and the returned value converted to
the return annotation.

Input: the kernel IR after compile-time evaluation (``qd.static`` folded: a ``return`` in an
unrolled static loop is fine; funcs inlined: their returns are jumps now, so every ``ir.Return``
left is the kernel's own). Errors, each a :class:`QuadrantsSyntaxError` naming the kernel and the
line:

* a ``return`` inside a non-static ``for`` loop (the loop is a parallel task or runs serially
  inside one; neither can leave the kernel);
* a ``return`` inside an ``if`` whose condition is not ``qd.static(...)``, or inside a ``while``
  (:func:`return_in_control_flow`, also applied to every ``@qd.func``, annotated or not; a
  ``@qd.real_func`` is compiled as a function of its own and may return from any path);
* a kernel without a return annotation that returns a value (it would be dropped);
* under a value annotation, a bare ``return`` or a path that ends without returning.

:func:`return_problem` is shared with InlineFuncs, which applies the same rules to an
annotated ``@qd.func`` before inlining it. Then each kernel ``return v`` becomes
``return return_value(v, annotation)`` (lowering/returns.py): a scalar is converted as Quadrants
casts it, a value of the wrong shape is an error at typing.
Changes the IR only when the kernel returns a value.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap

from ..errors import QuadrantsSyntaxError
from ..lang import static
from ..lowering.returns import return_value


class ReturnRules:
    name = "return_rules"

    def run(self, state) -> bool:
        ir = state.ir
        blocks = state.func_ir.blocks
        returns = {label: block.body[-1] for label, block in blocks.items() if isinstance(block.body[-1], ir.Return)}
        state.refresh_definitions()
        problem = return_in_control_flow(state.tools, state.func_ir, state.func_ir.func_id.func) \
            or return_problem(state.tools, state.func_ir, state.return_type, "kernel", static_loops=False)
        if problem is not None:
            raise state.error(QuadrantsSyntaxError, *problem)
        if state.return_type is None:
            return False
        for label, ret in returns.items():
            _convert(state, blocks[label], ret)
        return bool(returns)


def return_problem(tools, func_ir, return_type, what: str, static_loops: bool):
    """(message, loc) of the first broken return rule in ``func_ir`` (a kernel's or a func's,
    ``what`` says which), or None. ``return_type`` is the annotation (None: no value).
    ``static_loops``: loops over ``qd.static(...)`` may still be in the IR (a func before
    inlining); a ``return`` inside them is allowed."""
    ir = tools.ir
    func_ir._definitions = tools.ir_utils.build_definitions(func_ir.blocks)
    returns = {label: block.body[-1] for label, block in func_ir.blocks.items()
               if isinstance(block.body[-1], ir.Return)}
    loc = _return_in_for_loop(tools, func_ir, returns, static_loops)
    if loc is not None:
        return ("Return inside non-static if/for is not supported (Quadrants' rule): 'return' inside a non-static "
                "for loop; assign the result and return after the loop, or iterate over qd.static(...)", loc)
    for ret in returns.values():
        gives_none = _returns_none(ir, func_ir, ret.value)
        if return_type is None and not gives_none:
            return (f"the {what} returns a value but has no return annotation; annotate the type it returns, "
                    f"e.g. def {what}(...) -> qd.f32", ret.loc)
        if return_type is not None and gives_none:
            if _source_line(ret.loc).startswith("return"):
                return f"'return' without a value in a {what} annotated to return {return_type}", ret.loc
            return (f"the {what} is annotated to return {return_type} but does not return a value on every "
                    "path", ret.loc)
    return None


_CONTROL_FLOW_ADVICE = {
    "for": "'return' inside a non-static for loop; assign the result to a variable and return it after the "
           "loop, or iterate over qd.static(...)",
    "while": "'return' inside a while loop; assign the result to a variable and return it after the loop",
    "if": "'return' inside an if whose condition is not qd.static(...); assign the result to a variable and "
          "return it after the if, or write the condition as qd.static(...) when it is known at compile time",
}


def return_in_control_flow(tools, func_ir, fn):
    """(message, loc) of the first ``return`` of ``func_ir`` (its Python function ``fn``) written
    inside an ``if`` whose condition is not ``qd.static(...)``, a non-static ``for`` or a
    ``while``, as Quadrants' AST builder rejects it; None if there is none, or ``fn``'s source is
    not available (exec'd code: the loop rule of :func:`return_problem` still applies). Only
    returns still in the IR count (one under a dead ``qd.static`` branch is gone from a kernel)."""
    code = getattr(fn, "__code__", None)
    lines = _control_flow_returns(code, getattr(fn, "__globals__", None)) if code is not None else {}
    if not lines:
        return None
    for block in func_ir.blocks.values():
        ret = block.body[-1]
        if isinstance(ret, tools.ir.Return) and ret.loc is not None and ret.loc.line in lines:
            return ("Return inside non-static if/for is not supported (Quadrants' rule): "
                    + _CONTROL_FLOW_ADVICE[lines[ret.loc.line]], ret.loc)
    return None


_CONTROL_FLOW: dict = {}     # code object -> _control_flow_returns' answer (bounded below)


def _control_flow_returns(code, module_globals=None) -> dict:
    """Source line -> "for" | "while" | "if" (the innermost non-static loop, else if) of each
    ``return`` statement of ``code``'s function nested in non-static control flow (nested
    functions not counted). The source comes from :mod:`linecache` (``module_globals``: the
    function's, for a module a loader serves), not ``inspect.findsource``, whose module lookup
    resolves the path of every loaded module the first time (~190 ms of a process's first
    kernel on the H100 host)."""
    found = _CONTROL_FLOW.get(code)
    if found is None:
        if len(_CONTROL_FLOW) >= 1024:
            _CONTROL_FLOW.clear()
        found = _CONTROL_FLOW[code] = _scan_returns(code, module_globals)
    return found


def _scan_returns(code, module_globals) -> dict:
    source = linecache.getlines(code.co_filename, module_globals)
    if not source or code.co_firstlineno > len(source):
        return {}   # no source (exec'd code nobody registered, a file since removed)
    try:
        tree = ast.parse(textwrap.dedent("".join(inspect.getblock(source[code.co_firstlineno - 1:]))))
    except (TypeError, SyntaxError, IndentationError):
        return {}
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    found = {}
    _ReturnsInControlFlow(found, code.co_firstlineno - 1).visit_body(tree.body[0].body, None)
    return found


def _is_static_call(node) -> bool:
    if not isinstance(node, ast.Call):
        return False
    fn = node.func
    return (isinstance(fn, ast.Name) and fn.id == "static") or (isinstance(fn, ast.Attribute) and fn.attr == "static")


class _ReturnsInControlFlow:
    """Walks a function's statements; ``inside`` is the innermost enclosing non-static loop
    ("for", "while"), else "if" under a non-static ``if``, else None."""

    def __init__(self, found: dict, line_offset: int):
        self.found, self.offset = found, line_offset

    def visit_body(self, stmts, inside) -> None:
        for stmt in stmts:
            self.visit(stmt, inside)

    def visit(self, stmt, inside) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(stmt, ast.Return):
            if inside is not None:
                self.found[stmt.lineno + self.offset] = inside
            return
        nested = inside
        if isinstance(stmt, ast.If) and not _is_static_call(stmt.test):
            nested = inside or "if"     # a loop around it says more
        elif isinstance(stmt, (ast.For, ast.AsyncFor)) and not _is_static_call(stmt.iter):
            nested = "for"
        elif isinstance(stmt, ast.While):
            nested = "while"
        for field in ("body", "orelse", "handlers", "finalbody", "cases"):
            for child in getattr(stmt, field, ()):
                if isinstance(child, ast.stmt):
                    self.visit(child, nested)
                elif hasattr(child, "body"):      # except handlers, match cases
                    self.visit_body(child.body, nested)


def _return_in_for_loop(tools, func_ir, returns, static_loops):
    """The loc of a ``return`` in a block that only the body of a ``for`` loop reaches (the
    body's entry, the branch target of the loop header's ``iternext``, dominates it), or None."""
    if not returns:
        return None
    ir = tools.ir
    blocks = func_ir.blocks
    body_entries = {}   # body entry label -> the loop's `for` statement loc
    for block in blocks.values():
        term = block.body[-1]
        if isinstance(term, ir.Branch):
            iterator = _for_header_iterator(ir, block)
            if iterator is not None and not (static_loops and _iterates_static(ir, func_ir, iterator)):
                body_entries[term.truebr] = term.loc
    if not body_entries:
        return None
    dominators = tools.analysis.compute_cfg_from_blocks(blocks).dominators()
    for label, ret in returns.items():
        loops = [body_entries[e] for e in dominators[label] & body_entries.keys()]
        # CPython copies a function's last statement (a ``return`` after the loop, or the implicit
        # ``return None``) to the end of a ``break`` path: a return no deeper than its loop's
        # ``for`` (or with no ``return`` on its line) is such a copy, and Offload rules on breaks
        if any(_inside(ret.loc, for_loc) for for_loc in loops):
            return ret.loc
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _inside(ret_loc, for_loc) -> bool:
    """Whether the ``return`` at ``ret_loc`` is written inside the loop whose ``for`` is at
    ``for_loc`` (indented deeper); without source, a ``return`` is taken to be inside."""
    line = linecache.getline(ret_loc.filename, ret_loc.line) if ret_loc is not None and ret_loc.line else ""
    if not line.strip().startswith("return"):
        return False
    header = linecache.getline(for_loc.filename, for_loc.line) if for_loc is not None and for_loc.line else ""
    if not header.strip():
        return True
    return _indent(line) > _indent(header)


def _for_header_iterator(ir, block):
    for stmt in block.body:
        if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "iternext":
            return stmt.value.value
    return None


def _definition(func_ir, var):
    defs = func_ir._definitions.get(var.name, [])
    return defs[0] if len(defs) == 1 else None


def _iterates_static(ir, func_ir, iterator) -> bool:
    """``for v in qd.static(...)``: the iterator is ``getiter(static(...))``."""
    d = _definition(func_ir, iterator)
    while isinstance(d, ir.Var):        # $phi = $get_iter
        d = _definition(func_ir, d)
    if not (isinstance(d, ir.Expr) and d.op == "getiter"):
        return False
    call = _definition(func_ir, d.value)
    if not (isinstance(call, ir.Expr) and call.op == "call"):
        return False
    fn = _definition(func_ir, call.func)
    if isinstance(fn, (ir.Global, ir.FreeVar)):
        return fn.value is static
    return isinstance(fn, ir.Expr) and fn.op == "getattr" and fn.attr == "static"


def _returns_none(ir, func_ir, var) -> bool:
    value = _definition(func_ir, var)
    while isinstance(value, ir.Expr) and value.op == "cast":
        value = _definition(func_ir, value.value)
    return isinstance(value, (ir.Const, ir.Global, ir.FreeVar)) and value.value is None


def _source_line(loc) -> str:
    return linecache.getline(loc.filename, loc.line).strip() if loc is not None and loc.line else ""


def _convert(state, block, ret) -> None:
    ir = state.ir
    loc, scope = ret.loc, block.scope
    fn = scope.redefine("$qd_return_value", loc)
    annotation = scope.redefine("$qd_return_annotation", loc)
    converted = scope.redefine("$qd_returned", loc)
    block.body[-1:] = [
        ir.Assign(ir.Global("return_value", return_value, loc), fn, loc),
        ir.Assign(ir.Global("annotation", state.return_type, loc), annotation, loc),
        ir.Assign(ir.Expr.call(fn, [ret.value, annotation], (), loc), converted, loc),
        ir.Return(converted, loc),
    ]
