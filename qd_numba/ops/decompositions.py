"""Small dense linear algebra: ``qd.svd``, ``qd.polar_decompose`` (2x2 and 3x3), ``qd.sym_eig``,
``qd.make_spd`` (2x2 to 6x6), all by Jacobi rotations, ``qd.eig`` (2x2) and ``qd.solve`` (2x2 and
3x3).

As ops/math_funcs.py, every function is plain Python written with qd operations and serves both
scopes (compiled code compiles the same function). The public entries pick the body for the
matrix's size (in compiled code, once at typing).

* ``sym_eig(A)`` -> ``(eigenvalues, eigenvectors)``: cyclic two-sided Jacobi on the symmetric
  ``A`` (``A <- J^T A J``, ``V <- V J``); eigenvalues ascending (a vector), eigenvectors the
  columns of an orthogonal matrix. 2x2 is one rotation; 3x3 to 6x6 share one body
  (:data:`SYM_EIG_SWEEPS` sweeps, its loops not unrolled, so compile time grows little with the
  size).
* ``svd(A)`` -> ``(U, S, V)`` with ``A = U S V^T``: one-sided Jacobi (Hestenes) orthogonalises the
  columns of ``A V``; ``S`` is diagonal, descending in magnitude. ``U`` and ``V`` are rotations
  (determinant +1), so the last singular value carries the sign of ``det(A)``, as Quadrants'.
* ``polar_decompose(A)`` -> ``(R, P)`` with ``A = R P``: ``R = U V^T`` a rotation, ``P = V S V^T``
  symmetric.
* ``make_spd(A)``: the nearest symmetric positive semi-definite matrix, ``Q diag(max(w, 0)) Q^T``.
* ``eig(A)`` (2x2): eigenvalues and eigenvectors of a real matrix, complex as ``(re, im)`` pairs.
* ``solve(A, b)``: ``x`` with ``A x = b``, from ``A``'s inverse (closed form for these sizes).

The number of sweeps is fixed (:data:`SWEEPS`, :data:`SYM_EIG_SWEEPS`: Jacobi converges
quadratically; this many leave the off-diagonal at rounding level for f64), so the code has no
data-dependent loop bound on the GPU. Arithmetic stays in the matrix's float dtype (``dt``: ``f32``
for integer matrices).
"""

from __future__ import annotations

from numba.extending import overload

from ..dtypes import f32, f64, i32
from ..matrix import Matrix, Vector
from .elementwise import cast, sqrt
from .elementwise import max as elementwise_max
from .math_funcs import compiled_as_itself

SWEEPS = 8
SYM_EIG_SWEEPS = 12   # up to 6x6: Quadrants' count, f64 rounding level for every size
SYM_EIG_MAX_N = 6


def _sign1(x):
    """1 for ``x >= 0``, else -1 (the rotation formulas need a sign that is never 0)."""
    return 1 if x >= 0 else -1


def _rotation(app, aqq, apq, one):
    """``(c, s)`` of the Jacobi rotation zeroing ``apq`` of ``[[app, apq], [apq, aqq]]``."""
    c, s = one, one * 0
    if apq != 0:
        theta = (aqq - app) / (2 * one * apq)
        if abs(theta) > one:   # sign(theta) / (|theta| + sqrt(theta^2 + 1)) without squaring a big theta
            r = one / theta
            t = r / (one + sqrt(one + r * r))
        else:
            t = _sign1(theta) * one / (abs(theta) + sqrt(theta * theta + one))
        c = one / sqrt(t * t + one)
        s = t * c
    return c, s


def _orthogonalise(up, uq, vp, vq, one):
    """One-sided Jacobi: rotate columns ``up, uq`` (and ``vp, vq`` of V) to be orthogonal."""
    c, s = _rotation(up.dot(up), uq.dot(uq), up.dot(uq), one)
    return c * up - s * uq, s * up + c * uq, c * vp - s * vq, s * vp + c * vq


def _cols2(a, b):
    return Matrix([[a[0], b[0]], [a[1], b[1]]])


def _cols3(a, b, c):
    return Matrix([[a[0], b[0], c[0]], [a[1], b[1], c[1]], [a[2], b[2], c[2]]])


def _svd2(A, one):
    u0, u1 = Vector([A[0, 0], A[1, 0]]), Vector([A[0, 1], A[1, 1]])
    v0, v1 = Vector([one, one * 0]), Vector([one * 0, one])
    for _ in range(2):
        u0, u1, v0, v1 = _orthogonalise(u0, u1, v0, v1, one)
    s0, s1 = u0.norm(), u1.norm()
    if s0 < s1:
        s0, s1, u0, u1, v0, v1 = s1, s0, u1, u0, v1, v0
    n0 = u0 / s0 if s0 > 0 else Vector([one, one * 0])
    n1 = Vector([-n0[1], n0[0]])            # the rotation's second column
    if u1.dot(n1) < 0:
        s1 = -s1
    if v0[0] * v1[1] - v0[1] * v1[0] < 0:   # V a reflection: flip its last column and s1
        v1, s1 = -v1, -s1
    return _cols2(n0, n1), Matrix([[s0, one * 0], [one * 0, s1]]), _cols2(v0, v1)


def _svd3(A, one):
    zero = one * 0
    u0 = Vector([A[0, 0], A[1, 0], A[2, 0]])
    u1 = Vector([A[0, 1], A[1, 1], A[2, 1]])
    u2 = Vector([A[0, 2], A[1, 2], A[2, 2]])
    v0, v1, v2 = Vector([one, zero, zero]), Vector([zero, one, zero]), Vector([zero, zero, one])
    for _ in range(SWEEPS):
        u0, u1, v0, v1 = _orthogonalise(u0, u1, v0, v1, one)
        u0, u2, v0, v2 = _orthogonalise(u0, u2, v0, v2, one)
        u1, u2, v1, v2 = _orthogonalise(u1, u2, v1, v2, one)
    s0, s1, s2 = u0.norm(), u1.norm(), u2.norm()
    if s0 < s1:
        s0, s1, u0, u1, v0, v1 = s1, s0, u1, u0, v1, v0
    if s0 < s2:
        s0, s2, u0, u2, v0, v2 = s2, s0, u2, u0, v2, v0
    if s1 < s2:
        s1, s2, u1, u2, v1, v2 = s2, s1, u2, u1, v2, v1
    n0 = u0 / s0 if s0 > 0 else Vector([one, zero, zero])
    n1 = u1 / s1 if s1 > s0 * 1e-30 else _any_orthogonal(n0, one)
    n2 = n0.cross(n1)                       # U a rotation: its last column is fixed
    if u2.dot(n2) < 0:
        s2 = -s2
    if v0.cross(v1).dot(v2) < 0:            # V a reflection: flip its last column and s2
        v2, s2 = -v2, -s2
    return _cols3(n0, n1, n2), Matrix([[s0, zero, zero], [zero, s1, zero], [zero, zero, s2]]), _cols3(v0, v1, v2)


def _any_orthogonal(n, one):
    """A unit vector orthogonal to the unit vector ``n``."""
    a = Vector([one, one * 0, one * 0]) if abs(n[0]) < 0.9 else Vector([one * 0, one, one * 0])
    w = a - a.dot(n) * n
    return w / w.norm()


def _sym_eig2(A, one):
    c, s = _rotation(A[0, 0], A[1, 1], A[0, 1], one)
    J = Matrix([[c, s], [-s, c]])
    D = J.transpose() @ A @ J
    d0, d1, v0, v1 = D[0, 0], D[1, 1], Vector([c, -s]), Vector([s, c])
    if d1 < d0:
        d0, d1, v0, v1 = d1, d0, v1, v0
    return Vector([d0, d1]), _cols2(v0, v1)


def _sym_eig_n(A, one):
    """Cyclic Jacobi for any square size (Quadrants' sym_eig up to 6x6): each sweep rotates every
    pair ``p < q`` once (``J`` the identity but for ``c`` at ``(p, p)``, ``(q, q)``, ``s`` at
    ``(p, q)``, ``-s`` at ``(q, p)``); then the diagonal is sorted ascending by a permutation
    ``P`` (``P[k, rank(k)] = 1``) applied to both outputs."""
    n = A.n
    eye = Matrix.identity(i32, n) * one
    V = eye
    for _ in range(SYM_EIG_SWEEPS):
        for p in range(n - 1):
            for q in range(p + 1, n):
                c, s = _rotation(A[p, p], A[q, q], A[p, q], one)
                ep, eq = eye[p], eye[q]
                J = eye + (c - one) * (ep.outer_product(ep) + eq.outer_product(eq)) \
                    + s * (ep.outer_product(eq) - eq.outer_product(ep))
                A = J.transpose() @ A @ J
                V = V @ J
    d = eye[0] * 0
    for k in range(n):
        d = d + A[k, k] * eye[k]
    P = eye * 0
    for k in range(n):
        rank = 0
        for j in range(n):
            if d[j] < d[k] or (d[j] == d[k] and j < k):
                rank += 1
        P = P + eye[k].outer_product(eye[rank])
    return P.transpose() @ d, V @ P


def _make_spd2(A, one):
    w, Q = _sym_eig2(A, one)
    w = elementwise_max(w, one * 0)
    return Q @ Matrix([[w[0], one * 0], [one * 0, w[1]]]) @ Q.transpose()


def _make_spd_n(A, one):
    w, Q = _sym_eig_n(A, one)
    eye = Matrix.identity(i32, A.n) * one
    D = eye * 0
    for k in range(A.n):
        D = D + elementwise_max(w[k], one * 0) * eye[k].outer_product(eye[k])
    return Q @ D @ Q.transpose()


def _eigvec2(A, re, im, fallback, one):
    """A unit eigenvector (a 4-vector ``(re0, im0, re1, im1)``) of the eigenvalue that is not
    ``re + i im``: the larger column of ``A - (re + i im) I`` (Cayley-Hamilton); ``fallback`` when
    that matrix is zero (``A`` a multiple of the identity)."""
    zero = one * 0
    c0 = Vector([A[0, 0] - re, -im, A[1, 0], zero])
    c1 = Vector([A[0, 1], zero, A[1, 1] - re, -im])
    v = c0 if c0.norm_sqr() >= c1.norm_sqr() else c1
    return fallback if v.norm_sqr() == 0 else v / v.norm()


def _eig2(A, one):
    zero, half = one * 0, one / 2
    tr, det = A[0, 0] + A[1, 1], A[0, 0] * A[1, 1] - A[0, 1] * A[1, 0]
    gap = tr * tr - 4 * one * det
    root = sqrt(abs(gap))
    re1, im1, re2, im2 = (tr + root) * half, zero, (tr - root) * half, zero
    if gap < 0:
        re1, im1, re2, im2 = tr * half, root * half, tr * half, -root * half
    v1 = _eigvec2(A, re2, im2, Vector([zero, zero, one, zero]), one)
    v2 = _eigvec2(A, re1, im1, Vector([one, zero, zero, zero]), one)
    return (Matrix([[re1, im1], [re2, im2]]),
            Matrix([[v1[0], v2[0]], [v1[1], v2[1]], [v1[2], v2[2]], [v1[3], v2[3]]]))


def _polar2(A, one):
    U, S, V = _svd2(A, one)
    return U @ V.transpose(), V @ S @ V.transpose()


def _polar3(A, one):
    U, S, V = _svd3(A, one)
    return U @ V.transpose(), V @ S @ V.transpose()


for _fn in (_sign1, _rotation, _orthogonalise, _cols2, _cols3, _svd2, _svd3, _any_orthogonal, _sym_eig2,
            _sym_eig_n, _polar2, _polar3, _make_spd2, _make_spd_n, _eigvec2, _eig2):
    compiled_as_itself(_fn)

_BODIES = {"svd": {2: _svd2, 3: _svd3},
           "sym_eig": {2: _sym_eig2, **{n: _sym_eig_n for n in range(3, SYM_EIG_MAX_N + 1)}},
           "polar_decompose": {2: _polar2, 3: _polar3},
           "make_spd": {2: _make_spd2, **{n: _make_spd_n for n in range(3, SYM_EIG_MAX_N + 1)}},
           "eig": {2: _eig2}}


def _sizes(name):
    sizes = sorted(_BODIES[name])
    if len(sizes) > 2:
        return f"{sizes[0]}x{sizes[0]} to {sizes[-1]}x{sizes[-1]}"
    return " or ".join(f"{n}x{n}" for n in sizes)


def _float_type(dtype, dt):
    """The dtype the decomposition computes in: ``dt``, else the matrix's float type (f32 for ints)."""
    if dt is not None:
        return dt
    return dtype if dtype in (f32, f64) else f32


def _python_scope(name, A, dt):
    from ..dtypes import to_numba
    from ..errors import QuadrantsTypeError

    if not isinstance(A, Matrix) or A.ndim != 2 or A.n != A.m or A.n not in _BODIES[name]:
        got = f"a {A.n}x{A.m} matrix" if isinstance(A, Matrix) and A.ndim == 2 else repr(A)
        raise QuadrantsTypeError(f"qd.{name} takes a {_sizes(name)} matrix, got {got}")
    ft = _float_type(A.dtype, None if dt is None else to_numba(dt))
    return _BODIES[name][A.n](cast(A, ft), cast(1, ft))


def svd(A, dt=None):
    """``(U, S, V)`` with ``A = U @ S @ V.transpose()``: U, V rotations, S diagonal (2x2 or 3x3)."""
    return _python_scope("svd", A, dt)


def sym_eig(A, dt=None):
    """``(eigenvalues, eigenvectors)`` of the symmetric ``A``: a vector (ascending) and a matrix
    whose columns are the unit eigenvectors (2x2 to 6x6)."""
    return _python_scope("sym_eig", A, dt)


def polar_decompose(A, dt=None):
    """``(R, P)`` with ``A = R @ P``: R a rotation, P symmetric (2x2 or 3x3)."""
    return _python_scope("polar_decompose", A, dt)


def make_spd(A, dt=None):
    """The symmetric positive semi-definite matrix nearest to the symmetric ``A`` (Frobenius
    norm): ``Q @ diag(max(w, 0)) @ Q.transpose()`` from ``w, Q = sym_eig(A)`` (2x2 to 6x6)."""
    return _python_scope("make_spd", A, dt)


def eig(A, dt=None):
    """``(eigenvalues, eigenvectors)`` of a real 2x2 ``A``, complex numbers as ``(re, im)`` pairs:
    a 2x2 matrix whose rows are the eigenvalues (the larger real part, or positive imaginary
    part, first) and a 4x2 matrix whose columns are unit eigenvectors ``(re0, im0, re1, im1)``."""
    return _python_scope("eig", A, dt)


def solve(A, b, dt=None):
    """``x`` with ``A @ x == b`` for a 2x2 or 3x3 ``A`` and a vector ``b`` (by ``A``'s inverse)."""
    from ..dtypes import to_numba
    from ..errors import QuadrantsTypeError

    if not (isinstance(A, Matrix) and A.ndim == 2 and A.n == A.m and A.n in (2, 3)
            and isinstance(b, Vector) and b.n == A.n):
        raise QuadrantsTypeError(f"qd.solve takes a 2x2 or 3x3 matrix and a vector of its size, got {A!r}, {b!r}")
    ft = _float_type(A.dtype, None if dt is None else to_numba(dt))
    return cast(A, ft).inverse() @ cast(b, ft)


@overload(solve)
def _solve(A, b, dt=None):
    from ..errors import QuadrantsTypeError, typing_error
    from ..typing.matrix import MatrixType, dtype_arg

    if not (isinstance(A, MatrixType) and A.ndim == 2 and A.n == A.m and A.n in (2, 3)
            and isinstance(b, MatrixType) and b.ndim == 1 and b.n == A.n):
        raise typing_error(QuadrantsTypeError(
            f"qd.solve takes a 2x2 or 3x3 matrix and a vector of its size, got {A}, {b}"))
    ft = _float_type(A.dtype, dtype_arg(dt, "dt"))

    def impl(A, b, dt=None):
        return cast(A, ft).inverse() @ cast(b, ft)
    return impl


def _register(public, name):
    from ..errors import QuadrantsTypeError, typing_error
    from ..typing.matrix import MatrixType, dtype_arg

    @overload(public)
    def typer(A, dt=None):
        if not (isinstance(A, MatrixType) and A.ndim == 2 and A.n == A.m and A.n in _BODIES[name]):
            raise typing_error(QuadrantsTypeError(f"qd.{name} takes a {_sizes(name)} matrix, got {A}"))
        ft = _float_type(A.dtype, dtype_arg(dt, "dt"))
        body = _BODIES[name][A.n]

        def impl(A, dt=None):
            return body(cast(A, ft), cast(1, ft))
        return impl


for _public in (svd, sym_eig, polar_decompose, make_spd, eig):
    _register(_public, _public.__name__)
