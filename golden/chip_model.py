"""Instruction-level functional model of a k x k chip: tiles joined by a network.

:class:`ChipModel` holds k x k :class:`golden.tile_model.TileModel` tiles — tile (x, y)
at index ``y * k + x``, named by bit ``y * 8 + x`` of a DMA's ``tiles`` mask
(``spec.isa``) — and runs one program per tile concurrently: round-robin, one
instruction per unhalted tile per turn. A WAIT whose semaphore is short does not
execute: the tile blocks and the WAIT is retried on its next turn. When every unhalted
tile is blocked the chip has deadlocked: ``ValueError`` naming each blocked tile, its pc
and the semaphore and count it waits for.

A DMA whose mask names other tiles is delivered here (the tiles' ``network`` hook): the
source words are written into the scratchpad of every named tile (the sender's own too
when its bit is set), then each raises ``remote_semaphore`` when ``remote_signal`` is
set. The model delivers at once; the hardware delivers later, so a program must WAIT on
the remote semaphore before it reads what arrives (the model cannot see a missing WAIT
any more than the tile model can). A mask naming a tile outside the k x k mesh is a
``ValueError`` (the sequencer's BAD_TILE), checked with every destination's region
before any word is written.

Memory channels (``memory_channels`` stores of ``channel_words`` words, zero until
written): a STORE DMA writes its words into its channel at once, a LOAD copies the
channel's words into the requesting tile and raises its remote semaphore, a LOAD of no
words only the semaphore. As with the network, the hardware answers later, and a tile
that reads words another tile stored must be told (a fence, then a signal) first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from golden.tile_model import TileModel

__all__ = ["MESH_MAX", "ChipModel", "mask_of"]

#: Mesh coordinates are 3 bits: a mask has 64 bits, bit y * 8 + x (``spec.isa``).
MESH_MAX = 8


def mask_of(*positions: tuple[int, int]) -> int:
    """The ``tiles`` mask naming the tiles at ``positions`` ((x, y) pairs)."""
    mask = 0
    for x, y in positions:
        if not (0 <= x < MESH_MAX and 0 <= y < MESH_MAX):
            raise ValueError(f"tile position {(x, y)} is outside an 8 x 8 mesh")
        mask |= 1 << (y * MESH_MAX + x)
    return mask


def _decoded(instruction):
    """(opcode name, fields) from a decoded pair or an encoded instruction word."""
    if isinstance(instruction, int):
        from spec.isa import decode

        opcode, fields = decode(instruction)
        return opcode.name, fields
    opcode, fields = instruction
    return getattr(opcode, "name", opcode), fields


class ChipModel:
    """k x k tiles and the network between them (see the module docstring).

    ``tile_kwargs`` go to every :class:`TileModel` (``n``, ``spad_words``, ``acc_depth``,
    ``slots``, ``max_top_k``). ``tiles[i]`` is the tile at (i % k, i // k).
    ``memory_channels`` stores of ``channel_words`` words each: ``channels[c]``, a dict
    of the words written (address -> word).
    """

    def __init__(self, k: int, *, memory_channels: int = 0, channel_words: int = 0,
                 **tile_kwargs):
        if not isinstance(k, int) or not 1 <= k <= MESH_MAX:
            raise ValueError(f"mesh size k must be 1..{MESH_MAX}, not {k!r}")
        if "position" in tile_kwargs or "mesh" in tile_kwargs:
            raise ValueError("tile positions and the mesh are set by the chip")
        self.k = k
        self.tiles = [TileModel(position=(i % k, i // k), mesh=(k, k),
                                memory_channels=memory_channels, channel_words=channel_words,
                                **tile_kwargs)
                      for i in range(k * k)]
        self.channels: list[dict[int, int]] = [{} for _ in range(memory_channels)]
        for tile in self.tiles:
            tile.network = self._deliver
            tile.memory = self._memory
        #: Words delivered to each tile (a multicast counts once per destination) and
        #: DMAs / words injected by each tile that went over the network.
        self.words_received = [0] * (k * k)
        self.dmas_sent = [0] * (k * k)
        self.words_sent = [0] * (k * k)

    # --- addressing -----------------------------------------------------------------------

    def index(self, x: int, y: int) -> int:
        """Tile index of (x, y)."""
        if not (0 <= x < self.k and 0 <= y < self.k):
            raise ValueError(f"tile ({x}, {y}) is outside the {self.k} x {self.k} mesh")
        return y * self.k + x

    def tile(self, x: int, y: int) -> TileModel:
        return self.tiles[self.index(x, y)]

    def mask_tiles(self, mask: int) -> list[TileModel]:
        """The tiles a ``tiles`` mask names; ValueError for a bit outside the mesh."""
        if mask <= 0 or mask >> (MESH_MAX * MESH_MAX):
            raise ValueError(f"tile mask {mask:#x} is empty or wider than 64 bits")
        named = []
        for bit in range(MESH_MAX * MESH_MAX):
            if mask >> bit & 1:
                x, y = bit % MESH_MAX, bit // MESH_MAX
                if x >= self.k or y >= self.k:
                    raise ValueError(f"DMA tile mask {mask:#x} names tile ({x}, {y}) (bit "
                                     f"{bit}), outside the {self.k} x {self.k} mesh")
                named.append(self.tiles[y * self.k + x])
        return named

    # --- the network ----------------------------------------------------------------------

    def _deliver(self, source: TileModel, f: dict, words: list[int]) -> None:
        destinations = self.mask_tiles(f["tiles"])
        for tile in destinations:  # every destination checked before anything lands
            tile.check_receive(f["dst"], len(words))
        src = self.tiles.index(source)
        self.dmas_sent[src] += 1
        self.words_sent[src] += len(words)
        for tile in destinations:
            tile.receive(f["dst"], words, f["remote_signal"], f["remote_semaphore"])
            self.words_received[self.tiles.index(tile)] += len(words)

    def _memory(self, source: TileModel, f: dict, words: list[int] | None) -> None:
        store, base = self.channels[f["channel"]], f["mem_addr"]
        if words is not None:  # a STORE
            store.update((base + i, word) for i, word in enumerate(words))
            return
        source.receive(f["dst"], [store.get(base + i, 0) for i in range(f["length"])],
                       f["remote_signal"], f["remote_semaphore"])

    # --- running --------------------------------------------------------------------------

    def _programs(self, programs) -> list[list]:
        out: list[list] = [[] for _ in self.tiles]
        items = programs.items() if isinstance(programs, Mapping) else enumerate(programs)
        for key, program in items:
            if isinstance(key, tuple):
                index = self.index(*key)
            elif isinstance(key, int) and 0 <= key < len(self.tiles):
                index = key
            else:
                raise ValueError(f"program key {key!r} names no tile of the {self.k} x "
                                 f"{self.k} mesh (an index 0..{len(self.tiles) - 1} or (x, y))")
            out[index] = [_decoded(i) for i in program]
        return out

    def run(self, programs: Mapping | Sequence, max_turns: int | None = None) -> list[int]:
        """Run one program per tile until every tile has halted (or run off its end).

        ``programs``: a list indexed by tile index, or a dict keyed by index or (x, y);
        each a list of instructions, ``(opcode name or Opcode, fields)`` or encoded
        words: its instruction memory from pc 0, where it starts at its last HALT's
        ``next`` (pc 0 at first, :meth:`TileModel.start`). A tile without a program
        stays idle. Returns the instructions each tile
        executed (HALT included). ValueError on a deadlock, or after ``max_turns`` turns.
        """
        progs = self._programs(programs)
        for tile in self.tiles:
            tile.start()
        active = [bool(p) for p in progs]
        executed = [0] * len(self.tiles)
        turns = 0
        while any(active):
            turns += 1
            if max_turns is not None and turns > max_turns:
                raise ValueError(f"the chip did not halt within {max_turns} turns")
            progressed = False
            for i, tile in enumerate(self.tiles):
                if not active[i]:
                    continue
                opcode, fields = progs[i][tile.pc]
                if tile.would_block(opcode, fields):
                    continue
                running = tile.step(opcode, fields)
                progressed = True
                executed[i] += 1
                if not running or not 0 <= tile.pc < len(progs[i]):
                    active[i] = False
            if not progressed:
                blocked = []
                for i, tile in enumerate(self.tiles):
                    if active[i]:
                        f = progs[i][tile.pc][1]
                        sem = f.get("semaphore", 0)
                        blocked.append(f"tile ({i % self.k}, {i // self.k}) pc {tile.pc} WAIT "
                                       f"semaphore {sem} count {f.get('count', 0)} (holds "
                                       f"{tile.semaphores[sem]})")
                raise ValueError("deadlock: every running tile waits: " + "; ".join(blocked))
        return executed
