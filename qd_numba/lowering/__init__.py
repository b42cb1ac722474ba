"""Lowering of qd types and intrinsics; importing this package registers every extension."""

from . import field, matrix, spaces, subscripts  # noqa: F401
