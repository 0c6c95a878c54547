"""exMatMul native layouts (seed 002, 4.1.1.4): shapes per platform, conversions checked against
the seed's example loops element by element, and the K segment split."""
from __future__ import annotations

import numpy as np
import pytest

from rkcompile.matmul_layout import (
    NATIVE_LAYOUTS, a_native_shape, b_from_native, b_native_shape, b_to_native, b_to_native_segments,
    c_native_shape, from_perf, k_segments, native_layout, to_perf,
)


def seed_norm_layout_to_perf_layout(src: np.ndarray, m: int, k: int, sub_k: int) -> np.ndarray:
    """Seed 002's A/C loop, index for index, over flat buffers."""
    outer = -(-k // sub_k)
    flat = src.reshape(-1)
    dst = np.empty(outer * m * sub_k, dtype=src.dtype)
    for i in range(outer):
        for row in range(m):
            for j in range(sub_k):
                ki = i * sub_k + j
                dst[i * m * sub_k + row * sub_k + j] = 0 if ki >= k else flat[row * k + ki]
    return dst


def seed_norm_layout_to_native_layout(src: np.ndarray, k: int, n: int, sub_n: int, sub_k: int) -> np.ndarray:
    """Seed 002's B loop, index for index, over flat buffers."""
    n_remain, k_remain = -(-n // sub_n), -(-k // sub_k)
    flat = src.reshape(-1)
    dst = np.empty(n_remain * k_remain * sub_n * sub_k, dtype=src.dtype)
    for i in range(n_remain):
        for j in range(k_remain):
            for col in range(sub_n):
                ni = i * sub_n + col
                for kk in range(sub_k):
                    ki = j * sub_k + kk
                    value = flat[ki * n + ni] if ki < k and ni < n else 0
                    dst[((i * k_remain + j) * sub_n + col) * sub_k + kk] = value
    return dst


CASES = [(platform, dtype) for platform, table in NATIVE_LAYOUTS.items() for dtype in table]


@pytest.mark.parametrize("platform,dtype", CASES)
@pytest.mark.parametrize("m,k,n", [(3, 40, 21), (1, 64, 32), (5, 7, 3)])
def test_a_and_b_conversions_match_the_seed_loops(platform, dtype, m, k, n):
    layout = native_layout(platform, dtype)
    rng = np.random.default_rng(k * n + m)
    a = rng.integers(-100, 100, size=(m, k)).astype(np.int16)
    b = rng.integers(-100, 100, size=(k, n)).astype(np.int16)

    a_native = to_perf(a, layout.sub_k_a)
    assert a_native.shape == a_native_shape(m, k, layout)
    assert np.array_equal(a_native.reshape(-1), seed_norm_layout_to_perf_layout(a, m, k, layout.sub_k_a))
    assert np.array_equal(from_perf(a_native, k), a)

    b_native = b_to_native(b, layout.sub_n_b, layout.sub_k_b)
    assert b_native.shape == b_native_shape(k, n, layout)
    expected = seed_norm_layout_to_native_layout(b, k, n, layout.sub_n_b, layout.sub_k_b)
    assert np.array_equal(b_native.reshape(-1), expected)
    assert np.array_equal(b_from_native(b_native, k, n), b)


@pytest.mark.parametrize("platform,dtype", CASES)
def test_c_native_layout_holds_the_product(platform, dtype):
    """C = A x B read back from its [N/subN, M, subN] layout is the plain product."""
    layout = native_layout(platform, dtype)
    rng = np.random.default_rng(7)
    a = rng.integers(-8, 8, size=(6, 33)).astype(np.int32)
    b = rng.integers(-8, 8, size=(33, 19)).astype(np.int32)
    c_native = to_perf(a @ b, layout.sub_n_c)
    assert c_native.shape == c_native_shape(6, 19, layout)
    assert np.array_equal(c_native.reshape(-1), seed_norm_layout_to_perf_layout(a @ b, 6, 19, layout.sub_n_c))
    assert np.array_equal(from_perf(c_native, 19), a @ b)


def test_shapes_the_seed_states():
    """Seed 002's text: RK3566/RK3568 int8 A [K/8,M,8] and B [N/16,K/32,16,32]; RK3576 float16
    B [N/16,K/32,16,32] (the heterogeneous-input note)."""
    rk3568 = native_layout("rk3568", "int8")
    assert a_native_shape(4, 64, rk3568) == (8, 4, 8)
    assert b_native_shape(64, 32, rk3568) == (2, 2, 16, 32)
    assert b_native_shape(64, 32, native_layout("rk3576", "float16")) == (2, 2, 16, 32)
    assert a_native_shape(4, 70, rk3568) == (9, 4, 8)  # rounded up, padded with zeros


def test_unknown_platform_or_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="rk3562 has no native layout for int4"):
        native_layout("rk3562", "int4")
    with pytest.raises(ValueError, match="no exMatMul native layout"):
        native_layout("rk1808", "int8")


@pytest.mark.parametrize("platform,k,lengths", [
    ("rk3576", 10240, [4096, 4096, 2048]),   # seed 002's RK3576 example
    ("rk3588", 20480, [8192, 8192, 4096]),   # seed 002's RK3588 example (its text misprints 8192 as 8196)
    ("rk3588", 8192, [8192]),
    ("rk3588", 8193, [8192, 1]),
    ("rv1126b", 4097, [4096, 1]),
    ("rk3562", 20000, [20000]),
])
def test_k_segments(platform, k, lengths):
    segments = k_segments(k, platform)
    assert [stop - start for start, stop in segments] == lengths
    assert segments[0][0] == 0 and segments[-1][1] == k
    assert all(a[1] == b[0] for a, b in zip(segments, segments[1:]))


def test_b_segments_convert_each_k_slice():
    rng = np.random.default_rng(3)
    b = rng.standard_normal((4096 + 100, 32)).astype(np.float16)
    parts = b_to_native_segments(b, "rk3576", "float16")
    assert [p.shape for p in parts] == [(2, 128, 16, 32), (2, 4, 16, 32)]
    assert np.array_equal(np.concatenate([b_from_native(p, s - a, 32) for p, (a, s) in
                                          zip(parts, k_segments(4196, "rk3576"))]), b)
