"""SECDED encode / syndrome / correct as Amaranth expressions, derived from golden.ecc.Secded.

The codeword layout and every XOR tree come from :class:`golden.ecc.Secded`, so the RTL
and the reference model cannot disagree on which bits a check bit covers.
"""

from __future__ import annotations

from amaranth import C, Cat, Module, Mux, Signal, Value

from golden.ecc import Secded

__all__ = ["correct", "encode", "syndrome"]


def _parity(value: Value, bits: list[int]) -> Value:
    """XOR of ``value``'s bits at positions ``bits``: one masked reduction (one Verilog
    operator, not a chain of single-bit XORs)."""
    mask = sum(1 << j for j in bits)
    return (value & C(mask, len(value))).xor()


def encode(code: Secded, data: Value) -> Value:
    """The ``code.code_bits``-bit codeword of ``data`` (data, check bits, overall parity)."""
    matrix = code.check_matrix
    checks = [
        _parity(data, [j for j in range(code.data_bits) if matrix[i, j]])
        for i in range(code.hamming_bits)
    ]
    check_value = Cat(*checks)
    overall = data.xor() ^ check_value.xor()
    return Cat(data, check_value, overall)


def syndrome(code: Secded, codeword: Value) -> tuple[Value, Value]:
    """(syndrome, overall parity) of a stored codeword; both zero for a clean word."""
    k, r = code.data_bits, code.hamming_bits
    matrix = code.check_matrix
    bits = [_parity(codeword, [j for j in range(k) if matrix[i, j]] + [k + i])
            for i in range(r)]
    return Cat(*bits), codeword.xor()


def correct(m: Module, code: Secded, codeword: Value, syn: Value, parity: Value,
            name: str = "ecc") -> tuple[Signal, Signal, Signal]:
    """Combinational (data, corrected, uncorrectable); data is 0 when uncorrectable."""
    k = code.data_bits
    data = Signal(k, name=f"{name}_data")
    corrected = Signal(name=f"{name}_corrected")
    uncorrectable = Signal(name=f"{name}_uncorrectable")
    flips = Cat(*[syn == pos for pos in code.data_positions])
    in_range = syn <= code.last_position
    m.d.comb += [
        corrected.eq(parity & in_range),
        uncorrectable.eq((~parity & (syn != 0)) | (parity & ~in_range)),
        data.eq(Mux(uncorrectable, 0, codeword[:k] ^ Mux(parity, flips, 0))),
    ]
    return data, corrected, uncorrectable
