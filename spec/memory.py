"""Off-chip memory channels: the machine balance their default bandwidth comes from, and
the layout of a read request (see docs/memory_channel.md).

A memory channel sits at a mesh node and serves request packets from the tiles:
``MEM_WRITE`` packets (a word per flit, from the head's address on) and single-flit
``MEM_READ`` requests whose data field is a :class:`MemRead`, answered with ``WRITE``
packets into the requester's scratchpad.
"""

from __future__ import annotations

from fractions import Fraction

from amaranth import unsigned
from amaranth.lib import data

from spec.isa import ADDR_BITS, MEM_ADDR_BITS
from spec.noc import COORD_BITS
from spec.params import check_array_size, check_int

__all__ = [
    "DEFAULT_LATENCY", "DEFAULT_MEMORY_WORDS", "H100_BALANCE", "MAX_BANDWIDTH_DENOMINATOR",
    "MAX_LATENCY", "MAX_MEMORY_ADDR_BITS", "MemRead", "check_bandwidth", "length_bits",
    "machine_balance_bandwidth", "nearest_channel", "peak_ops_per_cycle",
]

#: The machine balance the default bandwidth is taken from: int8 operations per byte of
#: memory bandwidth of an NVIDIA H100 SXM5 — 1,979 TOPS dense int8 over 3.35 TB/s of
#: HBM3 (NVIDIA H100 Tensor Core GPU datasheet; the 3,958 TOPS it also lists assume 2:4
#: sparsity), about 591 operations per byte.
H100_BALANCE = Fraction(1979 * 10**12, 335 * 10**10)

#: A channel's bandwidth is a fraction of bytes per cycle with at most this denominator
#: (the credit counter's unit).
MAX_BANDWIDTH_DENOMINATOR = 256
#: Most cycles of access latency a channel models.
MAX_LATENCY = 4096
#: A channel's access latency unless a design point says otherwise, in cycles: 64 ns at
#: 1 GHz, the order of a DRAM or HBM access.
DEFAULT_LATENCY = 64
#: Words of a channel's store unless a design point says otherwise (128 KiB at N = 8):
#: small while no compiled program uses the channels, since the energy flow's synthesis
#: grows with it (one channel alone: 3.5 s at 2^14 words, 33 s at 2^18, 2026-12-06).
DEFAULT_MEMORY_WORDS = 1 << 14
#: Most word-address bits of a channel's store (2^24 words of 8 bytes = 128 MiB at N = 8):
#: what a DMA's ``mem_addr`` holds.
MAX_MEMORY_ADDR_BITS = MEM_ADDR_BITS


def peak_ops_per_cycle(n: int, tiles: int) -> int:
    """The chip's peak int8 operations per cycle: 2 per MAC, N² MACs per tile."""
    return 2 * check_array_size("n", n) ** 2 * check_int("tiles", tiles, 1, 64)


def machine_balance_bandwidth(n: int, tiles: int, balance: Fraction = H100_BALANCE
                              ) -> Fraction:
    """The memory bandwidth (bytes per cycle, all channels together) that gives a chip of
    ``tiles`` N x N tensor cores the same operations per byte as ``balance``, rounded to
    1/16 byte (2x2, N = 8: 512 / 591 = 0.866, so 7/8)."""
    exact = Fraction(peak_ops_per_cycle(n, tiles)) / Fraction(balance)
    return max(Fraction(round(exact * 16), 16), Fraction(1, 16))


def check_bandwidth(bytes_per_cycle, word_bytes: int) -> Fraction:
    """``bytes_per_cycle`` as a Fraction if it is positive, has a denominator of at most
    :data:`MAX_BANDWIDTH_DENOMINATOR` and moves at most one word (``word_bytes``) per
    cycle; else a ValueError."""
    try:
        value = Fraction(bytes_per_cycle)
    except (TypeError, ValueError):
        raise ValueError(f"bandwidth must be a number of bytes per cycle, "
                         f"not {bytes_per_cycle!r}") from None
    if not 0 < value <= word_bytes:
        raise ValueError(f"bandwidth must be more than 0 and at most one {word_bytes}-byte "
                         f"word per cycle, not {value} bytes per cycle (a faster memory "
                         f"is more channels)")
    if value.denominator > MAX_BANDWIDTH_DENOMINATOR:
        raise ValueError(f"bandwidth {value} bytes per cycle: its denominator must be at "
                         f"most {MAX_BANDWIDTH_DENOMINATOR}")
    return value


def length_bits(n: int) -> int:
    """Bits of a read request's word count at word size N: what is left of the flit's
    8N data bits after the reply's address and destination, at most 16."""
    return min(16, 8 * n - ADDR_BITS - 2 * COORD_BITS)


class MemRead(data.StructLayout):
    """The data field of a ``MEM_READ`` request flit (word size ``n`` ≥ 4): ``length``
    words from the flit's ``addr`` on go to scratchpad address ``spad_addr`` of tile
    (``x``, ``y``); the request flit's ``signal``/``semaphore`` ride on the reply's last
    flit. A ``length`` of 0 asks for that signal alone, once every earlier request to
    the channel has been served (a fence after writes)."""

    def __init__(self, n: int):
        if check_array_size("n", n) < 4:
            raise ValueError(f"a read request needs 8N ≥ {ADDR_BITS + 2 * COORD_BITS + 1} "
                             f"data bits: N must be at least 4, not {n}")
        super().__init__({"spad_addr": unsigned(ADDR_BITS), "x": unsigned(COORD_BITS),
                          "y": unsigned(COORD_BITS), "length": unsigned(length_bits(n))})


def nearest_channel(nodes, x: int, y: int) -> int:
    """The index of the memory channel at ``nodes`` ((x, y) each) nearest the tile at
    (``x``, ``y``): fewest hops, the lower index on a tie. ValueError if there is none."""
    if not nodes:
        raise ValueError("this chip has no memory channels")
    return min(range(len(nodes)), key=lambda c: (abs(nodes[c][0] - x) + abs(nodes[c][1] - y), c))
