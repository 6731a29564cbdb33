"""serrano's hardware blocks, one per module; the public names are re-exported here."""

from rtl.tensor_core import OperandBeat, ResultRow, TensorCore

__all__ = ["OperandBeat", "ResultRow", "TensorCore"]
