"""``qd.randn(dt=None)``: a standard normal random number (mean 0, variance 1) by the Box-Muller
transform of two ``qd.random`` draws, so it is as reproducible as ``qd.random`` (same seed, same
numbers, on every backend). A ``@qd.func`` (inlined, as ``qd.random`` needs its call sites in the
kernel); without ``dt`` the default float type, as ``qd.random()``. Kernels and qd.funcs only.
"""

from __future__ import annotations

import math

from ..frontend.objects import func
from ..lang import random
from .elementwise import cos, log, sqrt


@func
def randn(dt=None):
    u1 = 1.0 - random(dt)   # in (0, 1]: log(u1) is finite
    u2 = random(dt)
    return sqrt(-2.0 * log(u1)) * cos(math.tau * u2)
