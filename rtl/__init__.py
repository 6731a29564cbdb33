"""serrano's hardware blocks, one per module; the public names are re-exported here."""

from rtl.accumulator import AccumulatorMemory, AccWrite
from rtl.dma_engine import DmaEngine, NetWord
from rtl.gemm_engine import GemmEngine
from rtl.mesh import Mesh
from rtl.network_interface import NetPayload, NetworkInterface, PacketKind
from rtl.router import Router
from rtl.scratchpad import KvOp, KvRequest, Request, Response, Scratchpad, Status
from rtl.sequencer import ErrorCode, Sequencer
from rtl.tensor_core import OperandBeat, ResultRow, TensorCore
from rtl.tile import Counters, Tile
from rtl.vec_engine import VecEngine
from rtl.vector_unit import VectorOp, VectorOpcode, VectorResult, VectorUnit
from spec.isa import Opcode
from spec.noc import Flit, Link, MessageClass, NocConfig, Port

__all__ = [
    "AccWrite", "AccumulatorMemory", "Counters", "DmaEngine", "ErrorCode", "Flit",
    "GemmEngine", "KvOp", "KvRequest", "Link", "Mesh", "MessageClass", "NetPayload",
    "NetWord", "NetworkInterface", "NocConfig", "Opcode", "OperandBeat", "PacketKind", "Port",
    "Request", "Response", "ResultRow", "Router", "Scratchpad", "Sequencer", "Status",
    "TensorCore", "Tile", "VecEngine", "VectorOp", "VectorOpcode", "VectorResult",
    "VectorUnit",
]
