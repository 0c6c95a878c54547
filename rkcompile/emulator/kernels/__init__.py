"""The NPU kernels; importing this package registers every one of them."""
from . import (activation, binary, concat, conv, gru, int8_arithmetic, layernorm, lstm, matmul, pool, reduce,  # noqa: F401
               reference_ops, reshape, resize, slice, softmax, split, transpose)
