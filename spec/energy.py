"""Energy per access of the chip's resources, for the access-energy model (docs/energy.md).

A run's energy is the sum over what its counters saw of count x energy per access, in
four classes: **compute** (MACs the tensor cores did; vector-unit lane-cycles),
**SRAM** (scratchpad word reads and writes; instructions fetched from the sequencer's
instruction memory; accumulator entries read and written), **network** (flits through
a router, flits over a link) and **memory** (bytes read from or written to the memory channels).

The figures are for one process, so that their ratios mean something: 45 nm at 0.9 V,
from M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC
2014 (8-bit add 0.03 pJ, 8-bit multiply 0.2 pJ, 32-bit add 0.1 pJ, 32-bit multiply
3.1 pJ; a 64-bit read of an 8 KB SRAM 10 pJ, of 32 KB 20 pJ, of 1 MB 100 pJ), except
off-chip memory, which is HBM2's 3.9 pJ per bit (M. O'Connor et al., "Fine-grained
DRAM: energy-efficient DRAM for extreme bandwidth systems", MICRO 2017; Horowitz's DDR3
figure is 1.3-2.6 nJ per 64 bits, 5-10x more). The network's are this file's
assumptions: a link is a tile pitch of 1 mm at 0.2 pJ per bit and mm (W. Dally's widely
reproduced figure of about 1 nJ to move 256 bits 20 mm across a 28 nm die, rounded; no
45 nm figure is used), and a flit's write and read of a router's input buffer cost half
an 8 KB SRAM access. They are order-of-magnitude constants, not a process model: what a
comparison of two runs or design points shows is where their counts differ.

Outside the four classes, as outside the rounds' cycles: the **host port**'s transfers
between rounds (program words, scratchpad words, KV appends, outputs read back), at a
PCIe Gen4 link's two ends, 2 x 1.93 pJ per bit (W. Bae et al., "A 1.93-pJ/bit PCI
Express Gen4 PHY transmitter with on-chip supply regulators in 28 nm CMOS",
Electronics 10(1), 68, 2021: its transmitter, doubled for the receiver; the protocol
layers and the host's own memory not included).
"""

from __future__ import annotations

from spec.isa import INSTRUCTION
from spec.numerics import NUMERICS

__all__ = ["ACC_COPIES", "ACC_PJ_PER_64_BITS", "CLASSES", "FETCH_PJ", "HOST_PJ_PER_BYTE",
           "LANE_PJ", "LINK_PJ_PER_BIT", "MAC_PJ", "MEMORY_PJ_PER_BYTE",
           "ROUTER_PJ_PER_64_BITS", "SRAM_PJ_PER_64_BITS", "acc_entry_pj"]

#: The classes a run's energy is split into, in the order reports name them.
CLASSES = ("compute", "sram", "network", "memory")

#: An int8 multiply and the int32 add that accumulates it.
MAC_PJ = 0.2 + 0.1
#: A vector-unit lane busy for a cycle: a 32-bit multiply and add (its requantisation,
#: exponent and reciprocal steps are of that order).
LANE_PJ = 3.1 + 0.1
#: A 64-bit word read or written in a scratchpad bank of 32 KB (scaled by word width).
SRAM_PJ_PER_64_BITS = 20.0
#: An instruction fetched: a read of the bits an instruction uses (203) from the
#: instruction memory, at the scratchpad's energy per 64 bits (4096 instructions are
#: about 100 KB, the order of the 32 KB figure).
FETCH_PJ = SRAM_PJ_PER_64_BITS * INSTRUCTION.size / 64
#: 64 bits read or written in the accumulator memory: an 8 KB SRAM's access (a copy of
#: the tile's 256 entries of N 48-bit lanes is 12 KB at N = 8).
ACC_PJ_PER_64_BITS = 10.0
#: Copies of the accumulator memory a tile keeps, one per read port (the GEMM engine's
#: and the vector engine's a, b and c, ``rtl.tile``): a write goes into every copy.
ACC_COPIES = 4
#: A flit through a router's input buffer (a write and a read), per 64 bits.
ROUTER_PJ_PER_64_BITS = 5.0
#: A flit over a link between neighbouring routers (1 mm), per bit.
LINK_PJ_PER_BIT = 0.2
#: A byte read from or written to a memory channel (HBM2, 3.9 pJ per bit).
MEMORY_PJ_PER_BYTE = 3.9 * 8
#: A byte through the host port: a PCIe Gen4 link's transmitter and receiver.
HOST_PJ_PER_BYTE = 2 * 1.93 * 8


def acc_entry_pj(n: int) -> float:
    """An accumulator entry of ``n`` lanes read or written in one copy."""
    return ACC_PJ_PER_64_BITS * n * NUMERICS.attn_acc_bits / 64
