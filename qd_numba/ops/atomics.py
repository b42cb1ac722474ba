"""``qd.atomic_mul``, ``qd.atomic_exchange``, ``qd.atomic_cas``: the atomics beyond add/sub/min/max/
and/or/xor (those are in qd_numba/lang).

Like the others they are markers: passes/rewrite_subscripts.py recognises them by identity
(:data:`MORE_ATOMICS`: function -> op name) and rewrites ``qd.atomic_<op>(G[I], ...)`` on global data
into an atomic on the element (lowering/atomics.py), and on a local value into a plain update.
Every one returns the old value.

* ``atomic_mul(x, y)``: ``x *= y`` (integers and floats).
* ``atomic_exchange(x, y)``: ``x = y`` (integers and floats).
* ``atomic_cas(x, expected, desired)``: ``x = desired`` if ``x == expected`` (integers only).
"""

from __future__ import annotations

from ..errors import QuadrantsSyntaxError


def _marker(name, op, doc):
    def atomic(*args):
        raise QuadrantsSyntaxError(f"qd.{name} can only be used inside a kernel or func")

    atomic.__name__ = atomic.__qualname__ = name
    atomic.__doc__ = doc
    return atomic, op


atomic_mul, _mul = _marker("atomic_mul", "mul", "Atomically ``x *= y``; returns the old value of ``x``.")
atomic_exchange, _xchg = _marker("atomic_exchange", "xchg", "Atomically ``x = y``; returns the old value of ``x``.")
atomic_cas, _cas = _marker("atomic_cas", "cas",
                           "Atomically ``if x == expected: x = desired`` (integers); returns the old value of ``x``.")

MORE_ATOMICS = {atomic_mul: _mul, atomic_exchange: _xchg, atomic_cas: _cas}
"""function -> op name (``element_atomic``'s op; ``cas`` has its own helper)."""

ARITY = {"cas": 3}
"""Arguments of ``qd.atomic_<op>`` when not 2 (target and value)."""
