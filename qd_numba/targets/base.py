"""The Target interface: what a backend provides, and the registry that finds one by arch.

A :class:`Target` (one per arch, made on first use) compiles and runs kernels and owns the
storage of fields and ndarrays. The kernel front end (kernel.py) knows no target: it asks the
registry for the current arch's target and gets, per kernel, a :class:`KernelBackend` — that
target's compiled instances of the kernel and its generated call path.

Adding a backend means implementing these two classes and adding a row to ``_REGISTRY``; the
front end, the passes and the Task list are shared.
"""

from __future__ import annotations

import importlib
import threading

_REGISTRY = {
    "cpu": ("qd_numba.targets.cpu_target", "CpuTarget"),
    "cuda": ("qd_numba.targets.cuda", "CudaTarget"),
    "amdgpu": ("qd_numba.targets.amdgpu", "AmdgpuTarget"),
}
_targets: dict = {}
_lock = threading.Lock()


class KernelBackend:
    """One kernel on one target: its compiled instances and its call path."""

    arch: str

    def make_caller(self):
        """The kernel's ``__call__`` for this target (generated per kernel: parameters named as
        the kernel's, so CPython binds keywords; misses and bad calls go to ``Kernel``)."""
        raise NotImplementedError

    def call(self, *args):
        """Run the kernel on arguments already bound to its parameters (the checked path)."""
        raise NotImplementedError

    def call_on_stream(self, handle: int, args):
        """:meth:`call` on the GPU stream ``handle`` (non-zero; ``qd_stream=``, streams.py).
        Targets without streams run the kernel as :meth:`call` does, synchronously."""
        return self.call(*args)

    def do_while_loop(self, kernel):
        """The device-side runner of the ``qd.graph.do_while`` kernel ``kernel`` (graph.py
        ``DoWhileKernel``) whose first part is this kernel: ``run(args) -> bool``, False when it
        left the call to the host-side loop; None: the host-side loop always."""
        return None

    def tasks(self, args) -> list:
        """The Tasks of the instance these bound arguments select (compiling it if needed)."""
        raise NotImplementedError

    def compiled_count(self) -> int:
        """How many compiled instances of the kernel this backend holds."""
        raise NotImplementedError

    def tasks_and_fields(self, args):
        """The Tasks of the instance these arguments select (with their accesses) and its fields
        in hidden-argument order (``qd.ad.Tape(validation=True)`` reads which fields a call
        reads); also for an instance loaded from the offline cache."""
        raise NotImplementedError


class Target:
    """One backend."""

    arch: str
    codegen_stages: tuple = ()      # what it does after the shared untyped pipeline (for QD_DUMP_IR)
    dlpack_device_type: int = 1     # DLPack's device type of what dlpack_buffer gives (1: kDLCPU)

    def kernel_backend(self, kernel) -> KernelBackend:
        raise NotImplementedError

    def place(self, data) -> None:
        """Give a new field or qd.ndarray its storage on this target (nothing for host memory)."""

    def synchronize(self) -> None:
        """Wait for all work this target has started (``qd.sync()``)."""

    def open(self, cfg) -> None:
        """``qd.init`` chose this target, with the configuration ``cfg`` it is installing: check
        that it can run here and make its device ready (CUDA: ``cfg.device_id``), so that a
        missing device is an error of ``qd.init`` (QuadrantsRuntimeError)."""

    def dlpack_buffer(self, data, stream, copy) -> tuple[int, int, object] | None:
        """A DLPack export of ``data``'s device buffer (dlpack.py): (pointer, device id, what
        keeps it alive), ordered before the consumer's ``stream``; a copy when ``copy``. None:
        its data is host memory (every target without devices)."""
        return None

    def configure(self, cfg) -> None:
        """``qd.init`` installed ``cfg`` with this target: apply the device settings it holds
        (CUDA: ``cuda_stack_limit``). Nothing by default."""


def target_for(arch: str) -> Target:
    """The target of ``arch`` (made once per process)."""
    target = _targets.get(arch)
    if target is None:
        if arch not in _REGISTRY:
            from ..errors import QuadrantsRuntimeError

            raise QuadrantsRuntimeError(f"no qd_numba target for arch {arch!r}; targets: {', '.join(_REGISTRY)}")
        with _lock:
            target = _targets.get(arch)
            if target is None:
                module, name = _REGISTRY[arch]
                target = _targets[arch] = getattr(importlib.import_module(module), name)()
    return target
