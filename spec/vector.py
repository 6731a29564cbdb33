"""The vector unit's operation codes and lane widths, defined once for the RTL
(``rtl.vector_unit``), the beat-level model (``golden.vector_model``) and the program
builder (docs/vector_unit.md has each operation's formula)."""

from __future__ import annotations

from amaranth.lib import enum

from spec.numerics import NUMERICS

__all__ = [
    "LANE_BITS", "MUL_BITS", "TOPK_DEFAULT", "TOPK_INDEX_BITS", "USES_B", "USES_C",
    "VectorOpcode", "default_max_top_k",
]

#: Width of a lane value and of a slot total: golden's P.V accumulator
#: (``attn_acc_bits``); holds int32 accumulators, log2-domain logits and NEG_INF.
LANE_BITS = NUMERICS.attn_acc_bits
#: MUL/SWIGLU take the low ``MUL_BITS`` of each operand (signed), so a*b fits a lane.
MUL_BITS = LANE_BITS // 2
#: Width of a top-k index (expert number): lane i of a TOPK beat is index
#: ``(c + i) mod 2**16``.
TOPK_INDEX_BITS = 16
#: Largest top-k list a unit keeps by default (the workloads' largest ``top_k``).
TOPK_DEFAULT = 8


def default_max_top_k(n: int) -> int:
    """The top-k list length of a unit of ``n`` lanes when ``max_top_k`` is not given."""
    return min(n, TOPK_DEFAULT)


class VectorOpcode(enum.IntEnum, shape=4):
    """What one op beat computes. An int to the models, a 4-bit shape to the RTL."""

    REQUANT = 0
    LOGIT = 1
    MAX = 2
    SUM = 3
    EXP = 4
    RESCALE = 5
    RECIP = 6
    DIV = 7
    ADD = 8
    MUL = 9
    SILU = 10
    SWIGLU = 11
    SILU_LOAD = 12
    TOPK = 13
    TOPK_INDEX = 14


#: The opcodes that read operand b, and those that read operand c (unless the
#: instruction's ``c_imm``); every opcode but RECIP reads a. An operand an op does
#: not read may hold anything, and the vector engine does not read it.
USES_B = (VectorOpcode.RESCALE, VectorOpcode.ADD, VectorOpcode.MUL, VectorOpcode.SWIGLU)
USES_C = (VectorOpcode.LOGIT, VectorOpcode.MAX, VectorOpcode.EXP, VectorOpcode.RESCALE,
          VectorOpcode.RECIP, VectorOpcode.SILU_LOAD, VectorOpcode.TOPK,
          VectorOpcode.TOPK_INDEX)
