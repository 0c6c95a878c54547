"""The NPU kernels; importing this package registers every one of them."""
from rkcompile.emulator.kernels import (activation, binary, concat, conv, gru, indexing, int8_arithmetic,
    layernorm, lstm, matmul, pad, pool, reduce, reference_ops, reshape, resize, slice, softmax, split,
    transpose)
