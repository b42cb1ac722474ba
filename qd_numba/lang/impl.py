"""``qd.lang.impl``: the runtime object and configuration queries of Quadrants' ``quadrants.lang.impl``.

``get_runtime()`` is the process's :class:`Runtime`: ``.prog.config()`` (and ``current_cfg()``,
and ``qd.cfg``) give the configuration in force as a read-only :class:`CompileConfig` under
Quadrants' option names; ``default_fp``/``default_ip``/``default_up``; ``set_default_fp/ip``;
``get_num_compiled_functions()``. A program that never called ``qd.init`` runs on the
configuration of the ``QD_*`` variables (the CPU), so the runtime always exists here (Quadrants
raises until ``qd.init``). Also re-exports the names of Quadrants' ``impl.__all__`` that qd_numba has.
"""

from __future__ import annotations

import dataclasses

from numba.core import types

from .. import config, runtime
from ..errors import QuadrantsConfigError
from ..field import field, ndarray  # noqa: F401  (Quadrants' impl exports them)
from ..kernel import compiled_count
from ..lowering.autodiff import stop_grad  # noqa: F401
from ..snode import axes, root  # noqa: F401  (Quadrants' impl.root, impl.axes)
from . import grouped, static, static_assert, static_print  # noqa: F401

_RENAMED = {"num_compile_threads": "compile_threads"}   # Quadrants' option name -> qd_numba's


class CompileConfig:
    """A read-only view of the configuration in force, under Quadrants' ``CompileConfig`` names:
    qd_numba's options by their name (``arch`` is ``"cpu"`` or ``"cuda"``, equal to ``qd.cpu``/
    ``qd.cuda``), and each accepted-but-ignored Quadrants option as passed to ``qd.init`` or else
    Quadrants' default (docs/configuration.md). Change options with ``qd.init``."""

    def __getattr__(self, name):
        cfg = config.current
        name = _RENAMED.get(name, name)
        if name == "default_up":
            return types.uint64 if cfg.default_ip == types.int64 else types.uint32
        if name != "quadrants_options" and name in {f.name for f in dataclasses.fields(cfg)}:
            return getattr(cfg, name)
        if name in config.QUADRANTS_IGNORED_OPTIONS:
            return cfg.quadrants_options.get(name, config.QUADRANTS_IGNORED_OPTIONS[name])
        raise AttributeError(f"qd.cfg has no option {name!r}")

    def __setattr__(self, name, value):
        raise QuadrantsConfigError(f"qd.cfg.{name}: the configuration is read-only here; "
                                   f"pass {name}=... to qd.init instead")

    def __dir__(self):
        names = {f.name for f in dataclasses.fields(config.current)} - {"quadrants_options"}
        return sorted(names | set(config.QUADRANTS_IGNORED_OPTIONS) | set(_RENAMED) | {"default_up"})

    def __repr__(self):
        return f"<qd.cfg arch={config.current.arch}>"


cfg = CompileConfig()
"""``qd.cfg``: the configuration in force."""


class Program:
    """What Quadrants' ``get_runtime().prog`` gives that means something here: ``config()``."""

    @staticmethod
    def config() -> CompileConfig:
        return cfg


class Runtime:
    """Quadrants' ``PyQuadrants``: the process's runtime (one; ``qd.init`` reconfigures it)."""

    prog = Program()

    @property
    def default_fp(self):
        return config.current.default_fp

    @property
    def default_ip(self):
        return config.current.default_ip

    @property
    def default_up(self):
        return cfg.default_up

    def set_default_fp(self, fp) -> None:
        """Make ``fp`` (qd.f16/f32/f64) the type of ``float`` from now on (kernels recompile)."""
        runtime.set_default_types(default_fp=fp)

    def set_default_ip(self, ip) -> None:
        """Make ``ip`` (qd.i32/i64) the type of ``int`` from now on (kernels recompile)."""
        runtime.set_default_types(default_ip=ip)

    @staticmethod
    def get_num_compiled_functions() -> int:
        """Compiled kernel instances held now (``qd.init``/``qd.reset`` drop them)."""
        return compiled_count()

    @staticmethod
    def sync() -> None:
        runtime.sync()


_RUNTIME = Runtime()


def get_runtime() -> Runtime:
    return _RUNTIME


def current_cfg() -> CompileConfig:
    """The configuration in force (``qd.cfg``)."""
    return cfg


def default_cfg() -> CompileConfig:
    """The configuration in force: qd_numba has no separate default configuration object."""
    return cfg


__all__ = ["field", "grouped", "ndarray", "static", "static_assert", "static_print", "stop_grad"]
