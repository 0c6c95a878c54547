"""Transpose perm tables: which 4-D perms the NPU implements, and each one's shape limits.

Copied from the oplist V2.3.2 Transpose pages. The input is [n1, c1, h1, w1]; each perm lists
conditions that must all hold, written as Python expressions over n1, c1, h1, w1 and the
platform's p and q. Only the float16 line (T2) is kept, since plans compute in float16; the
int8 line (T1) differs in its alignments (16 instead of 8). A perm that is absent is not
supported at all.
"""
from __future__ import annotations

from typing import Mapping

#: RK3588, RK3562, RK3576/RV1126B, RV1103/RV1106, RV1103B/RV1106B and RK2118 share this table;
#: they differ in p and q only (RK3588 and RV1103/RV1106: p=8192, q=2048; the others:
#: p=268435456, q=65536).
FULL_TABLE: Mapping[tuple[int, ...], tuple[str, ...]] = {
    (0, 1, 2, 3): (),
    (0, 1, 3, 2): ("h1 % 8 == 0", "h1*w1 < 8*p", "h1*w1 < 2*q"),
    (0, 2, 3, 1): ("c1 < 8192", "h1*w1 % 8 == 0", "w1*c1 < p*8"),
    (0, 2, 1, 3): ("h1 % 8 == 0", "h1*w1 < 8*p", "h1*w1 < 2*q", "c1*w1 < p"),
    (0, 3, 1, 2): ("h1*w1 < p", "w1 < 8192", "h1*c1 < p"),
    (0, 3, 2, 1): ("h1 % 8 == 0", "h1*w1 < 8*p", "h1*w1 < 2*q", "c1 < p*8"),
    (1, 0, 2, 3): ("h1*w1 < 8*p", "n1 < 8192", "h1*w1 < p"),
    (1, 0, 3, 2): ("h1 % 8 == 0", "c1*h1*w1 < 8*p", "h1*w1 < 2*q"),
    # The oplist prints "c1*h1*w1p" here, a dropped '<' (the int8 line has it).
    (1, 2, 0, 3): ("n1*w1 < p*8", "c1*h1*w1 < p", "w1 % 8 == 0"),
    (1, 2, 3, 0): ("h1*w1 < p", "n1 < p*8", "c1*h1*w1 < p*8", "n1*w1 < p*8"),
    (1, 3, 0, 2): ("c1*w1 < 8192", "n1*h1 < p", "w1 % 8 == 0"),
    (1, 3, 2, 0): ("c1*h1*w1 < p", "n1*h1 < p", "w1 < 8192", "w1 % 8 == 0"),
    (2, 1, 0, 3): ("c1 < 8192", "c1*h1*w1 < p", "n1*w1 < p"),
    (2, 1, 3, 0): ("c1*h1*w1 < p", "n1*w1 < p*8", "c1 < 8192", "n1*w1 % 4 == 0"),
    (2, 0, 3, 1): ("c1 < 8192", "c1*h1*w1 < p"),
    (2, 0, 1, 3): ("n1*c1*h1*w1 < p", "h1*w1 % 8 == 0"),
    (2, 3, 1, 0): ("c1*h1*w1 < p", "n1*c1 < p", "h1*w1 < 8192", "h1*w1 % 8 == 0"),
    (2, 3, 0, 1): ("h1*w1 < 8192", "n1*c1 < p"),
    (3, 0, 2, 1): ("h1*w1 < p", "n1*c1 < 8192", "c1*h1 < p", "n1*w1 < 8192", "n1*w1 % 8 == 0"),
    (3, 0, 1, 2): ("h1*w1 < p", "n1*c1 < 8192", "c1*h1 < p", "n1*w1 < 8192", "n1*h1*w1 % 8 == 0"),
    (3, 2, 0, 1): ("h1*w1 < p", "n1*c1 < 8192", "n1*c1*w1 < p"),
    (3, 2, 1, 0): ("c1*h1*w1 < p", "h1*w1 < 8192", "2*h1*w1 < q", "n1*c1 < p*8", "h1 % 8 == 0"),
    (3, 1, 0, 2): ("h1*w1 < p", "c1*w1 < 8192", "n1*h1 < p"),
    (3, 1, 2, 0): ("h1*w1 < p", "n1*c1 < 8192", "n1*h1 < p", "n1*c1*w1 < p"),
}

_RK3566_PLANE_SWAP = ("c1 < 8192", "n1 < 8192", "h1*w1 < 8192",
                      # The oplist's second case reads "n1=h1=1, h1%4=0", which no shape meets;
                      # it is copied as printed rather than guessed at.
                      "(h1 == 1 and w1 == 1 and n1 % 4 == 0) or (n1 == 1 and h1 == 1 and h1 % 4 == 0)")
_RK3566_WIDTH_SWAP = _RK3566_PLANE_SWAP[:3] + (
    "(h1 == 1 and w1 == 1 and n1 % 4 == 0) or (n1 == 1 and h1 == 1 and w1 % 4 == 0)",)

#: RK3566/RK3568: the oplist marks 19 of the 24 perms "不支持" (not supported).
RK3566_TABLE: Mapping[tuple[int, ...], tuple[str, ...]] = {
    (0, 1, 2, 3): (),
    (2, 1, 0, 3): _RK3566_PLANE_SWAP,
    (2, 1, 3, 0): _RK3566_PLANE_SWAP,
    (3, 1, 0, 2): _RK3566_WIDTH_SWAP,
    (3, 1, 2, 0): _RK3566_WIDTH_SWAP,
}

NARROW = {"p": 8192, "q": 2048}
WIDE = {"p": 268435456, "q": 65536}
