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

import numpy as np
from numba.core import types

from .. import dtypes
from ..lowering import array_access, spaces
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


def size_expr(state, var, depth=0, space=None):
    """``var`` as an adstack size expression (adstack.py says their form), or None when it is
    not one: constants, scalar arguments, ndarray shapes, field or ndarray elements at a
    constant index, ``+ - * //``, ``max``/``min`` and integer casts of those. With ``space``
    (the parallel loop's iteration-space variable), also the loop's index components
    (``("index", k)``) and elements read at indices computed from them (``("load", e, idx)``):
    a per-thread bound, sized by a max-reduction over the space (adstack.py)."""
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
    if d.op == "static_getitem" and space is not None and isinstance(d.index, int) \
            and _is_space_index(state, d.value, space):
        return ("index", d.index)
    if d.op in ("static_getitem", "getitem"):
        index = d.index if d.op == "static_getitem" else try_static(state, d.index)
        base_def = resolve_copies(state, d.value)[1]
        if isinstance(base_def, ir.Expr) and base_def.op == "getattr" and base_def.attr == "shape" \
                and isinstance(index, numbers.Integral):
            base = size_expr(state, base_def.value, depth + 1, space)
            return None if base is None else ("shape", base, int(index))
        return _element(state, d.value, index, d.index if d.op == "getitem" else None, depth, space)
    if d.op == "binop" and d.fn in _SIZE_OPS:
        lhs, rhs = size_expr(state, d.lhs, depth + 1, space), size_expr(state, d.rhs, depth + 1, space)
        return None if lhs is None or rhs is None else (_SIZE_OPS[d.fn], lhs, rhs)
    if d.op == "call":
        fn = try_static(state, d.func)
        if fn in (array_access.array_load, array_access.checked_array_load) and len(d.args) == 2 and not d.kws:
            return _element(state, d.args[0], try_static(state, d.args[1]), d.args[1], depth, space)
        parts = [size_expr(state, a, depth + 1, space) for a in d.args]
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


def _element(state, base_var, index, index_var, depth, space):
    """``base[index]`` as a size expression: an element at a constant index (``index``) or at
    per-thread indices (``index_var``, with ``space``) of an integer field or ndarray."""
    base = size_expr(state, base_var, depth + 1, space)
    if base is None or base[0] != "arg" or not _integer_data(state, base[1]):
        return None
    if _constant_index(index):
        return ("item", base, index)
    parts = _index_parts(state, index_var, depth, space) if index_var is not None else None
    return None if parts is None else ("load", base, parts)


def _integer_data(state, index: int) -> bool:
    """Whether kernel argument ``index`` is a field or ndarray of integers (a float element would
    be truncated before the arithmetic of the bound)."""
    field = state.hidden_by_arg_index(index)
    if field is not None:
        return np.dtype(dtypes.to_numpy(field.dtype)).kind in "iu"
    ty = state.param_types.get(state.runtime_params[index]) if index < len(state.runtime_params) else None
    return isinstance(getattr(ty, "dtype", None), types.Integer)


def _is_space_index(state, var, space) -> bool:
    """Whether ``var`` is the index tuple of the parallel loop over ``space``."""
    ir = state.ir
    d = resolve_copies(state, var)[1]
    if not (isinstance(d, ir.Expr) and d.op == "call" and try_static(state, d.func) is spaces.space_index):
        return False
    got, want = resolve_copies(state, d.args[0])[0], resolve_copies(state, space)[0]
    if got.name == want.name:
        return True
    key = space_key(state, want)    # a fused loop's later parts index their own (identical) copy of the space
    return key is not None and space_key(state, got) == key


def _index_parts(state, index, depth, space):
    """The components of a per-thread index (a tuple of size expressions), or None."""
    from ..lowering import subscripts

    ir = state.ir
    d = resolve_copies(state, index)[1]
    if space is not None and isinstance(d, ir.Expr) and d.op == "call" and d.args \
            and try_static(state, d.func) is subscripts.index_vector and _is_space_index(state, d.args[0], space):
        key = space_key(state, space)
        return None if key is None else tuple(("index", k) for k in range(len(key)))
    items = d.items if isinstance(d, ir.Expr) and d.op == "build_tuple" else [index]
    parts = tuple(size_expr(state, v, depth + 1, space) for v in items)
    return None if any(p is None for p in parts) else parts


def simplify_size(expr):
    """``expr`` with constants folded, ``1 *``, ``+ 0`` and ``- 0`` dropped, and ``a * T + b * T``
    collected (a stack's size sums the same trip count per block): fewer nodes to evaluate per
    launch (per index point, for a per-thread bound) and a shorter text in messages."""
    if not (isinstance(expr, tuple) and expr and expr[0] in _FOLD):
        return expr
    a, b = simplify_size(expr[1]), simplify_size(expr[2])
    tag = expr[0]
    if a[0] == "const" and b[0] == "const" and (tag != "//" or b[1] != 0):
        return ("const", _FOLD[tag](a[1], b[1]))
    if tag == "*":
        if a == ("const", 1):
            return b
        if b == ("const", 1):
            return a
    if tag in ("+", "-") and b == ("const", 0):
        return a
    if tag == "+":
        if a == ("const", 0):
            return b
        (ca, ta), (cb, tb) = _term(a), _term(b)
        if ta == tb:
            return ("*", ("const", ca + cb), ta)
    return (tag, a, b)


_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "max": max, "min": min}


def _term(expr):
    """``(c, T)`` with ``expr == c * T``."""
    if expr[0] == "*" and expr[1][0] == "const":
        return expr[1][1], expr[2]
    return 1, expr


def has_index(expr) -> bool:
    """Whether a size expression reads the parallel loop's index (a per-thread bound)."""
    if not isinstance(expr, tuple):
        return False
    return bool(expr) and expr[0] == "index" or any(has_index(e) for e in expr)


def space_sizes(state, space):
    """The iteration space ``space`` as ``((start, stop, step) per dimension)`` of adstack size
    expressions, or None when one is not expressible (the max-reduction's domain)."""
    key = space_key(state, space)
    if key is None:
        return None
    dims = tuple(tuple(_as_size(k) for k in dim) for dim in key)
    return None if any(k is None for dim in dims for k in dim) else dims


_KEY_OPS = {str(fn): symbol for fn, symbol in _SIZE_OPS.items()}


def _as_size(key):
    """A value key (:func:`_value_key`) as an adstack size expression, or None."""
    tag = key[0]
    if tag in ("const", "arg"):
        return key
    if tag in ("shape", "item"):
        base = _as_size(key[1])
        return None if base is None or (tag == "item" and base[0] != "arg") else (tag, base, key[2])
    if tag == "binop" and key[1] in _KEY_OPS:
        lhs, rhs = _as_size(key[2]), _as_size(key[3])
        return None if lhs is None or rhs is None else (_KEY_OPS[key[1]], lhs, rhs)
    if tag == "cast":
        return _as_size(key[2])
    return None
