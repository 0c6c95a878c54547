"""The numpy emulator: executes a plan as planned (arena offsets, NC1HWC2, float16 on the NPU,
fused kernels as one, CPU steps on onnxruntime or onnx.reference) so its outputs can be checked against
onnxruntime. It reads plans and their weight regions, never models or the compiler.
docs/emulator.md describes the choices."""
from .compare import Agreement, agreement, onnxruntime_outputs
from .executor import Execution, Executor
from .session import Prepared, check_plan, emulate, make_inputs
from .storage import EmulationError, Storage

__all__ = ["Agreement", "EmulationError", "Execution", "Executor", "Prepared", "Storage", "agreement", "check_plan",
           "emulate", "make_inputs", "onnxruntime_outputs"]
