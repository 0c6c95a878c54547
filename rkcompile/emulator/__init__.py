"""The numpy emulator: executes a plan as planned (arena offsets, NC1HWC2, float16 on the NPU,
fused kernels as one, CPU steps through onnx.reference) so its outputs can be checked against
onnxruntime. docs/emulator.md describes the choices."""
from .compare import Agreement, agreement, onnxruntime_outputs
from .executor import Execution, Executor
from .session import Prepared, emulate, make_inputs, prepare
from .storage import EmulationError, Storage

__all__ = ["Agreement", "EmulationError", "Execution", "Executor", "Prepared", "Storage", "agreement", "emulate",
           "make_inputs", "onnxruntime_outputs", "prepare"]
