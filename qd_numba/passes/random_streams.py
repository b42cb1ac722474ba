"""BindRandomStreams: give every ``qd.random()`` call its place in the counter-based stream.

Input: the kernel IR right after Offload (``state.loops`` known, before fusion). Output, only
when the kernel calls ``qd.random``:

* the entry block reads this launch's key from the generator state, a runtime-owned uint64
  field (``state.random_state()``: the runtime's, handed in by the target), advancing its launch
  count: ``key = launch_key(state)``;
* each top-level loop's header resets a per-iteration call counter to 0, and serial code
  has one counter for the whole launch, set to 0 in the entry block;
* each call ``qd.random(dtype)`` becomes ``random_at(key, index, stream, counter, dtype)``
  followed by ``counter = counter + 1``, where ``index`` is the loop's flat index (0 in serial
  code) and ``stream`` the loop's position among the top-level loops plus one (0: serial).

So a number depends only on (seed, launch, stream, index, counter): never on threads,
chunking or the backend (lowering/random.py). Calls the kernel IR does not contain (inside a
``@numba.njit`` callee) are left alone and fail to type with an error saying so (lang/__init__.py).
Never touches control flow.
"""

from __future__ import annotations

import operator

from numba.core import types

from .. import dtypes
from ..errors import QuadrantsSyntaxError, QuadrantsTypeError
from ..lang import random as qd_random
from ..lowering.random import launch_key, random_at
from .base import MISSING, hidden_argument, try_static

SERIAL_STREAM = 0


def _is_random_call(state, stmt) -> bool:
    ir = state.ir
    return isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call" \
        and try_static(state, stmt.value.func) is qd_random


class BindRandomStreams:
    name = "bind_random_streams"

    def run(self, state) -> bool:
        ir = state.ir
        blocks = state.func_ir.blocks
        sites = [(lbl, stmt) for lbl, block in blocks.items() for stmt in block.body if _is_random_call(state, stmt)]
        if not sites:
            return False
        entry = blocks[min(blocks)]
        scope, loc = entry.scope, entry.loc
        loops = sorted(state.loops, key=lambda lp: lp.task_index)
        stream_of = {lbl: k + 1 for k, lp in enumerate(loops) for lbl in lp.body}
        self.state, self.scope = state, scope

        generator = hidden_argument(state, state.random_state(), loc)
        self.key = scope.redefine("$qd_rng_key", loc)
        prologue = self._call(launch_key, [generator], self.key, loc)
        counters = {}   # stream -> (counter variable, index variable)
        if any(stream_of.get(lbl, SERIAL_STREAM) == SERIAL_STREAM for lbl, _ in sites):
            counter = scope.redefine("$qd_rng_serial_count", loc)
            zero = scope.redefine("$qd_rng_index", loc)
            prologue += [ir.Assign(ir.Const(0, loc), counter, loc), ir.Assign(ir.Const(0, loc), zero, loc)]
            counters[SERIAL_STREAM] = (counter, zero)
        first = next(k for k, s in enumerate(entry.body)
                     if not (isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg)))
        entry.body[first:first] = prologue

        for k, lp in enumerate(loops):
            if any(stream_of.get(lbl) == k + 1 for lbl, _ in sites):
                counters[k + 1] = self._loop_counter(blocks[lp.header], loc)
        by_block = {}
        for lbl, stmt in sites:
            by_block.setdefault(lbl, set()).add(id(stmt))
        for lbl, ids in by_block.items():
            stream = stream_of.get(lbl, SERIAL_STREAM)
            new_body = []
            for stmt in blocks[lbl].body:
                new_body += self._rewrite(stmt, stream, *counters[stream]) if id(stmt) in ids else [stmt]
            blocks[lbl].body = new_body
        state.refresh_definitions()
        return True

    def _call(self, fn, args, target, loc, kws=()):
        ir = self.state.ir
        fvar = self.scope.redefine(f"$qd_{fn.__name__}", loc)
        return [ir.Assign(ir.Global(fn.__name__, fn, loc), fvar, loc),
                ir.Assign(ir.Expr.call(fvar, list(args), list(kws), loc), target, loc)]

    def _loop_counter(self, header, loc):
        """(counter reset in the loop header on every iteration, the loop's flat index)."""
        ir = self.state.ir
        flat = next(s.target for s in header.body if isinstance(s, ir.Assign)
                    and isinstance(s.value, ir.Expr) and s.value.op == "pair_first")
        counter = self.scope.redefine("$qd_rng_count", loc)
        header.body.insert(len(header.body) - 1, ir.Assign(ir.Const(0, loc), counter, loc))
        return counter, flat

    def _dtype(self, call, loc):
        """The Numba type ``qd.random(dtype)`` returns: an integer or float type known now."""
        state = self.state
        kws = dict(call.kws)
        if len(call.args) + len(kws) > 1 or set(kws) - {"dtype"} or call.vararg is not None:
            raise state.error(QuadrantsSyntaxError, "qd.random() takes one optional argument, dtype", loc)
        var = call.args[0] if call.args else kws.get("dtype")
        if var is None:
            return state.config.default_fp
        value = try_static(state, var)
        try:  # Python's int and float mean the defaults, as in annotations
            dtype = state.config.default_ip if value is int else state.config.default_fp if value is float \
                else dtypes.to_numba(value)
        except TypeError:
            dtype = None
        if value is MISSING or not isinstance(dtype, (types.Integer, types.Float)):
            shown = "a value only known at run time" if value is MISSING else repr(value)
            raise state.error(QuadrantsTypeError, f"qd.random(dtype): dtype must be an integer or float type "
                                                  f"(qd.f32, qd.i32, ...), got {shown}", loc)
        return dtype

    def _rewrite(self, stmt, stream, counter, index):
        """``random_at(key, index, stream, counter, dtype)``, then the counter's increment."""
        ir = self.state.ir
        loc, call = stmt.loc, stmt.value
        scope = self.scope
        dtype = scope.redefine("$qd_rng_dtype", loc)
        out = [ir.Assign(ir.Global("dtype", self._dtype(call, loc), loc), dtype, loc)]
        stream_var, one, add = (scope.redefine(n, loc) for n in ("$qd_rng_stream", "$qd_rng_one", "$qd_rng_add"))
        out += [ir.Assign(ir.Const(stream, loc), stream_var, loc), ir.Assign(ir.Const(1, loc), one, loc)]
        out += self._call(random_at, [self.key, index, stream_var, counter, dtype], stmt.target, loc)
        out += [ir.Assign(ir.Expr.binop(operator.add, counter, one, loc), add, loc),
                ir.Assign(add, counter, loc)]
        return out
