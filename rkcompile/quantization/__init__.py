"""int8 quantization: calibration data, range observers and the parameters of each tensor.

The arithmetic every int8 tensor follows (real = (q - zero_point) * scale) and how scales,
zero points and biases are chosen; the quantize pass (passes/quantize.py) applies it to a plan.
"""
