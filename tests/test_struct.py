"""Structs: ``qd.types.struct``, struct fields (``T.field``, ``qd.Struct.field``), struct values in
kernels and qd.funcs, ``@qd.dataclass`` with methods. Every kernel is also compiled for CUDA by
the suite (tests/conftest.py); references are numpy, on random data.
"""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd

vec3 = qd.types.vector(3, qd.f32)
Particle = qd.types.struct(m=qd.f32, v=vec3, id=qd.i32)
Body = qd.types.struct(p=Particle, w=qd.f64)


def _ndarray(dtype, ndim=1):
    return qd.types.ndarray(dtype=dtype, ndim=ndim)


# -- Python scope ------------------------------------------------------------------------------------------


def test_struct_values_and_fields_in_python_scope(rng):
    p = Particle(1.5, v=[1, 2, 3])
    assert p.m == 1.5 and p.id == 0 and np.array_equal(p.v.to_numpy(), [1, 2, 3])
    b = Body(p=p, w=2)
    assert b.p.m == 1.5 and b.w == 2.0
    n = 9
    s = Particle.field(shape=n)
    assert s.shape == (n,) and s.keys == ["m", "v", "id"]
    m, v, ids = rng.random(n, np.float32), rng.random((n, 3), np.float32), rng.integers(0, 100, n).astype(np.int32)
    s.from_numpy({"m": m, "v": v, "id": ids})
    d = s.to_numpy()
    assert np.array_equal(d["m"], m) and np.array_equal(d["v"], v) and np.array_equal(d["id"], ids)
    assert np.array_equal(s.v.to_numpy(), v)                 # a member is a field
    assert s[3].m == m[3] and np.array_equal(s[3].v.to_numpy(), v[3])
    s[4] = Particle(m=7.0, v=1.0, id=5)
    assert s.m[4] == 7.0 and np.array_equal(s.v[4], [1, 1, 1]) and s.id[4] == 5
    s.fill(2)
    assert all(np.all(a == 2) for a in s.to_numpy().values())
    f = qd.Struct.field({"a": qd.f32, "inner": {"b": qd.i32}}, shape=(2, 3))
    assert f.to_numpy()["inner"]["b"].shape == (2, 3)
    with pytest.raises(qd.QuadrantsTypeError, match="no member 'q'"):
        Particle(q=1.0)


# -- struct fields in kernels ----------------------------------------------------------------------------------


def test_struct_field_members_and_elements_in_kernels(rng):
    n = 64
    s = Particle.field(shape=n)
    t = Particle.field(shape=n)
    m, v = rng.random(n, np.float32), rng.standard_normal((n, 3)).astype(np.float32)
    s.from_numpy({"m": m, "v": v, "id": np.arange(n, dtype=np.int32)})
    out = np.zeros(n, np.float32)

    @qd.kernel
    def step(out: _ndarray(qd.f32), dt: qd.f32):
        for i in s:
            s[i].v += dt * s[i].v          # s[i].v: the member field v at i
            s.m[i] *= 2.0                  # the member field itself
            t[i] = s[i]                    # a whole element
            t[i].id = s[i].id * 3
            out[i] = s[i].v.norm() + t[i].m

    step(out, 0.5)
    v1 = v * 1.5
    assert np.allclose(s.v.to_numpy(), v1) and np.allclose(s.m.to_numpy(), 2 * m)
    d = t.to_numpy()
    assert np.allclose(d["v"], v1) and np.allclose(d["m"], 2 * m) and np.array_equal(d["id"], 3 * np.arange(n))
    assert np.allclose(out, np.linalg.norm(v1, axis=1) + 2 * m, rtol=1e-5)


def test_struct_field_member_update_is_atomic(rng):
    n, bins = 2000, 7
    hist = qd.types.struct(count=qd.i32, total=qd.f32).field(shape=bins)
    a = rng.random(n).astype(np.float32)
    k = rng.integers(0, bins, n).astype(np.int32)

    @qd.kernel
    def accumulate(a: _ndarray(qd.f32), k: _ndarray(qd.i32)):
        for i in a:
            hist[k[i]].count += 1
            hist[k[i]].total += a[i]

    accumulate(a, k)
    assert np.array_equal(hist.count.to_numpy(), np.bincount(k, minlength=bins))
    assert np.allclose(hist.total.to_numpy(), np.bincount(k, a, minlength=bins), rtol=1e-4)


def test_nested_struct_field(rng):
    n = 32
    bodies = Body.field(shape=n)
    w, m = rng.random(n), rng.random(n, np.float32)
    bodies.w.from_numpy(w)
    bodies.p.m.from_numpy(m)

    @qd.kernel
    def fill():
        for i in range(n):
            b = bodies[i]
            b.p.v.y = b.p.m * 2.0
            b.p.id = i
            bodies[i] = b
            bodies[i].w += 1.0

    fill()
    d = bodies.to_numpy()
    assert np.allclose(d["w"], w + 1) and np.allclose(d["p"]["v"][:, 1], 2 * m)
    assert np.array_equal(d["p"]["id"], np.arange(n)) and np.allclose(d["p"]["m"], m)


# -- struct values, qd.func --------------------------------------------------------------------------------------


@qd.func
def kick(p, dv):
    p.v += dv
    p.m = p.m * 0.5
    return p


@qd.func
def make(m: qd.f32, k: qd.i32) -> Particle:
    return Particle(m=m, v=vec3(m, -m, 1.0), id=k)


def test_struct_values_construct_update_pass_and_return(rng):
    n = 50
    a = rng.standard_normal(n).astype(np.float32)
    out_v = np.zeros((n, 3), np.float32)
    out_s = np.zeros(n, np.float32)
    out_i = np.zeros(n, np.int32)

    @qd.kernel
    def run(a: _ndarray(qd.f32), out_v: _ndarray(vec3), out_s: _ndarray(qd.f32), out_i: _ndarray(qd.i32)):
        for i in a:
            p = make(a[i], i)
            q = kick(p, vec3(1.0))
            q.v[2] = a[i] * 3.0
            q.id += 10
            b = Body(q, 0.25)
            b.p.v.x -= 1.0
            c = Particle()                      # every member 0
            out_v[i] = b.p.v + c.v
            out_s[i] = b.p.m + b.w + c.m + p.m  # p unchanged by kick: a value
            out_i[i] = b.p.id + c.id

    run(a, out_v, out_s, out_i)
    expected_v = np.stack([a + 1 - 1, -a + 1, 3 * a], axis=1)
    assert np.allclose(out_v, expected_v, rtol=1e-6, atol=1e-6)
    assert np.allclose(out_s, a * 0.5 + 0.25 + a, rtol=1e-6)
    assert np.array_equal(out_i, np.arange(n) + 10)


def test_struct_errors_name_the_member():
    @qd.kernel
    def read_unknown(out: _ndarray(qd.f32)):
        for i in range(1):
            p = Particle(m=1.0)
            out[i] = p.mass

    with pytest.raises(qd.QuadrantsError, match="no member 'mass'"):
        read_unknown(np.zeros(1, np.float32))

    @qd.kernel
    def bad_keyword(out: _ndarray(qd.f32)):
        for i in range(1):
            out[i] = Particle(mass=1.0).m

    with pytest.raises(qd.QuadrantsTypeError, match="no member 'mass'") as info:
        bad_keyword(np.zeros(1, np.float32))
    assert "Particle(mass=1.0)" in str(info.value)

    @qd.kernel
    def wrong_type(out: _ndarray(qd.f32)):
        for i in range(1):
            p = Particle(m=1.0)
            p.v = qd.Vector([1.0, 2.0])
            out[i] = p.m

    with pytest.raises(qd.QuadrantsTypeError, match="member 'v' is vector\\(3, float32\\)"):
        wrong_type(np.zeros(1, np.float32))


# -- @qd.dataclass ----------------------------------------------------------------------------------------------


@qd.dataclass
class Sphere:
    center: vec3
    radius: qd.f32

    @qd.func
    def area(self):
        return 4.0 * np.pi * self.radius * self.radius

    @qd.func
    def contains(self, q):
        return (q - self.center).norm() <= self.radius

    @qd.func
    def grown(self, dr) -> Sphere:
        return Sphere(center=self.center, radius=self.radius + dr)


@qd.dataclass
class Scene:
    sphere: Sphere
    weight: qd.f32


def test_dataclass_members_methods_nesting_and_fields(rng):
    n = 40
    spheres = Sphere.field(shape=n)
    scenes = Scene.field(shape=n)
    c, r = rng.standard_normal((n, 3)).astype(np.float32), rng.random(n).astype(np.float32) + 0.5
    spheres.from_numpy({"center": c, "radius": r})
    q = rng.standard_normal((n, 3)).astype(np.float32)
    area = np.zeros(n, np.float32)
    inside = np.zeros(n, np.int32)

    @qd.kernel
    def run(q: _ndarray(vec3), area: _ndarray(qd.f32), inside: _ndarray(qd.i32)):
        for i in spheres:
            s = spheres[i]
            area[i] = s.area() + spheres[i].grown(1.0).area()
            inside[i] = 1 if s.contains(q[i]) else 0
            scene = Scene(sphere=s.grown(0.5), weight=2.0)
            scene.sphere.radius *= scene.weight
            scenes[i] = scene

    run(q, area, inside)
    assert np.allclose(area, 4 * np.pi * (r ** 2 + (r + 1) ** 2), rtol=1e-5)
    assert np.array_equal(inside, (np.linalg.norm(q - c, axis=1) <= r).astype(np.int32))
    d = scenes.to_numpy()
    assert np.allclose(d["sphere"]["radius"], 2 * (r + 0.5)) and np.allclose(d["sphere"]["center"], c)
    assert np.allclose(d["weight"], 2)
    assert Sphere(radius=2.0).radius == 2.0


# -- struct kernel parameters ---------------------------------------------------------------------------------------


def test_struct_kernel_parameters(rng):
    n = 24
    a = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((n, 3), np.float32)
    ids = np.zeros(n, np.int32)

    @qd.kernel
    def shift(a: _ndarray(qd.f32), b: Body, s: Sphere, out: _ndarray(vec3), ids: _ndarray(qd.i32)):
        for i in a:
            out[i] = b.p.v * a[i] + s.center * b.w + s.area()
            ids[i] = b.p.id + i

    p = Particle(m=1.0, v=[1.0, -2.0, 0.5], id=7)
    shift(a, Body(p=p, w=0.5), Sphere(center=[0.0, 1.0, 2.0], radius=1.0), out, ids)
    expected = np.outer(a, [1.0, -2.0, 0.5]) + 0.5 * np.array([0.0, 1.0, 2.0]) + 4 * np.pi
    assert np.allclose(out, expected, rtol=1e-5) and np.array_equal(ids, 7 + np.arange(n))
    shift(a, {"p": {"m": 0.0, "v": [0.0, 0.0, 1.0], "id": 1}, "w": 2.0}, Sphere(radius=0.0), out, ids)
    assert np.allclose(out, np.outer(a, [0.0, 0.0, 1.0])) and np.array_equal(ids, 1 + np.arange(n))
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'b'"):
        shift(a, 3.0, Sphere(radius=0.0), out, ids)


def test_struct_value_from_serial_code_in_a_parallel_loop(rng):
    n = 20
    out = qd.field(qd.f32, shape=n)
    a = rng.standard_normal(3).astype(np.float32)

    @qd.kernel
    def spread(a: _ndarray(qd.f32)):
        p = Particle(m=a[0], v=vec3(a[0], a[1], a[2]))     # serial code, before the loop's task
        for i in range(n):
            out[i] = p.m * i + p.v.z

    spread(a)
    assert np.allclose(out.to_numpy(), a[0] * np.arange(n) + a[2], rtol=1e-6)


@pytest.mark.cuda
def test_structs_on_gpu(rng):
    qd.init(arch=qd.cuda)
    try:
        test_struct_field_members_and_elements_in_kernels(rng)
        test_struct_field_member_update_is_atomic(rng)
        test_nested_struct_field(rng)
        test_struct_values_construct_update_pass_and_return(rng)
        test_dataclass_members_methods_nesting_and_fields(rng)
        test_struct_kernel_parameters(rng)
        test_struct_value_from_serial_code_in_a_parallel_loop(rng)
    finally:
        qd.init(arch=qd.cpu)


def test_struct_field_and_method_errors():
    s = Particle.field(shape=4)
    out = qd.field(qd.f32, shape=4)

    @qd.kernel
    def unknown_member_field():
        for i in range(4):
            out[i] = s.mass[i]

    with pytest.raises(qd.QuadrantsTypeError, match="no member 'mass'") as info:
        unknown_member_field()
    assert "s.mass[i]" in str(info.value)

    @qd.kernel
    def unknown_receiver():
        for i in range(4):
            pair = (Sphere(radius=1.0), i)
            a = pair[0]                            # an item of a tuple: not known before typing
            out[i] = a.area()

    with pytest.raises(qd.QuadrantsError, match="cannot call the method 'area' of Sphere"):
        unknown_receiver()


@qd.func
def energy(p: Particle) -> qd.f32:
    return p.m * p.v.norm_sqr()


def test_zero_d_struct_field_and_annotated_func_parameter(rng):
    g = Particle.field(shape=())
    m, v = rng.random(2).astype(np.float32)

    @qd.kernel
    def total(m: qd.f32, v: qd.f32) -> qd.f32:
        g[None].m = m
        g[None].v = vec3(v, 2.0 * v, 2.0 * v)
        return energy(g[None])

    assert np.isclose(total(m, v), m * 9 * v * v, rtol=1e-5)
    assert g[None].m == m and np.allclose(g[None].v.to_numpy(), [v, 2 * v, 2 * v])
