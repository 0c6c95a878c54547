"""The NPU kernels; importing this package registers every one of them."""
from . import (activation, binary, concat, conv, gru, int8_arithmetic, layernorm, lstm, matmul, pad, pool,  # noqa: F401
               reduce, reference_ops, reshape, resize, slice, softmax, split, transpose)
