"""exMatMul native ("high-performance") layouts of seed 002, 4.1.1.4, and their conversions.

With AC_layout and B_layout set to RKNN_MM_LAYOUT_NATIVE, for C = A x B with A [M,K], B [K,N]:

- A is [ceil(K/subK_A), M, subK_A] and C is [ceil(N/subN_C), M, subN_C]: the norm-to-perf
  layout of seed 002's `norm_layout_to_perf_layout` (C uses it with N in place of K);
- B is [ceil(N/subN), ceil(K/subK), subN, subK]: seed 002's `norm_layout_to_native_layout`.

Divisions round up and the extra elements are zero. Seed 002 names the per-platform table
(table 4-3) but its rows did not survive extraction; the figures below are that table as
printed in the English RKNN SDK user guide (table "High-performance shapes for individual chip
platform matrices A, B, and C"), and agree with every shape seed 002 states in its text: RK3566/
RK3568 int8 A [K/8,M,8] and B [N/16,K/32,16,32], and RK3576 float16 B [N/16,K/32,16,32].
RV1126B shares RK3576's column because seed 002 groups the two in every platform statement.

On RK3588, B is split along K into segments of at most 8192 rows, on RK3576/RV1126B of at most
4096 (seed 002, after table 4-5), and each segment is converted on its own.
"""
from __future__ import annotations

import numpy as np

from rkcompile.records import frozen_dataclass


@frozen_dataclass
class NativeLayout:
    """Block sizes of the native layouts for one platform and one input dtype."""

    sub_k_a: int   # A: [K/sub_k_a, M, sub_k_a]
    sub_n_b: int   # B: [N/sub_n_b, K/sub_k_b, sub_n_b, sub_k_b]
    sub_k_b: int
    sub_n_c: int   # C: [N/sub_n_c, M, sub_n_c]
    c_dtype: str


_RK3562 = {"int8": NativeLayout(16, 16, 32, 4, "int32"), "float16": NativeLayout(8, 8, 32, 4, "float32")}
_RK3566 = {"int8": NativeLayout(8, 16, 32, 4, "int32"), "float16": NativeLayout(4, 8, 16, 4, "float32")}
_RK3576_RK3588 = {
    "int4": NativeLayout(32, 64, 32, 8, "int16"),
    "int8": NativeLayout(16, 32, 32, 4, "int32"),
    "float16": NativeLayout(8, 16, 32, 4, "float32"),
}

NATIVE_LAYOUTS: dict[str, dict[str, NativeLayout]] = {
    "rk3562": _RK3562,
    "rk3566": _RK3566,
    "rk3568": _RK3566,
    "rk3576": _RK3576_RK3588,
    "rv1126b": _RK3576_RK3588,
    "rk3588": _RK3576_RK3588,
}

#: Longest K segment of B per platform; platforms not listed never split.
K_SEGMENT_LIMIT = {"rk3588": 8192, "rk3576": 4096, "rv1126b": 4096}


def native_layout(platform: str, dtype: str) -> NativeLayout:
    layouts = NATIVE_LAYOUTS.get(platform.lower())
    if layouts is None:
        raise ValueError(f"no exMatMul native layout is known for platform {platform}")
    if dtype not in layouts:
        raise ValueError(f"exMatMul on {platform} has no native layout for {dtype} "
                         f"(supported: {', '.join(sorted(layouts))})")
    return layouts[dtype]


def _blocks(length: int, block: int) -> int:
    return -(-length // block)


def a_native_shape(m: int, k: int, layout: NativeLayout) -> tuple[int, int, int]:
    return _blocks(k, layout.sub_k_a), m, layout.sub_k_a


def b_native_shape(k: int, n: int, layout: NativeLayout) -> tuple[int, int, int, int]:
    return _blocks(n, layout.sub_n_b), _blocks(k, layout.sub_k_b), layout.sub_n_b, layout.sub_k_b


def c_native_shape(m: int, n: int, layout: NativeLayout) -> tuple[int, int, int]:
    return _blocks(n, layout.sub_n_c), m, layout.sub_n_c


def to_perf(matrix: np.ndarray, sub: int) -> np.ndarray:
    """[rows, cols] -> [ceil(cols/sub), rows, sub], zero-padded: A with sub = subK, C with subN."""
    rows, cols = matrix.shape
    padded = np.zeros((rows, _blocks(cols, sub) * sub), dtype=matrix.dtype)
    padded[:, :cols] = matrix
    return np.ascontiguousarray(padded.reshape(rows, -1, sub).transpose(1, 0, 2))


def from_perf(blocks: np.ndarray, cols: int) -> np.ndarray:
    """The inverse of `to_perf`: [ceil(cols/sub), rows, sub] -> [rows, cols], padding dropped."""
    count, rows, sub = blocks.shape
    return np.ascontiguousarray(blocks.transpose(1, 0, 2).reshape(rows, count * sub)[:, :cols])


def b_to_native(b: np.ndarray, sub_n: int, sub_k: int) -> np.ndarray:
    """B [K, N] -> [ceil(N/subN), ceil(K/subK), subN, subK], zero-padded."""
    k, n = b.shape
    padded = np.zeros((_blocks(k, sub_k) * sub_k, _blocks(n, sub_n) * sub_n), dtype=b.dtype)
    padded[:k, :n] = b
    blocks = padded.reshape(_blocks(k, sub_k), sub_k, _blocks(n, sub_n), sub_n)
    return np.ascontiguousarray(blocks.transpose(2, 0, 3, 1))


def b_from_native(native: np.ndarray, k: int, n: int) -> np.ndarray:
    """The inverse of `b_to_native`: back to B [K, N]."""
    n_blocks, k_blocks, sub_n, sub_k = native.shape
    full = native.transpose(1, 3, 0, 2).reshape(k_blocks * sub_k, n_blocks * sub_n)
    return np.ascontiguousarray(full[:k, :n])


def k_segments(k: int, platform: str) -> list[tuple[int, int]]:
    """The [start, stop) rows of B each native segment holds: T = ceil(K / limit) segments,
    all of `limit` rows but the last. Seed 002's example, K = 10240 on RK3576, gives 4096,
    4096 and 2048."""
    limit = K_SEGMENT_LIMIT.get(platform.lower())
    if limit is None or k <= limit:
        return [(0, k)]
    return [(start, min(start + limit, k)) for start in range(0, k, limit)]


def b_to_native_segments(b: np.ndarray, platform: str, dtype: str) -> list[np.ndarray]:
    """B [K, N] in the native layout of `platform`, one array per K segment."""
    layout = native_layout(platform, dtype)
    return [b_to_native(b[start:stop], layout.sub_n_b, layout.sub_k_b) for start, stop in k_segments(b.shape[0], platform)]
