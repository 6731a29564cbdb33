"""How a GEMM becomes tensor-core stream beats and back (pure NumPy, no simulator).

A GEMM of A (M x K) by B (K x P) is cut into ceil(M/N) x ceil(P/N) output tiles, row-tile
major. Each tile sends K beats on both operand streams (A column k of the row block, B row
k of the column block; blocks past the matrix edge are zero) and returns N result rows.
Beats are packed as the RTL's :class:`rtl.tensor_core.OperandBeat` /
:class:`~rtl.tensor_core.ResultRow` layouts: element i in bits [w·i, w·(i+1)), then
``last``.
"""

from __future__ import annotations

import numpy as np

from spec.numerics import NUMERICS

OPERAND_BITS = NUMERICS.operand_bits
ACC_BITS = NUMERICS.acc_bits


def tile_grid(m: int, p: int, n: int) -> tuple[int, int]:
    """Number of (row, column) output tiles of an M x P result on an N x N array."""
    return -(-m // n), -(-p // n)


def _pad(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), dtype=np.int64)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def _pack(elements: np.ndarray, bits: int, last: np.ndarray) -> list[int]:
    """Rows of ``elements`` (signed) as little-endian integers with ``last`` on top."""
    count, n = elements.shape
    fields = elements.astype(np.int64) & ((1 << bits) - 1)
    flag = 1 << (n * bits)
    if bits % 8:  # not whole bytes: join the fields one by one
        return [sum(int(v) << (bits * j) for j, v in enumerate(row)) | (flag if last[i] else 0)
                for i, row in enumerate(fields)]
    raw = fields.astype(f"<u{bits // 8}").tobytes()
    step = n * bits // 8
    return [
        int.from_bytes(raw[i * step : (i + 1) * step], "little") | (flag if last[i] else 0)
        for i in range(count)
    ]


def operand_beats(a: np.ndarray, b: np.ndarray, n: int,
                  a_bits: int = OPERAND_BITS) -> tuple[list[int], list[int]]:
    """The A and B stream words for ``a @ b``, every output tile in order (A values
    ``a_bits`` wide, as ``TensorCore(n, a_bits)`` takes them)."""
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    rows, cols = tile_grid(m, b.shape[1], n)
    a_pad, b_pad = _pad(a, rows * n, k), _pad(b, k, cols * n)
    last = np.arange(k) == k - 1
    a_words, b_words = [], []
    for ti in range(rows):
        a_tile = _pack(a_pad[ti * n : (ti + 1) * n, :].T, a_bits, last)
        for tj in range(cols):
            a_words += a_tile
            b_words += _pack(b_pad[:, tj * n : (tj + 1) * n], OPERAND_BITS, last)
    return a_words, b_words


def result_rows(words: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Unpack result-stream words into (rows x N int32 values, last flags)."""
    width = n * ACC_BITS // 8
    raw = b"".join((w & ((1 << (n * ACC_BITS)) - 1)).to_bytes(width, "little") for w in words)
    values = np.frombuffer(raw, dtype="<i4").reshape(len(words), n)
    last = np.array([(w >> (n * ACC_BITS)) & 1 for w in words], dtype=bool)
    return values, last


def assemble(values: np.ndarray, m: int, p: int, n: int) -> np.ndarray:
    """The M x P result from tile rows in stream order (padding rows and columns dropped)."""
    rows, cols = tile_grid(m, p, n)
    if values.shape[0] != rows * cols * n:
        raise ValueError(f"expected {rows * cols * n} result rows, got {values.shape[0]}")
    tiles = values.reshape(rows, cols, n, n).transpose(0, 2, 1, 3).reshape(rows * n, cols * n)
    return tiles[:m, :p]
