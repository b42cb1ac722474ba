"""RewriteAsserts: ``assert`` in kernels, with Quadrants' semantics.

Numba's frontend turns ``assert cond, msg`` into ``branch cond, ok, fail`` where the block
``fail`` builds ``AssertionError(msg)`` and raises it. That block leaves every enclosing
loop, which a parallel loop cannot do, and Numba's exception would reach the user as a
runtime error. This pass rewrites every such block (after inlining, so funcs' asserts too):

* with ``debug=True``: ``fail`` calls :func:`~qd_numba.lowering.raising.assert_failed` and
  then jumps to ``ok``, so the assert stays inside its loop. The call raises
  ``QuadrantsAssertionError`` whose message is the assert's message (a constant string or an
  f-string; without one, the condition's source), the kernel name, ``file:line`` and the
  source line. An f-string's values are computed only when the assert fails, as in Python;
  the CPU prints them, CUDA (whose exceptions are status codes) shows the expressions.
* without ``debug``: the assert is compiled out. Every ``branch cond, ok, fail`` becomes
  ``jump ok`` and the side-effect-free temporaries that only computed ``cond`` go with it.

``if cond: assert False, msg`` and ``if cond: raise AssertionError(msg)`` take the same path.
A block that raises ``AssertionError`` unconditionally (``assert False`` outside any ``if``,
where CPython drops the branch) is left to Numba. A message that is neither a
constant string nor an f-string is a ``QuadrantsSyntaxError``. Never touches anything but
assert branches and their ``fail`` blocks.
"""

from __future__ import annotations

import ast
import linecache

from ..errors import QuadrantsSyntaxError, source_excerpt
from ..lowering.raising import AssertMessage, assert_failed
from .base import try_static
from .fold_static import remove_unreachable

# what computing an assert's condition may leave behind: dropped with the assert when unused
_CONDITION_OPS = frozenset({"binop", "unary", "getitem", "static_getitem", "getattr", "cast", "build_tuple"})


class RewriteAsserts:
    name = "rewrite_asserts"

    def run(self, state) -> bool:
        ir = state.ir
        blocks = state.func_ir.blocks
        state.refresh_definitions()
        failures = {lbl: self._message_of(state, block) for lbl, block in blocks.items()
                    if _raises_assertion_error(state, block)}
        if not failures:
            return False
        uses = _use_counts(ir, blocks)
        changed = False
        for block in list(blocks.values()):
            term = block.body[-1]
            if not isinstance(term, ir.Branch) or (term.truebr in failures) == (term.falsebr in failures) \
                    or _is_loop_exit_test(state, term.cond):
                continue
            fail, ok = (term.truebr, term.falsebr) if term.truebr in failures else (term.falsebr, term.truebr)
            if state.config.debug:
                if isinstance(blocks[fail].body[-1], ir.Raise):  # not rewritten yet (several branches to one)
                    self._call_assert_failed(state, blocks[fail], failures[fail], ok)
            else:
                block.body[-1] = ir.Jump(ok, term.loc)
                _drop_unused_condition(state, block, term.cond, uses)
            changed = True
        if changed:
            remove_unreachable(state)
        return changed

    # -- the fail block --------------------------------------------------------------------
    def _message_of(self, state, block):
        """(the statements that build the exception, the AssertMessage, the runtime values)."""
        ir = state.ir
        raise_stmt = block.body[-1]
        loc = raise_stmt.loc
        exc = _def_in(ir, block, raise_stmt.exception)
        plumbing = [raise_stmt]
        pieces = None
        if exc is not None and isinstance(exc.value, ir.Expr) and exc.value.op == "call":
            plumbing.append(exc)
            plumbing.extend(s for s in [_def_in(ir, block, exc.value.func)] if s is not None)
            args = exc.value.args
            if len(args) > 1 or exc.value.kws:
                raise state.error(QuadrantsSyntaxError, "an assert message must be a string", loc)
            if args:
                pieces = _message_pieces(state, block, args[0], plumbing)
                if pieces is None:
                    raise state.error(QuadrantsSyntaxError, _bad_message(ir, block), loc)
        else:
            plumbing.extend(s for s in [exc] if s is not None)
        source = linecache.getline(loc.filename, loc.line).strip() if loc.filename and loc.line else ""
        test, formatted = _parse_assert(source)
        if pieces is None:
            pieces = [test or "assertion failed"]
        values = [p for p in pieces if not isinstance(p, str)]
        names = formatted if len(formatted) == len(values) else [v.name for v in values]
        template = "".join(_escape(p) if isinstance(p, str) else "{}" for p in pieces)
        excerpt = source_excerpt(loc)
        head, tail = f"in kernel '{state.kernel_name}': ", f"\n{excerpt}" if excerpt else ""
        message = AssertMessage(_escape(head) + template + _escape(tail), tuple(names))
        return plumbing, message, values

    def _call_assert_failed(self, state, block, failure, ok_label):
        ir = state.ir
        plumbing, message, values = failure
        loc = block.body[-1].loc
        scope = block.scope
        ids = {id(s) for s in plumbing}
        fn = scope.redefine("$qd_assert_failed", loc)
        msg = scope.redefine("$qd_assert_message", loc)
        out = scope.redefine("$qd_assert", loc)
        block.body = [s for s in block.body if id(s) not in ids] + [
            ir.Assign(ir.Global("assert_failed", assert_failed, loc), fn, loc),
            ir.Assign(ir.Global("assert_message", message, loc), msg, loc),
            ir.Assign(ir.Expr.call(fn, [msg, *values], (), loc), out, loc),
            ir.Jump(ok_label, loc)]


def _bad_message(ir, block) -> str:
    text = "the message of an assert must be a constant string or an f-string"
    if any(v.name.startswith("@py_") for stmt in block.body for v in stmt.list_vars()):
        text += ("; pytest rewrote this assert (kernels defined in a test module): put "
                 "PYTEST_DONT_REWRITE in the module docstring or run pytest with --assert=plain")
    return text


def _raises_assertion_error(state, block) -> bool:
    ir = state.ir
    term = block.body[-1]
    if not isinstance(term, ir.Raise) or term.exception is None:
        return False
    exc = _def_in(ir, block, term.exception)
    if exc is not None and isinstance(exc.value, ir.Expr) and exc.value.op == "call":
        return try_static(state, exc.value.func) is AssertionError
    return try_static(state, term.exception) is AssertionError


def _is_loop_exit_test(state, cond) -> bool:
    """The branch of a ``for`` loop's header (its exit may be an ``assert False`` after the loop)."""
    ir = state.ir
    d = state.definition(cond)
    return isinstance(d, ir.Expr) and d.op == "pair_second"


def _def_in(ir, block, var):
    """The assignment of ``var`` in ``block`` (None if it is assigned elsewhere)."""
    return next((s for s in block.body if isinstance(s, ir.Assign) and s.target.name == var.name), None)


def _message_pieces(state, block, var, plumbing):
    """A message built in ``block`` as constant strings and ``str(value)`` (an f-string, as
    Numba's frontend builds it) as a list of strings and value variables, or None. Adds the
    statements that build it to ``plumbing``."""
    ir = state.ir
    const = try_static(state, var)
    stmt = _def_in(ir, block, var)
    if isinstance(const, str):
        plumbing.extend(s for s in [stmt] if s is not None)
        return [const]
    if stmt is None or not isinstance(stmt.value, ir.Expr):
        return None
    value = stmt.value
    if value.op == "binop" and value.fn.__name__ == "add":
        left = _message_pieces(state, block, value.lhs, plumbing)
        right = _message_pieces(state, block, value.rhs, plumbing)
        if left is None or right is None:
            return None
        plumbing.append(stmt)
        return left + right
    if value.op == "call" and len(value.args) == 1 and not value.kws and try_static(state, value.func) is str:
        plumbing.append(stmt)
        plumbing.extend(s for s in [_def_in(ir, block, value.func)] if s is not None)
        return [value.args[0]]
    return None


def _parse_assert(source: str):
    """(source of the condition, sources of the f-string's values) of a one-line assert."""
    try:
        node = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return None, []
    if not isinstance(node, ast.Assert):
        return None, []
    formatted = []
    if isinstance(node.msg, ast.JoinedStr):
        formatted = [ast.unparse(v.value) for v in node.msg.values if isinstance(v, ast.FormattedValue)]
    return ast.unparse(node.test), formatted


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _use_counts(ir, blocks) -> dict:
    counts = {}
    for block in blocks.values():
        for stmt in block.body:
            for v in stmt.list_vars():
                if not (isinstance(stmt, ir.Assign) and v is stmt.target):
                    counts[v.name] = counts.get(v.name, 0) + 1
    return counts


def _drop_unused_condition(state, block, cond, uses) -> None:
    """Remove the temporaries of ``block`` that only computed ``cond`` (now unread)."""
    ir = state.ir
    todo = [cond]
    while todo:
        var = todo.pop()
        uses[var.name] -= 1
        if uses[var.name] or not state.is_temp(var):
            continue
        stmt = _def_in(ir, block, var)
        if stmt is None or not _removable(state, stmt.value):
            continue
        block.body.remove(stmt)
        todo.extend(stmt.value.list_vars() if isinstance(stmt.value, ir.Expr) else
                    [stmt.value] if isinstance(stmt.value, ir.Var) else [])


def _removable(state, value) -> bool:
    ir = state.ir
    if isinstance(value, (ir.Const, ir.Global, ir.FreeVar, ir.Var)):
        return True
    if not isinstance(value, ir.Expr):
        return False
    if value.op == "call":
        return try_static(state, value.func) is bool and not value.kws
    return value.op in _CONDITION_OPS

