"""The designs ``make synth`` measures: one registry, design name → factory.

Adding a block is one line in :data:`DESIGNS`::

    "scratchpad": rtl_design(Scratchpad, banks=4),

The RTL classes are imported at the top, so the layer contracts (``make lint``) see
what synthesis depends on.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from amaranth.hdl import Elaboratable

from rtl.gemm_engine import GemmEngine
from rtl.memory_channel import MemoryChannel
from rtl.mesh import Mesh
from rtl.network_interface import NetworkInterface
from rtl.router import Router
from rtl.scratchpad import Scratchpad
from rtl.sequencer import Sequencer
from rtl.tensor_core import TensorCore
from rtl.tile import Tile
from rtl.vec_engine import VecEngine
from rtl.vector_unit import VectorUnit
from spec.config import TileConfig

__all__ = [
    "DESIGNS",
    "PNR_TARGET_MHZ",
    "UnknownDesign",
    "rtl_design",
    "check_name",
    "get_factory",
    "build_design",
    "describe",
]

#: A design factory: no arguments, returns a fresh Elaboratable (usually a wiring.Component).
Factory = Callable[[], Elaboratable]

_NAME = re.compile(r"[a-z0-9]+(_[a-z0-9]+)*")


class UnknownDesign(LookupError):
    """No design is registered under that name (the message lists the known ones)."""


def rtl_design(klass: type, /, **params: Any) -> Factory:
    """A factory for ``klass(**params)``, a fresh instance per call."""

    def factory() -> Elaboratable:
        return klass(**params)

    args = ", ".join(f"{k}={v!r}" for k, v in params.items())
    factory.__doc__ = f"{klass.__module__}.{klass.__name__}({args})"
    factory.__qualname__ = factory.__name__ = f"make_{klass.__name__}"
    return factory


#: The tile at FPGA size (``make synth``, ``make fpga``, the report's clock and area).
FPGA_TILE = TileConfig(n=8, spad_words=4096, banks=8, page_size=16, token_words=4,
                       num_pages=32, kv_sequences=4, max_pages=16, program_depth=512)
FPGA_TILE_N4 = dataclasses.replace(FPGA_TILE, n=4)
#: The whole-tile design of each array size.
TILE_DESIGNS = {FPGA_TILE.n: "tile", FPGA_TILE_N4.n: "tile_n4"}

#: Design name → factory. Names are ``[a-z0-9_]`` without ``__`` (the metric separator).
DESIGNS: dict[str, Factory] = {
    "tensor_core_n4": rtl_design(TensorCore, n=4),
    "tensor_core_n8": rtl_design(TensorCore, n=8),
    "tensor_core_n16": rtl_design(TensorCore, n=16),
    "scratchpad": rtl_design(Scratchpad, banks=4),
    "sequencer": rtl_design(Sequencer),
    "vector_unit": rtl_design(VectorUnit, n=8),
    "gemm_engine": rtl_design(GemmEngine, n=8),
    "vec_engine": rtl_design(VecEngine, n=8, slots=8),
    # One tile at FPGA size: 4096-word scratchpad (32 pages of 16 tokens x 4 words),
    # 512-instruction program memory; the simulated design points are larger. At N = 8
    # it outgrows the 85F (no place and route); at N = 4 it fits and gets an Fmax.
    "tile": rtl_design(Tile, **FPGA_TILE.to_rtl()),
    "tile_n4": rtl_design(Tile, **FPGA_TILE_N4.to_rtl()),
    # The network: a router inside a 4 x 4 mesh with 64-bit payloads, in two VC/buffer
    # configurations (same buffer bits per port; the first is the default, the chip's),
    # and a 2 x 2 mesh of the first.
    "router_v2_d6": rtl_design(Router, x=1, y=1, k=4, payload_bits=64,
                               vcs=2, depth=6),
    "router_v4_d3": rtl_design(Router, x=1, y=1, k=4, payload_bits=64,
                               vcs=4, depth=3),
    "mesh_2x2": rtl_design(Mesh, k=2, payload_bits=64, vcs=2, depth=6),
    # The network interface of a tile of a 4 x 4 mesh (87-bit flit payloads at N = 8).
    "network_interface": rtl_design(NetworkInterface, n=8, x=1,
                                    y=1, k=4, vcs=2, max_packet=8),
    # A memory channel of a 4 x 4 mesh with a 4096-word store standing in for the
    # off-chip memory (on a board the store would be the DRAM behind a controller).
    "memory_channel": rtl_design(MemoryChannel, n=8, k=4, words=4096),
}

#: Designs placed and routed at their own target clock when ``--freq`` is not given.
#: nextpnr's router works towards the target: on the N = 4 tile, 100 MHz (three times
#: what it can reach) left 44 000 arcs unrouted after 80 minutes, while the board build
#: at 25 MHz routed in 35. A target near the design's reach converges, and the achieved
#: Fmax is what nextpnr measures, whatever the target.
PNR_TARGET_MHZ: dict[str, float] = {
    "tile_n4": 35.0,
}


def check_name(name: str) -> None:
    """Refuse a design name that would not make a well-formed metric name."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"design name {name!r} must be lower-case letters, digits and single underscores"
        )


def get_factory(name: str, designs: dict[str, Factory] | None = None) -> Factory:
    """The factory registered as ``name``; :class:`UnknownDesign` listing the known ones if none."""
    designs = DESIGNS if designs is None else designs
    try:
        return designs[name]
    except KeyError:
        known = ", ".join(sorted(designs)) or "(none)"
        raise UnknownDesign(f"unknown design {name!r}; known designs: {known}") from None


def build_design(name: str, designs: dict[str, Factory] | None = None) -> Elaboratable:
    """A fresh instance of the design registered as ``name``."""
    factory = get_factory(name, designs)
    check_name(name)
    return factory()


def describe(name: str, designs: dict[str, Factory] | None = None) -> str:
    """One line saying what the factory builds (its docstring)."""
    factory = get_factory(name, designs)
    return (factory.__doc__ or factory.__qualname__).strip().splitlines()[0]
