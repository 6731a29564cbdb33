"""serrano's hardware blocks, one per module; the public names are re-exported here."""

from rtl.isa import Opcode
from rtl.scratchpad import KvOp, KvRequest, Request, Response, Scratchpad, Status
from rtl.sequencer import ErrorCode, Sequencer
from rtl.tensor_core import OperandBeat, ResultRow, TensorCore
from rtl.vector_unit import VectorOp, VectorOpcode, VectorResult, VectorUnit

__all__ = [
    "ErrorCode", "KvOp", "KvRequest", "Opcode", "OperandBeat", "Request", "Response",
    "ResultRow", "Scratchpad", "Sequencer", "Status", "TensorCore", "VectorOp", "VectorOpcode",
    "VectorResult", "VectorUnit",
]
