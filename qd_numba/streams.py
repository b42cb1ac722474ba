"""Explicit streams and events: ``qd.create_stream``, ``qd.create_event``, ``qd_stream=``.

A :class:`Stream` or :class:`Event` holds a CUDA driver handle (an int) created on the CUDA target;
on other targets it holds 0 and every method does nothing (kernels there run synchronously). A
kernel call with ``qd_stream=s`` leaves the generated ``__call__`` through its unknown-keyword
branch (kernel.py), so calls without it pay nothing; :func:`call_on_stream` checks the call and
hands the stream's handle to the backend's ``call_on_stream``.

``qd_stream=`` takes a :class:`Stream`, a raw handle (int), or another library's stream object:
anything with ``__cuda_stream__`` (the CUDA stream protocol), a torch stream (``cuda_stream``), a
cupy stream (``ptr``) or a numba-cuda stream (``handle``). Streams this module creates are
*blocking* streams: CUDA orders them with the legacy default stream, which qd_numba's copies use.
A non-blocking stream (torch's pool streams) gets the same order from the CUDA target, which
fences it with the legacy stream around the launch (docs/guide/gpu.md).
"""

from __future__ import annotations

from . import config
from .errors import QuadrantsRuntimeError, QuadrantsTypeError
from .graph import stream_error


def _cuda_runtime():
    """The CUDA runtime when the current arch is CUDA, else None (streams are no-ops)."""
    if config.current.arch != "cuda":
        return None
    from .targets.cuda.runtime import CudaRuntime

    return CudaRuntime.get()


class Stream:
    """A GPU stream for kernels that may run concurrently with others (``qd_stream=``).

    ``Stream(handle)`` wraps a stream made elsewhere (never destroyed by qd_numba);
    :func:`create_stream` makes one that :meth:`destroy` (or leaving a ``with`` block) frees."""

    def __init__(self, handle: int = 0, owned: bool = False):
        self._handle = int(handle)
        self._owned = owned
        self._destroyed = False

    @property
    def handle(self) -> int:
        """The driver handle (``CUstream`` as an int; 0: the legacy default stream)."""
        return self._handle

    def synchronize(self) -> None:
        """Wait until all work queued on this stream has finished."""
        rt = _cuda_runtime()
        if rt is not None:
            rt.stream_synchronize(self._handle)

    def destroy(self) -> None:
        """Free a stream :func:`create_stream` made (queued work still completes); calling it
        again, or on a wrapped stream, does nothing. A destroyed stream cannot launch."""
        if self._owned and self._handle:
            rt = _cuda_runtime()
            if rt is not None:
                rt.stream_destroy(self._handle)
        self._handle, self._owned = 0, False
        self._destroyed = True

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<qd.Stream handle={self._handle:#x}>"


class Event:
    """A marker in a stream's work, to order another stream (or the host) after it."""

    def __init__(self, handle: int = 0, owned: bool = False):
        self._handle = int(handle)
        self._owned = owned
        self._destroyed = False

    @property
    def handle(self) -> int:
        return self._handle

    def record(self, qd_stream=None) -> None:
        """Mark the point after the work queued so far on ``qd_stream`` (None: the legacy
        default stream)."""
        event, stream = self._live("record"), stream_handle(qd_stream, "Event.record")
        rt = _cuda_runtime()
        if rt is not None:
            rt.event_record(event, stream)

    def wait(self, qd_stream=None) -> None:
        """Make the work queued later on ``qd_stream`` (None: the legacy default stream) wait
        until this event's point is reached; the host does not wait."""
        event, stream = self._live("wait"), stream_handle(qd_stream, "Event.wait")
        rt = _cuda_runtime()
        if rt is not None:
            rt.stream_wait_event(stream, event)

    def synchronize(self) -> None:
        """Wait on the host until this event's point is reached (at once if never recorded)."""
        event = self._live("synchronize")
        rt = _cuda_runtime()
        if rt is not None:
            rt.event_synchronize(event)

    def destroy(self) -> None:
        """Free an event :func:`create_event` made; calling it again does nothing."""
        if self._owned and self._handle:
            rt = _cuda_runtime()
            if rt is not None:
                rt.event_destroy(self._handle)
        self._handle, self._owned = 0, False
        self._destroyed = True

    def _live(self, what: str) -> int:
        if self._destroyed:
            raise QuadrantsRuntimeError(f"Event.{what}: the event was destroyed")
        return self._handle

    def __enter__(self) -> Event:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<qd.Event handle={self._handle:#x}>"


def create_stream() -> Stream:
    """A new stream (CUDA: a blocking stream; other targets: a no-op stream)."""
    rt = _cuda_runtime()
    return Stream(rt.stream_create(), owned=True) if rt is not None else Stream()


def create_event() -> Event:
    """A new event (CUDA: without timing; other targets: a no-op event)."""
    rt = _cuda_runtime()
    return Event(rt.event_create(), owned=True) if rt is not None else Event()


def stream_handle(stream, where: str) -> int:
    """The driver handle of a ``qd_stream=`` value (None: 0, the legacy default stream)."""
    if stream is None:
        return 0
    if type(stream) is Stream:
        if stream._destroyed:
            raise QuadrantsRuntimeError(f"{where}: qd_stream= is a destroyed stream")
        return stream.handle
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise QuadrantsTypeError(f"{where}: qd_stream= handle {stream} is negative")
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    for attr in ("cuda_stream", "ptr", "handle"):   # torch, cupy, numba-cuda
        value = getattr(stream, attr, None)
        if value is not None:
            value = getattr(value, "value", value)   # numba-cuda's handle: a ctypes c_void_p
            return int(value or 0)
    raise QuadrantsTypeError(f"{where}: qd_stream= takes a qd.Stream, a raw stream handle (int), or a torch/cupy/"
                             f"numba-cuda stream; got {type(stream).__name__}")


def call_on_stream(kernel, stream, args):
    """Run ``kernel`` (its arguments bound) on ``stream``; refused for derivative kernels (a
    recording ``qd.ad.Tape`` refuses ``qd_stream=`` itself: :func:`tape_error`)."""
    where = f"kernel '{kernel.name}'"
    if kernel.autodiff_mode is not None and stream is not None:
        raise QuadrantsRuntimeError(f"{where}: qd_stream= is not supported for derivative kernels (kernel.grad, "
                                    "forward mode); launch it without qd_stream=")
    if kernel.graph and stream is not None:
        raise stream_error(kernel.name)
    handle = stream_handle(stream, where)
    backend = kernel.backend()
    return backend.call(*args) if handle == 0 else backend.call_on_stream(handle, args)


def tape_error(kernel) -> QuadrantsRuntimeError:
    """The error of a ``qd_stream=`` call while a ``qd.ad.Tape`` records (its gradient kernels
    replay on the default stream, so the recorded calls must run there too)."""
    return QuadrantsRuntimeError(f"kernel '{kernel.name}': qd_stream= is not supported inside a qd.ad.Tape; launch "
                                 "the kernel outside the Tape, or without qd_stream=")
