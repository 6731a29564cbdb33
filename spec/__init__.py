"""The ground layer: definitions every other layer shares and nothing here imports from.

- ``spec.isa``: the tile instruction set (layouts, encode/decode, tile masks).
- ``spec.noc``: flits, message classes, links, ports, XY routing, multicast masks.
- ``spec.vector``: the vector unit's opcodes and lane widths.
- ``spec.numerics``: every width and rounding rule of the integer datapath.
- ``spec.config``: :class:`TileConfig` and :class:`ChipConfig`, a design point's sizes.
- ``spec.params``: the parameter checks every block uses (one-line errors).
"""
