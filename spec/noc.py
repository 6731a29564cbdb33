"""The on-chip network's shared definitions: flit layout, message classes, link signature,
port directions and the dimension-ordered (XY) routing function.

The router (:mod:`rtl.router`), the mesh (:mod:`rtl.mesh`) and the network interface
build on these; a packet is made of flits of :class:`Flit` (see docs/noc.md).
"""

from __future__ import annotations

import enum as py_enum
from dataclasses import dataclass

from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "COORD_BITS", "DEFAULT_DEPTH", "MAX_DEPTH", "MAX_K", "MAX_VCS", "MIN_K", "Coord", "Flit",
    "Link", "MessageClass", "NocConfig", "Port", "branch_region", "mask_bit", "multicast_mask",
    "xy_route",
]

#: Mesh sizes a network can be built at (k x k nodes).
MIN_K, MAX_K = 2, 8
#: Bits of a destination coordinate: enough for the largest mesh, so on a smaller mesh a
#: coordinate outside it is representable (and such a packet is dropped as unroutable).
COORD_BITS = 3
#: Virtual channels a router can have (an even number: half per message class).
MAX_VCS = 8
#: Flits a virtual-channel buffer can hold.
MAX_DEPTH = 16
#: The network's buffer depth unless a design point says otherwise: a slot takes a new
#: flit every 3 cycles at best (credit loop), so 3 more absorb contention. Uniform
#: traffic saturates a 4 x 4 mesh at 0.73 / 0.79 / 0.82 flits/node/cycle with 4 / 5 / 6
#: flits (one run each; docs/results.md).
DEFAULT_DEPTH = 6
#: Most flits in one packet (the network interface's reassembly buffer holds two).
MAX_PACKET = 64


class MessageClass(enum.Enum, shape=1):
    """The two message classes. Each owns its own virtual channels, so a response never
    waits behind a request (no protocol deadlock)."""

    REQUEST = 0
    RESPONSE = 1


class Port(py_enum.IntEnum):
    """The five router ports. ``N`` is towards y - 1, ``S`` towards y + 1, ``E`` towards
    x + 1, ``W`` towards x - 1."""

    L = 0
    N = 1
    E = 2
    S = 3
    W = 4

    @property
    def opposite(self) -> Port:
        return {Port.L: Port.L, Port.N: Port.S, Port.S: Port.N,
                Port.E: Port.W, Port.W: Port.E}[self]

    @property
    def step(self) -> tuple[int, int]:
        """(dx, dy) of one hop through this port."""
        return {Port.L: (0, 0), Port.N: (0, -1), Port.S: (0, 1),
                Port.E: (1, 0), Port.W: (-1, 0)}[self]


class Coord(data.StructLayout):
    """A mesh position: ``x`` (column) and ``y`` (row), ``COORD_BITS`` each."""

    def __init__(self):
        super().__init__({"x": COORD_BITS, "y": COORD_BITS})


class Flit(data.StructLayout):
    """One flit. A packet is a head flit, body flits, then a tail flit; a single-flit
    packet has both ``head`` and ``tail`` set.

    - ``head``, ``tail``: the packet's first and last flit.
    - ``vc``: the packet's virtual channel, the same at every hop. At injection the
      local port's stream index sets it (the field is ignored there).
    - ``cls``: the :class:`MessageClass`; it must match the VC (VCs ``[0, vcs/2)`` carry
      requests, ``[vcs/2, vcs)`` responses).
    - ``multicast``: deliver to every node of ``mask`` (bit ``y * k + x`` for node
      (x, y)) instead of ``dst``. Multicast packets are single-flit.
    - ``dst``: the destination of a unicast packet.
    - ``payload``: ``payload_bits`` of data, never touched by the network.

    Routing fields (``cls``, ``multicast``, ``mask``, ``dst``) are read on head flits
    only; body and tail flits follow their head and may carry anything there.
    """

    def __init__(self, k: int, payload_bits: int, vcs: int):
        super().__init__({
            "head": 1,
            "tail": 1,
            "vc": range(vcs),
            "cls": MessageClass,
            "multicast": 1,
            "mask": k * k,
            "dst": Coord(),
            "payload": payload_bits,
        })


class Link(wiring.Signature):
    """One direction of a router-to-router link, seen from the sender: ``valid`` and
    ``flit`` forward, ``credit`` back (bit v: one slot of VC v freed at the receiver).

    A sender holds one credit per free slot of each of the receiver's VC buffers and
    sends a flit only on a VC with a credit: a link never needs a ready signal.
    """

    def __init__(self, flit_layout: Flit, vcs: int):
        if not isinstance(flit_layout, Flit):
            raise TypeError(f"a link carries a Flit layout, not {flit_layout!r}")
        if not isinstance(vcs, int) or vcs < 1:
            raise ValueError(f"a link needs at least one VC, not {vcs!r}")
        self.flit_layout, self.vcs = flit_layout, vcs
        super().__init__({
            "valid": Out(1),
            "flit": Out(flit_layout),
            "credit": In(vcs),
        })

    def __eq__(self, other):
        return (isinstance(other, Link) and self.flit_layout == other.flit_layout
                and self.vcs == other.vcs)

    def __repr__(self):
        return f"Link({self.flit_layout!r}, {self.vcs})"


@dataclass(frozen=True)
class NocConfig:
    """The parameters every router of one network shares, checked once.

    ``k``: mesh size (k x k, 2 … 8); ``payload_bits``: flit payload (1 … 1024);
    ``vcs``: virtual channels per link (even, 2 … 8: half per message class);
    ``depth``: flits per VC buffer (1 … 16).
    """

    k: int = 4
    payload_bits: int = 32
    vcs: int = 2
    depth: int = DEFAULT_DEPTH

    def __post_init__(self):
        for name, low, high in (("k", MIN_K, MAX_K), ("payload_bits", 1, 1024),
                                ("vcs", 2, MAX_VCS), ("depth", 1, MAX_DEPTH)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) \
                    or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], not {value!r}")
        if self.vcs % 2:
            raise ValueError(f"vcs must be even (half of them per message class), "
                             f"not {self.vcs}")

    @property
    def flit(self) -> Flit:
        return Flit(self.k, self.payload_bits, self.vcs)

    @property
    def vcs_per_class(self) -> int:
        return self.vcs // 2

    def vc_class(self, vc: int) -> MessageClass:
        """The message class VC ``vc`` belongs to."""
        return MessageClass(vc // self.vcs_per_class)

    def class_vcs(self, cls: MessageClass) -> range:
        """The VCs of message class ``cls``."""
        return range(cls.value * self.vcs_per_class, (cls.value + 1) * self.vcs_per_class)


def mask_bit(x: int, y: int, k: int) -> int:
    """The bit of node (x, y) in a ``k`` x ``k`` multicast mask."""
    return 1 << (y * k + x)


def multicast_mask(nodes, k: int) -> int:
    """The multicast mask of the (x, y) positions in ``nodes``."""
    mask = 0
    for x, y in nodes:
        if not (0 <= x < k and 0 <= y < k):
            raise ValueError(f"node {(x, y)} is outside the {k} x {k} mesh")
        mask |= mask_bit(x, y, k)
    return mask


def xy_route(here: tuple[int, int], dst: tuple[int, int]) -> Port:
    """Dimension-ordered routing: the output port at ``here`` towards ``dst`` (X first)."""
    (x, y), (dx, dy) = here, dst
    if dx > x:
        return Port.E
    if dx < x:
        return Port.W
    if dy > y:
        return Port.S
    if dy < y:
        return Port.N
    return Port.L


def branch_region(here: tuple[int, int], port: Port, k: int) -> int:
    """The nodes a multicast leaving ``here`` through ``port`` may still reach along the
    XY tree, as a mask: east/west take every column beyond ``here``, north/south the
    rest of ``here``'s column, local ``here`` itself. The five regions partition the
    mesh, so a node is reached along exactly one branch."""
    x0, y0 = here
    region = 0
    for y in range(k):
        for x in range(k):
            inside = {
                Port.E: x > x0,
                Port.W: x < x0,
                Port.S: x == x0 and y > y0,
                Port.N: x == x0 and y < y0,
                Port.L: x == x0 and y == y0,
            }[port]
            if inside:
                region |= mask_bit(x, y, k)
    return region
