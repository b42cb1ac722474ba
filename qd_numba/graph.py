"""``@qd.kernel(graph=True)``: the rules of graph kernels, on every target.

A graph kernel's tasks are captured once into a CUDA graph and replayed on later calls (the CUDA
target: targets/cuda/graphs.py); on other targets ``graph=True`` changes nothing. As in
Quadrants, a graph kernel returns nothing and runs on the default stream: this module raises
our errors, naming the kernel, for what breaks those rules (docs/graphs.md). Its derivative
kernels (``kernel.grad``, forward mode) run with plain launches, as in Quadrants. Fusion keeps
one task per loop in graph kernels (``Config.for_kernel``).
"""

from __future__ import annotations

from .errors import QuadrantsRuntimeError, QuadrantsSyntaxError


def check_returns(name: str, returns) -> None:
    """A graph kernel declared with a return value (``-> T``) is refused when decorated."""
    if returns is not None:
        raise QuadrantsSyntaxError(f"kernel '{name}': a graph=True kernel cannot return a value (a graph replay "
                                   "reads nothing back); write the result to a field or ndarray instead")


def stream_error(name: str) -> QuadrantsRuntimeError:
    """``qd_stream=`` on a graph kernel (refused, as in Quadrants: the graph replays on the
    default stream)."""
    return QuadrantsRuntimeError(f"kernel '{name}': qd_stream= is not compatible with graph=True kernels (the graph "
                                 "replays on the default stream); call it without qd_stream=, or order it with "
                                 "events")
