"""``@qd.kernel(graph=True)``: the rules of graph kernels, on every target.

A graph kernel's tasks are captured once into a CUDA graph and replayed on later calls (the CUDA
target: targets/cuda/graphs.py); on other targets ``graph=True`` changes nothing. As in
Quadrants, a graph kernel is a primal kernel that returns nothing and runs on the default
stream: this module raises our errors, naming the kernel, for what breaks those rules
(docs/graphs.md). Fusion keeps one task per loop in graph kernels (``Config.for_kernel``).
"""

from __future__ import annotations

from .errors import QuadrantsRuntimeError, QuadrantsSyntaxError


def check_returns(name: str, returns) -> None:
    """A graph kernel declared with a return value (``-> T``) is refused when decorated."""
    if returns is not None:
        raise QuadrantsSyntaxError(f"kernel '{name}': a graph=True kernel cannot return a value (a graph replay "
                                   "reads nothing back); write the result to a field or ndarray instead")


def derivative_error(name: str, what: str) -> QuadrantsSyntaxError:
    """``kernel.grad`` / ``kernel.forward_mode`` (``what``) of a graph kernel: graphs are primal only."""
    return QuadrantsSyntaxError(f"kernel '{name}': {what} is not supported for graph=True kernels (graphs capture "
                                "the primal kernel only); differentiate a copy of the kernel without graph=True")


def tape_error(name: str) -> QuadrantsRuntimeError:
    """A graph kernel called while a ``qd.ad.Tape`` (or ``qd.ad.FwdMode``) records."""
    return QuadrantsRuntimeError(f"kernel '{name}': graph=True kernels cannot be recorded by qd.ad.Tape/FwdMode "
                                 "(graphs capture the primal kernel only); call a copy without graph=True there")


def stream_error(name: str) -> QuadrantsRuntimeError:
    """``qd_stream=`` on a graph kernel (refused, as in Quadrants: the graph replays on the
    default stream)."""
    return QuadrantsRuntimeError(f"kernel '{name}': qd_stream= is not compatible with graph=True kernels (the graph "
                                 "replays on the default stream); call it without qd_stream=, or order it with "
                                 "events")
