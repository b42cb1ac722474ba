"""The functions of ``qd.math`` that are compositions of other qd operations (GLSL-style helpers,
transforms, complex numbers as 2d vectors), and ``qd.zero``/``qd.one``.

Each is one plain Python function, written with qd operations, that serves both scopes: called
from Python it runs on numbers and ``qd.Matrix`` values; in compiled code (kernels, funcs,
``@numba.njit``) Numba compiles the same function (each is registered as its own overload by
:func:`compiled_as_itself`), so the two scopes cannot disagree. Dtypes follow the operators'
rules; the transform builders (``translate`` ... ``vdir``) give ``f32`` matrices, as Quadrants'
``mat4``/``vec2`` with its default ``default_fp``.
"""

from __future__ import annotations

import math

from numba.core import types
from numba.extending import overload

from ..dtypes import f32 as _F32
from ..dtypes import u32 as _U32
from ..matrix import Matrix, Vector
from .elementwise import atan2, cast, clamp, cos, exp, floor, log, pow, sin, sqrt

e, pi, inf, nan = math.e, math.pi, math.inf, math.nan


def compiled_as_itself(fn):
    """Register ``fn`` so that compiled code calling it compiles ``fn`` itself."""
    def typer(*args, **kws):
        return fn

    overload(fn, strict=False)(typer)
    return fn


def zero(x):
    """Zeros of the shape and type of ``x`` (``x * 0``, as Quadrants)."""
    return x * 0


def one(x):
    """Ones of the shape and type of ``x`` (``x * 0 + 1``, as Quadrants)."""
    return x * 0 + 1


def mix(x, y, a):
    """Linear interpolation ``x * (1 - a) + y * a``, elementwise."""
    return x * (1.0 - a) + y * a


def smoothstep(edge0, edge1, x):
    """Hermite interpolation between 0 and 1 for ``edge0 < x < edge1``, elementwise."""
    t = clamp((x - edge0) / (edge1 - edge0), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def mod(x, y):
    """``x - y * floor(x / y)`` (the result has the sign of ``y``), elementwise."""
    return x - y * floor(x / y)


def degrees(x):
    return x * (180.0 / math.pi)


def radians(x):
    return x * (math.pi / 180.0)


def dot(x, y):
    return x.dot(y)


def cross(x, y):
    return x.cross(y)


def length(x):
    return x.norm()


def distance(x, y):
    return (x - y).norm()


def normalize(v):
    return v / v.norm()


def determinant(m):
    return m.determinant()


def inverse(m):
    return m.inverse()


def reflect(x, n):
    """The reflection of the incident ``x`` at the surface with normal ``n``: ``x - 2 (x.n) n``."""
    return x - 2.0 * x.dot(n) * n


def refract(x, n, eta):
    """The refraction of the incident ``x`` at the normal ``n`` with index ratio ``eta``
    (zero for total internal reflection)."""
    dxn = x.dot(n)
    result = zero(x)
    k = 1.0 - eta * eta * (1.0 - dxn * dxn)
    if k >= 0.0:
        result = eta * x - (eta * dxn + sqrt(k)) * n
    return result


def translate(dx, dy, dz):
    """The 4x4 homogeneous translation by ``(dx, dy, dz)``."""
    return Matrix([[1.0, 0.0, 0.0, dx], [0.0, 1.0, 0.0, dy], [0.0, 0.0, 1.0, dz], [0.0, 0.0, 0.0, 1.0]],
                  dt=_F32)


def scale(sx, sy, sz):
    """The 4x4 homogeneous scaling by ``(sx, sy, sz)``."""
    return Matrix([[sx, 0.0, 0.0, 0.0], [0.0, sy, 0.0, 0.0], [0.0, 0.0, sz, 0.0], [0.0, 0.0, 0.0, 1.0]],
                  dt=_F32)


def rot_by_axis(axis, ang):
    """The 4x4 homogeneous rotation by ``ang`` (radians) about ``axis``."""
    c, s = cos(ang), sin(ang)
    a = normalize(axis)
    t = (1 - c) * a
    return Matrix([[c + t[0] * a[0], t[0] * a[1] + s * a[2], t[0] * a[2] - s * a[1], 0.0],
                   [t[1] * a[0] - s * a[2], c + t[1] * a[1], t[1] * a[2] + s * a[0], 0.0],
                   [t[2] * a[0] + s * a[1], t[2] * a[1] - s * a[0], c + t[2] * a[2], 0.0],
                   [0.0, 0.0, 0.0, 1.0]], dt=_F32)


def rot_yaw_pitch_roll(yaw, pitch, roll):
    """The 4x4 homogeneous rotation by Euler angles: about Y (yaw), then X (pitch), then Z (roll)."""
    ch, sh, cp, sp, cb, sb = cos(yaw), sin(yaw), cos(pitch), sin(pitch), cos(roll), sin(roll)
    return Matrix([[ch * cb + sh * sp * sb, sb * cp, -sh * cb + ch * sp * sb, 0.0],
                   [-ch * sb + sh * sp * cb, cb * cp, sb * sh + ch * sp * cb, 0.0],
                   [sh * cp, -sp, ch * cp, 0.0],
                   [0.0, 0.0, 0.0, 1.0]], dt=_F32)


def rotation2d(ang):
    """The 2x2 counter-clockwise rotation by ``ang`` (radians)."""
    c, s = cos(ang), sin(ang)
    return Matrix([[c, -s], [s, c]], dt=_F32)


def rotation3d(ang_x, ang_y, ang_z):
    """``rot_yaw_pitch_roll(ang_z, ang_x, ang_y)``, as Quadrants."""
    return rot_yaw_pitch_roll(ang_z, ang_x, ang_y)


def vdir(ang):
    """The 2d unit vector at angle ``ang`` (radians)."""
    return Vector([cos(ang), sin(ang)], dt=_F32)


def fns(mask, base, offset):
    """The position of the ``|offset|``-th set bit of the 32-bit ``mask``, scanning up
    (``offset > 0``) or down (``offset < 0``) from bit ``base`` (inclusive); ``offset == 0``:
    ``base`` if that bit is set. ``0xFFFFFFFF`` (a ``u32``) when there is no such bit (CUDA's
    ``__fns``; a 32-step loop on every target)."""
    m, b, n = int(mask) & 0xFFFFFFFF, int(base), int(offset)
    result = -1
    if n == 0:
        if b < 32 and (m >> b) & 1 != 0:
            result = b
    else:
        count = n if n > 0 else -n
        for k in range(32):
            i = k if n > 0 else 31 - k
            if result < 0 and (i >= b if n > 0 else i <= b) and (m >> i) & 1 != 0:
                count -= 1
                if count == 0:
                    result = i
    return cast(result & 0xFFFFFFFF, _U32)


# -- complex numbers as 2d vectors ``(re, im)`` (results are ``f32`` vectors, as Quadrants' vec2) -------

def _c(re, im):
    return Vector([re, im], dt=_F32)


def cmul(z1, z2):
    return _c(z1[0] * z2[0] - z1[1] * z2[1], z1[0] * z2[1] + z2[0] * z1[1])


def cconj(z):
    return _c(z[0], -z[1])


def cdiv(z1, z2):
    d = z2[0] * z2[0] + z2[1] * z2[1]
    return _c((z1[0] * z2[0] + z1[1] * z2[1]) / d, (z2[0] * z1[1] - z1[0] * z2[1]) / d)


def cinv(z):
    d = z[0] * z[0] + z[1] * z[1]
    return _c(z[0] / d, -z[1] / d)


def csqrt(z):
    """The square root with a positive real part (non-negative imaginary part on the axis); 0 for 0."""
    result = _c(0.0, 0.0)
    if z[0] != 0 or z[1] != 0:
        r, a = sqrt(sqrt(z[0] * z[0] + z[1] * z[1])), atan2(z[1], z[0]) / 2.0
        result = _c(r * cos(a), r * sin(a))
    return result


def cpow(z, n):
    """``z ** n`` (principal branch; real ``n``); 0 for ``z == 0``."""
    result = _c(0.0, 0.0)
    if z[0] != 0 or z[1] != 0:
        r, a = pow(z[0] * z[0] + z[1] * z[1], n / 2.0), atan2(z[1], z[0]) * n
        result = _c(r * cos(a), r * sin(a))
    return result


def cexp(z):
    r = exp(z[0])
    return _c(r * cos(z[1]), r * sin(z[1]))


def clog(z):
    """The principal logarithm: ``(log |z|, arg z)``, the argument in (-pi, pi]."""
    return _c(log(z[0] * z[0] + z[1] * z[1]) / 2.0, atan2(z[1], z[0]))


def eye(n):
    """The ``n`` x ``n`` identity (``f32``); ``n`` a constant."""
    return Matrix.identity(_F32, n)


@overload(eye, prefer_literal=True)
def _eye(n):
    if not isinstance(n, types.IntegerLiteral):
        return None
    size = n.literal_value
    return lambda n: Matrix.identity(_F32, size)


FUNCS = (zero, one, mix, smoothstep, mod, degrees, radians, dot, cross, length, distance, normalize,
         determinant, inverse, reflect, refract, translate, scale, rot_by_axis, rot_yaw_pitch_roll,
         rotation2d, rotation3d, vdir, fns, _c, cmul, cconj, cdiv, cinv, csqrt, cpow, cexp, clog)
for _fn in FUNCS:
    compiled_as_itself(_fn)
