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

    # --- exp2, softmax and attention (golden/exp.py, golden/softmax.py, golden/attention.py)
    #: Fractional bits of a logit in the log2 domain (a base-2 exponent in fixed point).
    exp_frac_bits: int = 10
    #: The top ``exp_hi_bits`` fraction bits index the coarse 2**-f table; the remaining
    #: ``exp_frac_bits - exp_hi_bits`` bits index the fine table. Both tables hold Q1.15.
    exp_hi_bits: int = 5
    #: Fractional bits of a table entry and of a rescale factor alpha (unsigned Q1.x).
    exp_table_frac_bits: int = 15
    #: Largest left shift the logit multiplier may need (a barrel shift before rounding).
    logit_max_left_shift: int = 16
    #: Width of a probability fed to the P.V GEMM: unsigned Q0.x, split into int8 limbs
    #: of 7 bits each (14 bits = two limbs, both in [0, 127]).
    attn_p_bits: int = 14
    #: Width of the running P.V output accumulator in the vector unit (signed, wraps).
    attn_acc_bits: int = 48
    #: Width of the running softmax denominator (unsigned).
    attn_sum_bits: int = 32
    #: Fractional bits of the normalised attention output before its requantisation.
    attn_out_frac_bits: int = 16

    # --- reciprocal (golden/reciprocal.py)
    #: Fraction bits of the normalised divisor that index the reciprocal seed table.
    recip_seed_bits: int = 5
    #: Newton-Raphson steps after the seed.
    recip_newton_steps: int = 2
    #: Width of the reciprocal mantissa (unsigned, in [2**(B-1), 2**B)).
    recip_bits: int = 16

    # --- mixture of experts (golden/moe.py)
    #: Fractional bits of a gating weight (unsigned Q0.x; 1.0 saturates to 2**x - 1).
    gate_frac_bits: int = 15

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
    def exp_lo_bits(self) -> int:
        """Fraction bits indexing the fine exp2 table."""
        return self.exp_frac_bits - self.exp_hi_bits

    @property
    def attn_p_limbs(self) -> int:
        """int8 limbs (7 magnitude bits each) a probability is split into for the P.V GEMM."""
        return -(-self.attn_p_bits // (self.operand_bits - 1))

    @property
    def limb_bits(self) -> int:
        """Value bits of one int8 limb of a wider GEMM operand (a P limb is in [0, 127])."""
        return self.operand_bits - 1

    @property
    def joined_operand_bits(self) -> int:
        """Width of a GEMM A value joined from two int8 limbs, ``hi * 2**limb_bits + lo``
        (signed; both limbs may be negative, so one bit more than ``2 * limb_bits + 1``).
        The tile's tensor core takes A at this width: an ECP5 DSP multiplies 18 x 18."""
        return 2 * self.operand_bits

    @property
    def attn_p_max(self) -> int:
        """Largest probability code: 1.0 saturates to this."""
        return (1 << self.attn_p_bits) - 1

    @property
    def max_exact_depth(self) -> int:
        """Longest reduction (K) for which int8 x int8 sums cannot wrap the accumulator."""
        largest_product = self.operand_min * self.operand_min
        return self.acc_max // largest_product


    def __post_init__(self) -> None:
        if not 0 < self.exp_hi_bits < self.exp_frac_bits:
            raise ValueError("exp_hi_bits must lie strictly between 0 and exp_frac_bits")
        if not 1 <= self.attn_p_bits < 2 * self.exp_table_frac_bits:
            raise ValueError(f"attn_p_bits {self.attn_p_bits} out of range")
        if self.recip_seed_bits < 1 or self.recip_bits < 8:
            raise ValueError("reciprocal needs at least 1 seed bit and an 8-bit mantissa")


NUMERICS = Numerics()
