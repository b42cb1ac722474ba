"""Typing an ``@intrinsic`` call: a signature typed before is returned without first refreshing
the target context.

Numba's intrinsic template (``_IntrinsicTemplate.generic``, the same code in Numba 0.68 and
numba-cuda 0.30.4) asks for the target registry before it looks in its own cache, and asking
refreshes the target context: every registry is walked again for new registrations. So every
typing of every intrinsic call paid a full refresh, even when the signature was typed before;
qd_numba's kernels are made of intrinsic calls (field views, spaces, atomics), and a 32-task CUDA
kernel paid ~19,000 registry installs for it (bench/results/session8.md). With this, a cached
signature is returned at once; a new one still goes through the original method, which
refreshes, types, caches and registers the lowering as before. What a refresh would have loaded
is loaded at the next new signature or the next compile (each compile refreshes both contexts).
"""

from __future__ import annotations


def return_cached_signatures_first(template_class) -> None:
    """Patch ``template_class.generic`` (an ``_IntrinsicTemplate``) to look in the template's
    signature cache before anything else. Idempotent."""
    original = template_class.generic
    if getattr(original, "qd_cached_first", False):
        return

    def generic(self, args, kws):
        try:
            return self._impl_cache[self.context, args, tuple(kws.items())]
        except KeyError:
            return original(self, args, kws)

    generic.qd_cached_first = True
    generic.__doc__ = original.__doc__
    template_class.generic = generic


def install_core() -> None:
    from numba.core.typing import templates

    return_cached_signatures_first(templates._IntrinsicTemplate)


def install_cuda() -> None:
    from numba.cuda.typing import templates

    return_cached_signatures_first(templates._IntrinsicTemplate)
