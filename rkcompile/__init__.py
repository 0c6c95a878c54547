"""rkcompile: plan ONNX models for Rockchip RKNPU2 NPUs."""

__version__ = "0.1.0"
PLAN_SCHEMA = "rkcompile.plan/1"
