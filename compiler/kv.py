"""KV-cache placement: which physical pages hold a sequence's keys and values.

The scratchpad's KV port keeps one block-table row per (sequence, KV head, K or V): row
``first_row + 2 * kv_head + (0 for K, 1 for V)``. A page of that row holds
``page_size`` tokens of one KV head, chunk-major: word (token t, chunk c) at
``page_base + c * page_size + t``, channels ``c*N .. c*N + N - 1`` of the token, zero
padded. So a K page is directly the ``b_rows = 1`` B operand of Q·Kᵀ and a V page the
``b_rows = 0`` B operand of P·V (``spec.isa.GemmArgs``).

:class:`PageAllocator` hands out physical pages; :class:`KvLayout` is the result for one
sequence: the block table, the MAP requests the host issues, the appends that fill it
and, for a functional model, the words to place directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec.config import TileConfig

__all__ = ["KvLayout", "PageAllocator", "pack_word"]

K, V = 0, 1


def pack_word(values, n: int) -> int:
    """A scratchpad word from up to n int8 lane values (lane i = bits 8i..8i+7; missing
    lanes are 0)."""
    values = [int(x) for x in values]
    if len(values) > n:
        raise ValueError(f"a word has {n} lanes, got {len(values)} values")
    for x in values:
        if not -128 <= x <= 127:
            raise ValueError(f"lane value {x} is not int8")
    return sum((x & 0xFF) << (8 * i) for i, x in enumerate(values))


class PageAllocator:
    """Free physical KV pages of a tile, handed out in ``order`` (default ascending; a
    seed shuffles them, as after some churn); ``pages`` (a range) restricts the
    allocator to part of the cache. ``free(pages)`` returns pages."""

    def __init__(self, config: TileConfig, seed: int | None = None, pages: range | None = None):
        self.config = config
        pages = range(config.num_pages) if pages is None else pages
        if pages.start < 0 or pages.stop > config.num_pages:
            raise ValueError(f"pages {pages.start}..{pages.stop - 1} are outside the "
                             f"{config.num_pages}-page cache")
        order = np.arange(pages.start, pages.stop)
        if seed is not None:
            order = np.random.default_rng(seed).permutation(order)
        self._free = [int(p) for p in order]

    @property
    def available(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise ValueError(f"KV cache full: {count} pages needed, {len(self._free)} of "
                             f"{self.config.num_pages} free")
        pages, self._free = self._free[:count], self._free[count:]
        return pages

    def free(self, pages) -> None:
        for page in pages:
            if not 0 <= page < self.config.num_pages or page in self._free:
                raise ValueError(f"page {page} is not an allocated page")
            self._free.append(int(page))


@dataclass(frozen=True)
class KvLayout:
    """The KV pages of one sequence of ``tokens`` tokens (see the module docstring).

    ``table[row, logical]`` is the physical page of block-table row
    ``first_row + row`` (row = 2 * kv_head + K/V).
    """

    config: TileConfig
    kv_heads: int
    head_dim: int
    v_head_dim: int
    tokens: int
    first_row: int
    table: np.ndarray

    @classmethod
    def allocate(cls, config: TileConfig, allocator: PageAllocator, kv_heads: int,
                 head_dim: int, v_head_dim: int, tokens: int, first_row: int = 0) -> KvLayout:
        """Pages for ``tokens`` tokens of every KV head, K and V; ValueError if they do
        not fit the block table, the token format or the free pages."""
        n, ps = config.n, config.page_size
        for name, dim in (("head_dim", head_dim), ("v_head_dim", v_head_dim)):
            if -(-dim // n) > config.token_words:
                raise ValueError(f"{name} {dim} needs {-(-dim // n)} words per token; the "
                                 f"KV pages hold token_words = {config.token_words}")
        rows = 2 * kv_heads
        if first_row < 0 or first_row + rows > config.kv_sequences:
            raise ValueError(f"{kv_heads} KV heads need block-table rows {first_row}.."
                             f"{first_row + rows - 1} (K and V per head); the scratchpad has "
                             f"kv_sequences = {config.kv_sequences}")
        pages = -(-tokens // ps)
        if pages > config.max_pages:
            raise ValueError(f"{tokens} tokens need {pages} pages of {ps} per block-table "
                             f"row; the table holds max_pages = {config.max_pages}")
        if rows * pages > allocator.available:
            raise ValueError(f"{tokens} tokens x {kv_heads} KV heads x (K, V) need "
                             f"{rows * pages} KV pages; {allocator.available} of "
                             f"{config.num_pages} are free")
        # Logical page by logical page (every row's page 0, then every row's page 1, ...):
        # a longer context keeps the earlier pages where they were, so a growing cache
        # only ever needs MAPs for its new pages.
        table = np.array(allocator.allocate(rows * pages), np.int64).reshape(pages, rows).T
        return cls(config, kv_heads, head_dim, v_head_dim, tokens, first_row, table)

    @property
    def pages(self) -> int:
        """Logical pages per row."""
        return self.table.shape[1]

    def row(self, kv_head: int, which: int) -> int:
        """Block-table row of a KV head's keys (which = 0) or values (1)."""
        return self.first_row + 2 * kv_head + which

    def page_base(self, kv_head: int, which: int, logical: int) -> int:
        """First scratchpad word of a logical page of a KV head's K (0) or V (1)."""
        return self.config.page_address(int(self.table[2 * kv_head + which, logical]))

    def map_requests(self) -> list[tuple[int, int, int]]:
        """(seq, index, phys) of every KvOp.MAP the host issues before appending."""
        return [(self.first_row + row, logical, int(self.table[row, logical]))
                for row in range(self.table.shape[0]) for logical in range(self.pages)]

    def _token_words(self, k_token: np.ndarray, v_token: np.ndarray):
        """(row, word index, word) of one token, every KV head, K then V."""
        n = self.config.n
        for h in range(self.kv_heads):
            for which, vec in ((K, k_token[h]), (V, v_token[h])):
                chunks = -(-vec.shape[0] // n)
                for c in range(chunks):
                    yield 2 * h + which, c, chunks, pack_word(vec[c * n:(c + 1) * n], n)

    def token_appends(self, k_token: np.ndarray, v_token: np.ndarray
                      ) -> list[tuple[int, int, int, bool]]:
        """(seq, word, data, last) KvOp.APPEND requests of one token: ``k_token``
        (kv_heads, head_dim), ``v_token`` (kv_heads, v_head_dim) int8. Only the words that
        hold channels are written; ``last`` on a row's final word commits the token."""
        k_token, v_token = self._check(k_token[None], v_token[None], 1)
        return [(self.first_row + row, c, data, c == chunks - 1)
                for row, c, chunks, data in self._token_words(k_token[0], v_token[0])]

    def appends(self, k: np.ndarray, v: np.ndarray) -> list[tuple[int, int, int, bool]]:
        """Every append of the sequence, token by token: ``k`` (tokens, kv_heads,
        head_dim), ``v`` (tokens, kv_heads, v_head_dim) int8."""
        k, v = self._check(k, v, self.tokens)
        out = []
        for t in range(self.tokens):
            out += self.token_appends(k[t], v[t])
        return out

    def placement(self, k: np.ndarray, v: np.ndarray) -> dict[int, int]:
        """{address: word} of the whole sequence, what the appends leave in the pages."""
        k, v = self._check(k, v, self.tokens)
        ps, words = self.config.page_size, {}
        for t in range(self.tokens):
            for row, c, _, data in self._token_words(k[t], v[t]):
                base = self.config.page_address(int(self.table[row, t // ps]))
                words[base + c * ps + t % ps] = data
        return words

    def _check(self, k, v, tokens: int):
        k, v = np.asarray(k), np.asarray(v)
        want_k = (tokens, self.kv_heads, self.head_dim)
        want_v = (tokens, self.kv_heads, self.v_head_dim)
        if k.shape != want_k or v.shape != want_v:
            raise ValueError(f"K {k.shape} / V {v.shape} must be {want_k} / {want_v}")
        if k.dtype != np.int8 or v.dtype != np.int8:
            raise ValueError(f"K and V must be int8, got {k.dtype} and {v.dtype}")
        return k, v
