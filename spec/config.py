"""The tile a program is compiled for: memory sizes, vector slots, program memory, KV cache.

One :class:`TileConfig` names every hardware parameter the program builder needs; the
same numbers configure the RTL blocks (``rtl.sequencer.Sequencer``: ``array_size``,
``scratchpad_words``, ``acc_depth``, ``slots``, ``program_depth``;
``rtl.scratchpad.Scratchpad``: ``banks``, ``page_size``, ``token_words``, ``num_pages``,
``sequences``, ``max_pages``, ``kv_base``) and the functional model
(``golden.tile_model.TileModel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

from spec.isa import ACC_ADDR_BITS, ADDR_BITS, tile_bit
from spec.memory import (
    DEFAULT_LATENCY,
    DEFAULT_MEMORY_WORDS,
    check_bandwidth,
    machine_balance_bandwidth,
    nearest_channel,
)
from spec.noc import DEFAULT_DEPTH, MAX_DEPTH, MAX_PACKET
from spec.params import MAX_N, MIN_N

__all__ = ["ChipConfig", "TileConfig", "ceil_div", "kv_context", "next_pow2"]

#: Most block-table entries of a scratchpad (``rtl.scratchpad``: a mapped bit per entry
#: in registers, the physical pages in a memory).
MAX_TABLE_ENTRIES = 2048


def ceil_div(x: int, n: int) -> int:
    """``x / n`` rounded up: how many blocks of ``n`` hold ``x``."""
    return -(-x // n)


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (x >= 1)."""
    return 1 << (max(x, 1) - 1).bit_length()


def kv_context(rows: int, page_size: int, max_context: int | None, default: int) -> int:
    """Tokens per sequence to size a KV cache of ``rows`` block-table rows for:
    ``max_context``, or ``default`` clamped to what the table maps; a ValueError when
    ``max_context`` needs more pages per row than :data:`MAX_TABLE_ENTRIES` leave."""
    longest = MAX_TABLE_ENTRIES // rows * page_size
    if max_context is None:
        return min(default, longest)
    if max_context > longest:
        raise ValueError(f"a KV cache for {max_context} tokens per sequence needs "
                         f"{-(-max_context // page_size)} pages per block-table row; "
                         f"{rows} rows fit the {MAX_TABLE_ENTRIES}-entry block table only "
                         f"up to {longest} tokens ({page_size}-token pages)")
    return max_context


def _is_pow2(x: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1 and not x & (x - 1)


@dataclass(frozen=True)
class TileConfig:
    """Hardware parameters of one tile (see the module docstring for where each goes).

    ``n``: tensor-core size and lanes per word (a scratchpad word holds n int8 values, an
    accumulator entry n signed 48-bit lanes). ``spad_words``: scratchpad words (at most
    2**16) in ``banks`` banks (word ``w`` in bank ``w % banks``). ``acc_depth``:
    accumulator entries (a power of two, at most 1024). ``slots``: vector-unit slots (a
    VEC of r rows uses r of them). ``program_depth``: instruction words (a power of two;
    loops are unrolled, so this bounds the work of one program). KV cache: ``num_pages``
    physical pages of ``page_size`` tokens x ``token_words`` words starting at
    ``kv_base`` (default: the top of the scratchpad), addressed through a block table of
    ``kv_sequences`` rows x ``max_pages`` entries (one row per (sequence, KV head, K or
    V)).

    The defaults hold one gpt-oss-shaped layer (head_dim 32, 16-token pages) at a 1500-
    token decode context: 32 Ki scratchpad words, 384 pages, a 4 Ki-word program.
    """

    n: int = 8
    spad_words: int = 32768
    banks: int = 8
    acc_depth: int = 256
    slots: int = 8
    program_depth: int = 4096
    page_size: int = 16
    token_words: int = 4
    num_pages: int = 384
    kv_sequences: int = 8
    max_pages: int = 128
    kv_base: int | None = None
    #: The KV region's first word, resolved from ``kv_base`` (read-only).
    kv_start: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"TileConfig: {message}")

        def integer(name: str) -> int:
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool),
                 f"{name} must be an integer, not {value!r}")
            return value

        for name in ("n", "spad_words", "banks", "acc_depth", "slots", "program_depth", "page_size",
                     "token_words", "num_pages", "kv_sequences", "max_pages"):
            integer(name)
        need(_is_pow2(self.n) and MIN_N <= self.n <= MAX_N,
             f"n must be a power of two {MIN_N}..{MAX_N}, not {self.n}")
        need(1 <= self.spad_words <= 1 << ADDR_BITS,
             f"spad_words must be 1..{1 << ADDR_BITS}, not {self.spad_words}")
        need(_is_pow2(self.banks) and self.banks <= 64 and self.spad_words % self.banks == 0,
             f"banks must be a power of two up to 64 that divides spad_words "
             f"({self.spad_words}), not {self.banks}")
        need(_is_pow2(self.spad_words // self.banks) and self.spad_words // self.banks >= 2,
             f"spad_words / banks (each bank's depth) must be a power of two >= 2, not "
             f"{self.spad_words} / {self.banks}")
        need(_is_pow2(self.acc_depth) and 2 <= self.acc_depth <= 1 << ACC_ADDR_BITS,
             f"acc_depth must be a power of two 2..{1 << ACC_ADDR_BITS}, not {self.acc_depth}")
        need(1 <= self.slots <= 64, f"slots must be 1..64, not {self.slots}")
        need(_is_pow2(self.program_depth) and 2 <= self.program_depth <= 1 << 16,
             f"program_depth must be a power of two 2..65536, not {self.program_depth}")
        need(_is_pow2(self.page_size) and self.page_size <= 1 << 16,
             f"page_size must be a power of two (the scratchpad's KV port), not {self.page_size}")
        need(_is_pow2(self.token_words),
             f"token_words must be a power of two, not {self.token_words}")
        for name in ("num_pages", "kv_sequences", "max_pages"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, not {getattr(self, name)}")
        need(self.kv_sequences * self.max_pages <= MAX_TABLE_ENTRIES,
             f"the block table ({self.kv_sequences} rows x {self.max_pages} pages) may hold "
             f"at most {MAX_TABLE_ENTRIES} entries")
        need(self.kv_words <= self.spad_words,
             f"{self.num_pages} KV pages of {self.page_words} words ({self.kv_words} words) "
             f"do not fit the {self.spad_words}-word scratchpad")
        base = self.spad_words - self.kv_words if self.kv_base is None else integer("kv_base")
        need(base >= 0 and base % self.page_words == 0
             and base + self.kv_words <= self.spad_words,
             f"kv_base {base} must be a multiple of the page size in words "
             f"({self.page_words}) with the {self.kv_words}-word KV region inside the "
             f"{self.spad_words}-word scratchpad")
        object.__setattr__(self, "kv_start", base)

    @property
    def page_words(self) -> int:
        """Scratchpad words of one KV page."""
        return self.page_size * self.token_words

    @property
    def kv_words(self) -> int:
        """Scratchpad words of the KV region."""
        return self.num_pages * self.page_words

    @property
    def kv_end(self) -> int:
        """One past the last word of the KV region."""
        return self.kv_start + self.kv_words

    def page_address(self, phys: int) -> int:
        """First word of physical KV page ``phys``."""
        if not 0 <= phys < self.num_pages:
            raise ValueError(f"physical page {phys} is outside the {self.num_pages}-page cache")
        return self.kv_start + phys * self.page_words

    def to_rtl(self, *, fault_injection: bool = False) -> dict:
        """The :class:`rtl.tile.Tile` parameters of this design point (without its
        position and mesh, which the chip gives each tile)."""
        return dict(n=self.n, banks=self.banks, depth=self.spad_words // self.banks,
                    page_size=self.page_size, token_words=self.token_words,
                    num_pages=self.num_pages, sequences=self.kv_sequences,
                    max_pages=self.max_pages, acc_depth=self.acc_depth, slots=self.slots,
                    program_depth=self.program_depth, fault_injection=fault_injection)

    @classmethod
    def for_attention(cls, head_dim: int, v_head_dim: int, page_size: int,
                      **overrides) -> TileConfig:
        """A config whose KV pages fit this attention shape (token_words from the larger
        head dim), other fields default unless given."""
        n = overrides.get("n", cls.n)
        words = next_pow2(ceil_div(max(head_dim, v_head_dim), n))
        return cls(**{"page_size": page_size, "token_words": words, **overrides})

    @classmethod
    def for_kv_cache(cls, head_dim: int, v_head_dim: int, page_size: int, *, n: int,
                     rows: int, max_context: int, working_words: int,
                     program_depth: int = 4096, every_page: bool = False) -> TileConfig:
        """The design point of a tile that keeps KV pages for ``rows`` block-table rows of
        ``max_context`` tokens each beside ``working_words`` of other data: the scratchpad
        the next power of two that holds both, at most 2**16 words. Past that, fewer
        pages (at least one per row; rows then share the pages), or with ``every_page``
        a ValueError, as when not even one page per row fits. Every design point of
        ``sim.tile_run`` and ``sim.chip_run`` is sized here."""
        pages = ceil_div(max_context, page_size)
        page_words = page_size * next_pow2(ceil_div(max(head_dim, v_head_dim), n))
        spad = min(next_pow2(rows * pages * page_words + working_words), 1 << ADDR_BITS)
        num_pages = min(rows * pages, (spad - working_words) // page_words)
        if every_page and num_pages < rows * pages:
            raise ValueError(f"{rows} KV caches of {max_context} tokens ({rows * pages} "
                             f"pages of {page_words} words) and {working_words} working "
                             f"words do not fit a scratchpad of at most {1 << ADDR_BITS} "
                             "words")
        if num_pages < rows:
            raise ValueError(f"a {spad}-word scratchpad holds only {max(num_pages, 0)} KV "
                             f"pages of {page_words} words beside the {working_words} "
                             "working words")
        return cls.for_attention(head_dim, v_head_dim, page_size, n=n, spad_words=spad,
                                 num_pages=num_pages, kv_sequences=rows, max_pages=pages,
                                 program_depth=program_depth)


@dataclass(frozen=True)
class ChipConfig:
    """One design point: a ``k`` x ``k`` mesh of identical tiles (``tile``), routers with
    ``vcs`` virtual channels of ``depth`` flits, packets of at most ``max_packet`` flits.
    The same numbers build the RTL (``rtl.chip.Chip``, see ``sim.chip_run``) and the
    functional model (``golden.chip_model``)."""

    k: int = 2
    tile: TileConfig = field(default_factory=TileConfig)
    vcs: int = 2
    depth: int = DEFAULT_DEPTH
    max_packet: int = 8
    #: Memory channels (``rtl.memory_channel``): the node of each (default: one per
    #: row on the west edge, none on a 1 x 1 chip), the words of each store, their
    #: access latency and their total bandwidth in bytes per cycle as a fraction
    #: ("7/8"; default: the machine balance, ``spec.memory.machine_balance_bandwidth``).
    memory_nodes: tuple | None = None
    memory_words: int = DEFAULT_MEMORY_WORDS
    memory_latency: int = DEFAULT_LATENCY
    memory_bandwidth: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or not 1 <= self.k <= 8:
            raise ValueError(f"ChipConfig: the mesh side k must be 1..8, not {self.k!r}")
        nodes = (tuple((0, y) for y in range(self.k)) if self.k > 1 else ()) \
            if self.memory_nodes is None else tuple(tuple(node) for node in self.memory_nodes)
        object.__setattr__(self, "memory_nodes", nodes)
        if nodes and self.k == 1:
            raise ValueError("ChipConfig: a 1 x 1 chip has no network to reach memory channels")
        if not isinstance(self.tile, TileConfig):
            raise ValueError(f"ChipConfig: tile must be a TileConfig, not {self.tile!r}")
        if type(self.vcs) is not int or self.vcs not in (2, 4, 6, 8):
            raise ValueError(f"ChipConfig: vcs must be 2, 4, 6 or 8, not {self.vcs!r}")
        for name, most in (("depth", MAX_DEPTH), ("max_packet", MAX_PACKET)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
                raise ValueError(f"ChipConfig: {name} must be 1..{most} flits, not {value!r}")
        if self.memory_bandwidth is not None:
            self._check_bandwidth(nodes)

    def _check_bandwidth(self, nodes: tuple) -> None:
        """``memory_bandwidth`` shared by the channels, each within what one moves (at
        most a word a cycle); kept as its exact fraction ("7/8")."""
        if not nodes:
            raise ValueError("ChipConfig: a chip without memory channels has no memory "
                             "bandwidth to set")
        try:
            total = Fraction(self.memory_bandwidth)
            check_bandwidth(total / len(nodes), self.tile.n)
        except (TypeError, ValueError, ZeroDivisionError) as error:
            raise ValueError(f"ChipConfig: memory bandwidth {self.memory_bandwidth!r} byte/"
                             f"cycle over {len(nodes)} channels: {error}") from None
        object.__setattr__(self, "memory_bandwidth", str(total))

    @property
    def tiles(self) -> int:
        return self.k * self.k

    @property
    def memory_bytes_per_cycle(self) -> Fraction:
        """The memory channels' bandwidth in all: ``memory_bandwidth``, or the machine
        balance (``spec.memory.machine_balance_bandwidth``) of this chip."""
        if self.memory_bandwidth is not None:
            return Fraction(self.memory_bandwidth)
        return machine_balance_bandwidth(self.tile.n, self.tiles)

    @cached_property
    def tile_channels(self) -> tuple[int, ...]:
        """Each tile's nearest memory channel (``spec.memory.nearest_channel``), by tile
        index; () on a chip without channels."""
        if not self.memory_nodes:
            return ()
        return tuple(nearest_channel(self.memory_nodes, *self.position(t))
                     for t in range(self.tiles))

    @property
    def far_kv_words(self) -> int:
        """Words the busiest memory channel keeps for far placement: a copy of every KV
        page of every tile it is nearest (:meth:`far_page`); 0 without channels."""
        channels = self.tile_channels
        return max(map(channels.count, range(len(self.memory_nodes))), default=0) \
            * self.tile.num_pages * self.tile.page_words

    def far_page(self, tile: int, page: int) -> tuple[int, int]:
        """Where far placement keeps KV page ``page`` of tile ``tile``: (the memory channel
        nearest the tile, the page's first word). The channel's tiles in index order each
        keep ``num_pages`` pages in a row from the top of its store down (the streamed
        weights fill it from the bottom up); ValueError if the store is too small."""
        if not 0 <= page < self.tile.num_pages:
            raise ValueError(f"KV page {page} is outside a tile's {self.tile.num_pages}")
        self.position(tile)  # a tile of the mesh
        if not self.memory_nodes:
            raise ValueError("far placement: this chip has no memory channels")
        channel = self.tile_channels[tile]
        rank = self.tile_channels[:tile].count(channel)
        if self.far_kv_words > self.memory_words:
            raise ValueError(f"far placement: a memory channel of {self.memory_words} words "
                             f"cannot keep the {self.far_kv_words} words of its tiles' KV "
                             "pages")
        words = self.tile.page_words
        return channel, self.memory_words - (rank * self.tile.num_pages + page + 1) * words

    def position(self, index: int) -> tuple[int, int]:
        """(x, y) of tile ``index`` (= y * k + x)."""
        if not 0 <= index < self.tiles:
            raise ValueError(f"tile {index} is outside the {self.k} x {self.k} mesh")
        return index % self.k, index // self.k

    def mask(self, index: int) -> int:
        """The DMA tile mask naming tile ``index`` (``spec.isa.tile_bit``)."""
        return tile_bit(*self.position(index))
