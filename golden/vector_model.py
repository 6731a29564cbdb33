"""Beat-level model of the vector unit (``rtl/vector_unit.py``), built from golden functions.

:class:`VectorUnitModel` takes one op beat at a time (a dict of the fields of
``rtl.vector_unit.VectorOp``: ``opcode``, ``a``, ``b``, ``c``, ``mult``, ``shift``,
``sat``, ``mask``, ``slot``, ``first``) and returns the result beat the hardware must
produce, keeping the per-slot state as the hardware does: the running total (max or
sum) and the reciprocal's divisor per slot, the unit's one top-k list (golden ``topk``
over every (value, index) folded since the last ``first``, in the order folded: ties to
the earlier beat, then the lower lane) and the SiLU table.

The opcode numbers and lane widths are ``spec.vector``'s, shared with the RTL.
``opcode`` may be a :class:`VectorOpcode`, a plain int, or any enum whose ``value`` is
the number.
"""

from __future__ import annotations

import numpy as np

from golden.exp import exp2_neg, to_log2_domain
from golden.gemm import requantize, wrap
from golden.moe import topk
from golden.reciprocal import divide
from spec.numerics import NUMERICS
from spec.vector import (
    LANE_BITS,
    MUL_BITS,
    TOPK_DEFAULT,
    TOPK_INDEX_BITS,
    VectorOpcode,
    default_max_top_k,
)

__all__ = [
    "LANE_BITS", "MUL_BITS", "TOPK_DEFAULT", "TOPK_INDEX_BITS", "VectorOpcode",
    "VectorUnitModel", "default_max_top_k", "rescale", "top_list",
]

#: Fraction bits of alpha in RESCALE (Q1.15).
T = NUMERICS.exp_table_frac_bits


OP = VectorOpcode


def rescale(acc: np.ndarray, alpha: int, add: np.ndarray) -> np.ndarray:
    """The FlashAttention-2 rescale step of ``golden.softmax.online_softmax_pv`` (one line
    there, not a function of its own): ``((acc * alpha + 2**(T-1)) >> T) + add``."""
    return ((np.asarray(acc, np.int64) * alpha + (1 << (T - 1))) >> T) + add


def _signed(x, bits):
    return wrap(np.asarray(x, np.int64), bits)


def top_list(values: list[int], indices: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, indices) of the k largest of a row given as (value, index) pairs in the
    order they were folded, largest first, ties to the pair folded first (fewer than k
    if the row is shorter). When the pairs come in index order, as a row's beats do,
    this is golden ``topk``: ties to the lower index."""
    row = np.asarray(values, np.int64)
    if row.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    chosen = topk(row[None, :], min(k, row.size))[0]
    return row[chosen], np.asarray(indices, np.int64)[chosen]


def opcode_of(value) -> VectorOpcode:
    """An opcode given as this enum, an int, or another enum with the same numbers."""
    return VectorOpcode(getattr(value, "value", value))


class VectorUnitModel:
    """The vector unit's results, one op beat at a time, with its slot state.

    ``n`` lanes, ``slots`` slots, one top-k list of ``max_top_k`` entries (default
    ``min(n, 8)``). State at construction = the hardware's after reset: totals 0,
    divisors 1, an empty top-k list, a SiLU table of zeros.
    """

    def __init__(self, n: int, slots: int, max_top_k: int | None = None):
        self.n, self.slots = n, slots
        self.max_top_k = default_max_top_k(n) if max_top_k is None else max_top_k
        self.row = ([], [])  # top-k: every (value, index) folded since the last first
        self.totals = np.zeros(slots, np.int64)
        self.recip_l = np.ones(slots, np.int64)
        self.table = np.zeros(256, np.int64)

    def step(self, op: dict) -> tuple[np.ndarray, int]:
        """(data: N int64 lanes, total) of one op beat; updates the slot state."""
        n = self.n
        code = opcode_of(op["opcode"])
        a, b = np.array(op["a"], np.int64), np.array(op["b"], np.int64)
        c, mult, shift, sat, slot = op["c"], op["mult"], op["shift"], op["sat"], op["slot"]
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} out of range: the unit has {self.slots} slots")
        enabled = np.array([(op["mask"] >> i) & 1 for i in range(n)], bool)
        data = np.zeros(n, np.int64)
        if code == OP.REQUANT:
            data = requantize(a, mult, shift).astype(np.int64)
        elif code == OP.LOGIT:
            data = to_log2_domain(a, mult, shift)
        elif code in (OP.MAX, OP.SUM, OP.ADD):
            data = a + (b if code == OP.ADD else 0)
        elif code == OP.EXP:
            d = np.where(enabled, c - a, 0)
            data = exp2_neg(d, shift)
            if sat:
                data = np.minimum(data, (1 << shift) - 1)
        elif code == OP.RESCALE:
            data = rescale(a, c, b)
        elif code == OP.RECIP:
            self.recip_l[slot] = c & ((1 << NUMERICS.attn_sum_bits) - 1)
        elif code == OP.DIV:
            data = divide(a, self.recip_l[slot], shift)
            if sat:
                data = np.minimum(data, (1 << shift) - 1)
        elif code in (OP.MUL, OP.SWIGLU, OP.SILU):
            x = _signed(a, MUL_BITS) if code == OP.MUL else self.table[(a & 255) ^ 128]
            if code == OP.SILU:
                data = x
            else:
                product = x * _signed(b, MUL_BITS)
                data = (requantize(product, mult, shift).astype(np.int64) if sat
                        else to_log2_domain(product, mult, shift))
        elif code == OP.SILU_LOAD:
            self.table[c & 255] = _signed(a[0], 8)
        data = np.where(enabled, _signed(data, LANE_BITS), 0)
        if code in (OP.TOPK, OP.TOPK_INDEX):
            if op["first"]:
                self.row = ([], [])
            for i in np.flatnonzero(enabled):
                self.row[0].append(int(a[i]))
                self.row[1].append((c + int(i)) % (1 << TOPK_INDEX_BITS))
            values, indices = top_list(*self.row, self.max_top_k)
            data = np.zeros(n, np.int64)
            data[:self.max_top_k] = 0 if code == OP.TOPK else -1
            data[: values.size] = values if code == OP.TOPK else indices
        if code in (OP.MAX, OP.LOGIT):
            start = c if op["first"] else self.totals[slot]
            self.totals[slot] = max(start, data[enabled].max()) if enabled.any() else start
        elif code in (OP.SUM, OP.EXP):
            start = 0 if op["first"] else self.totals[slot]
            self.totals[slot] = _signed(start + data.sum(), LANE_BITS)
        return data, int(self.totals[slot])
