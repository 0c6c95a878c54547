"""Neutral numerics shared by the compiler and the emulator, importing neither.

`float16` is the NPU's float16 encoding and saturation, `nc1hwc2` the block layout's
arithmetic (seed 003), `dtypes` dtype names and element counts. Both sides compute with the
same functions, so a plan's bytes and the emulator's reading of them cannot drift apart.
"""
