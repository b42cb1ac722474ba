"""The process-wide state of ``qd.random``: the generator state field that kernels read, and the
stream of ``qd.random()`` calls in Python scope. ``qd.init`` starts both anew (:func:`reset`).
"""

from __future__ import annotations

import threading

import numpy as np

from . import config
from .dtypes import u64
from .field import Field
from .lowering.random import PYTHON_STREAM, host_launch_key, host_random, seed_word

_lock = threading.Lock()
_state = None           # the generator state field, made at the first compile that needs it
_python_draws = 0       # qd.random() calls in Python scope since qd.init


def state_field() -> Field:
    """The state of ``qd.random`` in kernels: a uint64 field ``[seed word, launches]``, passed
    to kernels that call qd.random like any field. Each launch of such a kernel reads its key
    from it and counts itself (lowering/random.py). ``qd.init`` starts a new one from
    ``random_seed`` (default 0), so a seed gives the same numbers in every process."""
    global _state
    with _lock:
        if _state is None:
            state = Field(u64, shape=(2,), name="qd.random state")
            state.from_numpy(np.array([seed_word(config.current.random_seed or 0), 0], dtype=np.uint64))
            _state = state
        return _state


def current() -> Field | None:
    """The state field if a compile of this ``qd.init`` made it, else None (nothing is made)."""
    return _state


def python_random(dtype):
    """``qd.random(dtype)`` in Python scope: the same generator, on its own stream, one number
    per call (the n-th call since ``qd.init`` is index n)."""
    global _python_draws
    with _lock:
        index, _python_draws = _python_draws, _python_draws + 1
    key = host_launch_key(config.current.random_seed or 0, 0)
    return host_random(key, index, PYTHON_STREAM, 0, dtype).item()


def reset() -> None:
    """A new state for the next kernel and the next Python-scope call (``qd.init``)."""
    global _state, _python_draws
    with _lock:
        _state, _python_draws = None, 0
