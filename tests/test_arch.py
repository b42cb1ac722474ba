"""Arch names: ``qd.x64``/``qd.x86_64``/``qd.arm64`` are the CPU on a host of that kind (our error
naming the host elsewhere); Quadrants' ``qd.metal``/``qd.vulkan`` are not backends of qd_numba."""

from __future__ import annotations

import platform

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config


@pytest.fixture(autouse=True)
def back_to_the_suite_arch(arch):
    yield
    qd.init(arch=arch)


@qd.kernel
def double(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        a[i] = 2 * a[i]


def _runs_on_the_cpu(rng):
    assert config.current.arch == "cpu"
    a = rng.uniform(-1, 1, 64).astype(np.float32)
    ref = 2 * a
    double(a)
    np.testing.assert_array_equal(a, ref)


@pytest.mark.parametrize("machine, arch_name", [("x86_64", "x64"), ("AMD64", "x86_64"), ("aarch64", "arm64"),
                                                ("arm64", "arm64")])
def test_cpu_arch_names_on_a_matching_host(monkeypatch, rng, machine, arch_name):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    qd.init(arch=getattr(qd, arch_name))
    _runs_on_the_cpu(rng)


@pytest.mark.parametrize("machine, arch_name", [("x86_64", "arm64"), ("aarch64", "x64"), ("ppc64le", "x64")])
def test_cpu_arch_names_on_another_host_name_the_host(monkeypatch, machine, arch_name):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    before = config.current
    with pytest.raises(qd.QuadrantsRuntimeError, match=rf"host's CPU is {machine}, not {arch_name}.*use qd.cpu"):
        qd.init(arch=getattr(qd, arch_name))
    assert config.current is before


def test_this_host(rng):
    """The real host: its own name works, the other one raises."""
    machine = platform.machine().lower()
    mine = {"x86_64": qd.x64, "amd64": qd.x64, "aarch64": qd.arm64, "arm64": qd.arm64}.get(machine)
    for name in (qd.x64, qd.arm64):
        if name == mine:
            qd.init(arch=name)
            _runs_on_the_cpu(rng)
        else:
            with pytest.raises(qd.QuadrantsRuntimeError, match=platform.machine()):
                qd.init(arch=name)


def test_arch_name_from_the_environment(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("QD_ARCH", "arm64")
    with pytest.raises(qd.QuadrantsRuntimeError, match="host's CPU is x86_64"):
        qd.init()


@pytest.mark.parametrize("name, what", [("metal", "Apple Metal"), ("vulkan", "Vulkan")])
def test_quadrants_backends_qd_numba_does_not_have(name, what):
    with pytest.raises(qd.QuadrantsRuntimeError,
                       match=rf"qd.init\(arch=qd.{name}\): {what} is a Quadrants backend but not a backend of "
                             r"qd_numba; its backends are qd.cpu .*qd.cuda, qd.gpu .*qd.amdgpu"):
        qd.init(arch=getattr(qd, name))
