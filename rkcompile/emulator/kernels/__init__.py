"""The NPU kernels; importing this package registers every one of them."""
from . import (activation, binary, concat, conv, gru, layernorm, lstm, matmul, pool, reduce, reference_ops,  # noqa: F401
               reshape, resize, slice, softmax, split, transpose)
