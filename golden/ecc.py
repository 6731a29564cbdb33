"""SECDED ECC: an extended Hamming code per stored word (e.g. (72, 64) for 64 data bits).

The code is systematic; a codeword of ``code_bits = data_bits + hamming_bits + 1`` bits is

    bits [0, data_bits)                  the data, unchanged
    bits [data_bits, data_bits + r)      Hamming check bit i (i = 0 … r-1)
    bit  data_bits + r                   overall parity (even parity over all other bits)

with r = ``hamming_bits`` the smallest r for which 2**r >= data_bits + r + 1. In Hamming
terms check bit i sits at position 2**i and data bit j at the j-th position (1-based,
increasing) that is not a power of two, so positions 1 … data_bits + r are all used.
Check bit i is the XOR of the data bits whose position has bit i set; the syndrome is
the XOR of the positions of all set bits (0 for a clean word).

Decoding (:meth:`Secded.decode`), with ``p`` the parity of the whole codeword:

- syndrome 0, p = 0: clean;
- p = 1, syndrome in 0 … data_bits + r: one bit flipped (the overall parity bit when the
  syndrome is 0); corrected, data returned fixed, ``corrected`` set;
- p = 0, syndrome != 0 (two bits flipped), or p = 1 with a syndrome past the last used
  position (three or more): ``uncorrectable`` set and the data returned as **0**, never
  as good-looking data. The RTL (``rtl/_ecc.py``) derives its XOR trees from this class.

Words and codewords are Python integers in NumPy object arrays (a codeword may be wider
than 64 bits). Three or more flipped bits are outside the code's guarantee: they may be
miscorrected.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["MAX_DATA_BITS", "Secded", "flip_bits", "hamming_bits"]

#: Widest data word supported (the check-bit matrices grow as data_bits * log2 data_bits).
MAX_DATA_BITS = 1024


def hamming_bits(data_bits: int) -> int:
    """Hamming check bits for ``data_bits`` data bits (without the overall parity bit)."""
    r = 1
    while (1 << r) < data_bits + r + 1:
        r += 1
    return r


def _as_ints(values) -> np.ndarray:
    array = np.asarray(values, dtype=object)
    return array.reshape(-1), array.shape


@dataclass(frozen=True)
class Secded:
    """Single-error-correcting, double-error-detecting code over ``data_bits`` data bits."""

    data_bits: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.data_bits, int) or isinstance(self.data_bits, bool):
            raise TypeError(f"data_bits must be an integer, not {self.data_bits!r}")
        if not 1 <= self.data_bits <= MAX_DATA_BITS:
            raise ValueError(
                f"data_bits must be between 1 and {MAX_DATA_BITS}, not {self.data_bits}"
            )

    @property
    def hamming_bits(self) -> int:
        return hamming_bits(self.data_bits)

    @property
    def code_bits(self) -> int:
        """Stored bits per word: data + Hamming check bits + overall parity."""
        return self.data_bits + self.hamming_bits + 1

    @property
    def last_position(self) -> int:
        """Highest Hamming position in use (data_bits + hamming_bits)."""
        return self.data_bits + self.hamming_bits

    @cached_property
    def data_positions(self) -> tuple[int, ...]:
        """Hamming position (1-based) of each data bit: the non-powers of two, in order."""
        positions, candidate = [], 1
        while len(positions) < self.data_bits:
            if candidate & (candidate - 1):
                positions.append(candidate)
            candidate += 1
        return tuple(positions)

    @cached_property
    def check_matrix(self) -> np.ndarray:
        """(hamming_bits, data_bits) 0/1: row i marks the data bits check bit i covers."""
        pos = np.array(self.data_positions)
        return ((pos[None, :] >> np.arange(self.hamming_bits)[:, None]) & 1).astype(np.uint8)

    def _bits(self, words: np.ndarray, width: int) -> np.ndarray:
        return np.array([[(int(w) >> j) & 1 for j in range(width)] for w in words],
                        dtype=np.int64).reshape(len(words), width)

    @staticmethod
    def _ints(bits: np.ndarray) -> np.ndarray:
        weights = [1 << j for j in range(bits.shape[1])]
        return np.array([sum(w for w, b in zip(weights, row, strict=True) if b) for row in bits],
                        dtype=object)

    def encode(self, words) -> np.ndarray:
        """Codewords (object array of ints, same shape) for data ``words`` in [0, 2**data_bits)."""
        flat, shape = _as_ints(words)
        for w in flat:
            if not 0 <= int(w) < (1 << self.data_bits):
                raise ValueError(f"data word {w} does not fit {self.data_bits} bits")
        bits = self._bits(flat, self.data_bits)
        checks = (bits @ self.check_matrix.T.astype(np.int64)) % 2
        overall = (bits.sum(axis=1) + checks.sum(axis=1)) % 2
        code = np.concatenate([bits, checks, overall[:, None]], axis=1)
        return self._ints(code).reshape(shape)

    def syndrome(self, codewords) -> tuple[np.ndarray, np.ndarray]:
        """(syndrome, overall parity) of each codeword, as int64 arrays."""
        flat, shape = _as_ints(codewords)
        for c in flat:
            if not 0 <= int(c) < (1 << self.code_bits):
                raise ValueError(f"codeword {c} does not fit {self.code_bits} bits")
        k, r = self.data_bits, self.hamming_bits
        bits = self._bits(flat, self.code_bits)
        s = (bits[:, :k] @ self.check_matrix.T.astype(np.int64) + bits[:, k:k + r]) % 2
        syndrome = s @ (1 << np.arange(r, dtype=np.int64))
        parity = bits.sum(axis=1) % 2
        return syndrome.reshape(shape), parity.reshape(shape)

    def decode(self, codewords) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(data, corrected, uncorrectable) per codeword; data is 0 where uncorrectable."""
        flat, shape = _as_ints(codewords)
        syndrome, parity = self.syndrome(flat)
        lookup = {pos: j for j, pos in enumerate(self.data_positions)}
        data = np.zeros(len(flat), dtype=object)
        corrected = np.zeros(len(flat), dtype=bool)
        uncorrectable = np.zeros(len(flat), dtype=bool)
        mask = (1 << self.data_bits) - 1
        for n, (c, s, p) in enumerate(zip(flat, syndrome, parity, strict=True)):
            word = int(c) & mask
            if p == 0 and s == 0:
                data[n] = word
            elif p == 1 and s <= self.last_position:
                corrected[n] = True
                data[n] = word ^ (1 << lookup[int(s)]) if int(s) in lookup else word
            else:
                uncorrectable[n] = True
                data[n] = 0
        return data.reshape(shape), corrected.reshape(shape), uncorrectable.reshape(shape)


def flip_bits(codeword: int, positions) -> int:
    """``codeword`` with the bits at ``positions`` (0-based storage bit indices) inverted."""
    for bit in positions:
        codeword ^= 1 << int(bit)
    return codeword
