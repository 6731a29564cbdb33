"""The one place where serrano's number formats are defined.

The RTL (``rtl/``), the golden models (``golden/``) and the program builder all read
their widths, ranges and rounding rules from :data:`NUMERICS`; ``docs/numerics.md``
explains each field. Change a value here and every consumer follows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Numerics:
    """Fixed-point formats shared by hardware and reference models."""

    #: Width of a quantised operand (activations, weights, K/V): signed two's complement.
    operand_bits: int = 8
    #: Width of a GEMM accumulator: signed, wraps modulo 2**acc_bits like the hardware.
    acc_bits: int = 32
    #: Width of the requantisation multiplier: unsigned, normalised to
    #: [2**(mult_bits-1), 2**mult_bits) by :func:`golden.gemm.quantize_multiplier`.
    requant_mult_bits: int = 16
    #: Largest right shift of the requantisation (the shift field is 6 bits wide).
    requant_max_shift: int = 63

    @property
    def operand_min(self) -> int:
        return -(1 << (self.operand_bits - 1))

    @property
    def operand_max(self) -> int:
        return (1 << (self.operand_bits - 1)) - 1

    @property
    def acc_min(self) -> int:
        return -(1 << (self.acc_bits - 1))

    @property
    def acc_max(self) -> int:
        return (1 << (self.acc_bits - 1)) - 1

    @property
    def max_exact_depth(self) -> int:
        """Longest reduction (K) for which int8 x int8 sums cannot wrap the accumulator."""
        largest_product = self.operand_min * self.operand_min
        return self.acc_max // largest_product


NUMERICS = Numerics()
