"""The iteration space of a range-for task as size expressions (the Task's ``bounds``).

A *size expression* is a nested tuple, equal for two variables exactly when they provably
hold the same value:

* ``("const", n)`` — a compile-time integer;
* ``("arg", k)`` — kernel argument k (a runtime parameter, or a hidden field after them);
* ``("attr", e, name)``, ``("shape", e, axis)``, ``("item", e, index)`` — attribute, shape entry
  or constant-index item of another expression;
* ``(op, fn, *operands)`` for ``binop``/``unary``/``cast`` of other expressions;
* ``("value", var)`` — a value computed once, at run time, by earlier serial code (a load).

A space is a tuple of ``(start, stop, step)`` per dimension. Offload stores it in each range-for
Task (:class:`~qd_numba.task.Bounds`); fusion compares them; autodiff's adstack sizing reads
the same expressions.
"""

from __future__ import annotations

import numbers
import operator

from ..lowering import spaces
from ..task import Bounds
from .base import resolve_copies, try_static


def task_bounds(state, space_var, grouped: bool = False) -> Bounds:
    """The Bounds of the space ``space_var`` (analysis may fail: ``dims`` None, text generic);
    ``grouped``: the loop iterates it with ``qd.grouped``."""
    key = space_key(state, space_var)
    text = render_space_key(key, state)
    return Bounds(key, f"grouped({text})" if grouped else text)


def space_key(state, space_var):
    """A canonical description of an iteration space — a tuple of (start, stop, step) keys per
    dimension — or None when the analysis cannot describe it."""
    ir = state.ir
    d = resolve_copies(state, space_var)[1]
    if not isinstance(d, ir.Expr):
        return None
    if d.op == "build_tuple":
        dims = [_dim_key(state, v) for v in d.items]
        return None if any(k is None for k in dims) else tuple(dims)
    if d.op != "call":
        return None
    fn = try_static(state, d.func)
    if fn is spaces.range_dim:
        keys = [_value_key(state, a) for a in d.args]
        if any(k is None for k in keys) or not 1 <= len(keys) <= 3:
            return None
        zero, one = ("const", 0), ("const", 1)
        return ((zero, keys[0], one),) if len(keys) == 1 else \
            ((keys[0], keys[1], one),) if len(keys) == 2 else (tuple(keys),)
    if fn is spaces.shape_space and len(d.args) == 1:
        value = try_static(state, d.args[0])
        if hasattr(value, "shape") and not isinstance(value, type):
            return tuple((("const", 0), ("const", int(n)), ("const", 1)) for n in value.shape)
        base = _value_key(state, d.args[0])
        ty = _arg_type(state, d.args[0])
        if base is None or getattr(ty, "ndim", None) is None:
            return None
        return tuple((("const", 0), ("shape", base, k), ("const", 1)) for k in range(ty.ndim))
    return None


def _dim_key(state, var):
    ir = state.ir
    d = resolve_copies(state, var)[1]
    if not (isinstance(d, ir.Expr) and d.op == "call" and try_static(state, d.func) is spaces.ndrange_dim):
        return None
    arg = d.args[0]
    ad = resolve_copies(state, arg)[1]
    if isinstance(ad, ir.Expr) and ad.op == "build_tuple" and len(ad.items) == 2:
        lo, hi = (_value_key(state, v) for v in ad.items)
        return None if lo is None or hi is None else (lo, hi, ("const", 1))
    value = try_static(state, arg)
    if isinstance(value, tuple) and len(value) == 2:
        return (("const", value[0]), ("const", value[1]), ("const", 1))
    key = _value_key(state, arg)
    return None if key is None else (("const", 0), key, ("const", 1))


def _arg_type(state, var):
    ir = state.ir
    d = resolve_copies(state, var)[1]
    return state.param_types.get(d.name) if isinstance(d, ir.Arg) else None


def _value_key(state, var, depth=0):
    """A key equal for two variables exactly when they provably hold the same value."""
    ir = state.ir
    value = try_static(state, var)
    if isinstance(value, numbers.Integral):
        return ("const", int(value))
    if depth > 20:
        return None
    var, d = resolve_copies(state, var)
    if d is None:
        return None
    if isinstance(d, ir.Arg):
        return ("arg", d.index)
    if isinstance(d, ir.Expr):
        if d.op == "getattr":
            base = _value_key(state, d.value, depth + 1)
            return None if base is None else ("attr", base, d.attr)
        if d.op in ("static_getitem", "getitem"):
            index = d.index if d.op == "static_getitem" else try_static(state, d.index)
            base = _value_key(state, d.value, depth + 1)
            if base is None or not isinstance(index, numbers.Integral):
                return None if base is None or d.op == "static_getitem" else ("value", var.name)
            if base[0] == "attr" and base[2] == "shape":
                return ("shape", base[1], int(index))
            return ("item", base, int(index))
        if d.op in ("binop", "unary", "cast"):
            parts = [d.lhs, d.rhs] if d.op == "binop" else [d.value]
            keys = [_value_key(state, v, depth + 1) for v in parts]
            return None if any(k is None for k in keys) else (d.op, str(getattr(d, "fn", "")), *keys)
    # computed once by serial code (a load, a call): the same single definition is the same value
    return ("value", var.name)


_OPERATORS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//",
              operator.truediv: "/", operator.mod: "%", operator.neg: "-", operator.pos: "+",
              operator.lshift: "<<", operator.rshift: ">>", operator.and_: "&", operator.or_: "|",
              operator.xor: "^", operator.invert: "~"}


def render_size(key, state=None) -> str:
    """A size expression as a person would write it (argument names when ``state`` is given)."""
    tag = key[0]
    if tag == "const":
        return str(key[1])
    if tag == "arg":
        return _arg_name(state, key[1])
    if tag == "shape":
        return f"{render_size(key[1], state)}.shape[{key[2]}]"
    if tag == "attr":
        return f"{render_size(key[1], state)}.{key[2]}"
    if tag == "item":
        return f"{render_size(key[1], state)}[{key[2]}]"
    if tag == "value":
        name = key[1]
        return name if not name.startswith("$") else "(a value computed at run time)"
    if tag == "cast":
        return render_size(key[2], state)
    if tag == "unary":
        return f"{key[1]}{render_size(key[2], state)}"
    if tag == "binop":
        symbol = next((s for fn, s in _OPERATORS.items() if str(fn) == key[1]), key[1])
        return f"({render_size(key[2], state)} {symbol} {render_size(key[3], state)})"
    return "?"


def _arg_name(state, index: int) -> str:
    if state is None:
        return f"arg{index}"
    if index < len(state.runtime_params):
        return state.runtime_params[index]
    field = state.hidden_by_arg_index(index)
    return getattr(field, "name", None) or f"field#{index - len(state.runtime_params)}"


def render_space_key(key, state=None) -> str:
    if key is None:
        return "an iteration space the analysis cannot describe"
    dims = []
    for start, stop, step in key:
        parts = [render_size(k, state) for k in (start, stop)]
        if step != ("const", 1):
            parts.append(render_size(step, state))
        dims.append([parts[1]] if start == ("const", 0) and len(parts) == 2 else parts)
    if len(dims) == 1:
        return f"range({', '.join(dims[0])})"
    return "ndrange(" + ", ".join(d[0] if len(d) == 1 else f"({', '.join(d)})" for d in dims) + ")"


# -- adstack sizes (qd_numba/adstack.py evaluates them on the host before each launch) ---------------

_SIZE_OPS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//"}


def _constant_index(value) -> bool:
    return value is None or isinstance(value, numbers.Integral) or \
        (isinstance(value, tuple) and all(isinstance(v, numbers.Integral) for v in value))


def size_expr(state, var, depth=0):
    """``var`` as an adstack size expression (adstack.py says their form), or None when it is
    not one: constants, scalar arguments, ndarray shapes, field or ndarray elements at a
    constant index, ``+ - * //``, ``max``/``min`` and integer casts of those."""
    ir = state.ir
    if depth > 20:
        return None
    var, d = resolve_copies(state, var)
    if isinstance(d, (ir.Const, ir.Global, ir.FreeVar)):    # not try_static of a field element: it changes
        value = try_static(state, var)
        return ("const", int(value)) if isinstance(value, numbers.Integral) else None
    if isinstance(d, ir.Arg):
        return ("arg", d.index)
    if not isinstance(d, ir.Expr):
        return None
    if d.op in ("static_getitem", "getitem"):
        index = d.index if d.op == "static_getitem" else try_static(state, d.index)
        base_def = resolve_copies(state, d.value)[1]
        if isinstance(base_def, ir.Expr) and base_def.op == "getattr" and base_def.attr == "shape" \
                and isinstance(index, numbers.Integral):
            base = size_expr(state, base_def.value, depth + 1)
            return None if base is None else ("shape", base, int(index))
        base = size_expr(state, d.value, depth + 1)
        if base is None or base[0] != "arg" or not _constant_index(index):
            return None
        return ("item", base, index)
    if d.op == "binop" and d.fn in _SIZE_OPS:
        lhs, rhs = size_expr(state, d.lhs, depth + 1), size_expr(state, d.rhs, depth + 1)
        return None if lhs is None or rhs is None else (_SIZE_OPS[d.fn], lhs, rhs)
    if d.op == "call":
        fn = try_static(state, d.func)
        parts = [size_expr(state, a, depth + 1) for a in d.args]
        if d.kws or any(p is None for p in parts):
            return None
        if fn in (max, min) and len(parts) >= 2:
            out = parts[0]
            for p in parts[1:]:
                out = (fn.__name__, out, p)
            return out
        if fn is int and len(parts) == 1:
            return parts[0]
    return None
