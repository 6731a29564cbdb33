"""Paged KV cache: fixed-size pages of tokens, addressed through a per-sequence block table.

Layout (as in the scratchpad): ``k_pages`` is (num_pages, page_size, kv_heads, head_dim)
int8 and ``v_pages`` is (num_pages, page_size, kv_heads, v_head_dim) int8. Sequence b's
token t lives in physical page ``block_table[b, t // page_size]`` at slot
``t % page_size``. Unused block-table entries hold -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PagedKVCache:
    """A KV cache of ``num_pages`` pages of ``page_size`` tokens (all KV heads per page)."""

    k_pages: np.ndarray
    v_pages: np.ndarray

    def __post_init__(self) -> None:
        k, v = np.asarray(self.k_pages), np.asarray(self.v_pages)
        if k.ndim != 4 or v.ndim != 4:
            raise ValueError(
                "k_pages and v_pages must be (num_pages, page_size, kv_heads, dim), "
                f"got shapes {k.shape} and {v.shape}"
            )
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(
                f"k_pages {k.shape} and v_pages {v.shape} differ in pages, page size or kv heads"
            )
        if k.dtype != np.int8 or v.dtype != np.int8:
            raise ValueError(f"KV pages must be int8, got {k.dtype} and {v.dtype}")
        if 0 in k.shape or 0 in v.shape:
            raise ValueError(f"KV pages must not be empty, got {k.shape} and {v.shape}")

    @property
    def num_pages(self) -> int:
        return self.k_pages.shape[0]

    @property
    def page_size(self) -> int:
        return self.k_pages.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.k_pages.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k_pages.shape[3]

    @property
    def v_head_dim(self) -> int:
        return self.v_pages.shape[3]


def pages_needed(context_len: int, page_size: int) -> int:
    """Pages holding ``context_len`` tokens."""
    return -(-context_len // page_size)


def check_block_table(
    cache: PagedKVCache, block_table: np.ndarray, context_lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a block table against the cache and the context lengths; return both as int64.

    Raises ValueError for a context of 0 or one longer than the table's capacity
    (``block_table.shape[1] * page_size``), and for a used entry outside ``[0, num_pages)``.
    """
    table = np.asarray(block_table)
    lens = np.asarray(context_lens)
    if table.ndim != 2 or not np.issubdtype(table.dtype, np.integer):
        raise ValueError(
            f"block_table must be a 2-D integer array, got {table.shape} {table.dtype}"
        )
    if lens.ndim != 1 or lens.shape[0] != table.shape[0]:
        raise ValueError(
            f"context_lens {lens.shape} must hold one length per block-table row {table.shape[0]}"
        )
    if not np.issubdtype(lens.dtype, np.integer):
        raise ValueError(f"context_lens must be integers, got {lens.dtype}")
    capacity = table.shape[1] * cache.page_size
    for b, n in enumerate(lens.tolist()):
        if n < 1:
            raise ValueError(f"sequence {b}: context length {n} must be at least 1")
        if n > capacity:
            raise ValueError(
                f"sequence {b}: context length {n} exceeds the KV capacity of {capacity} tokens "
                f"({table.shape[1]} pages of {cache.page_size})"
            )
        used = table[b, : pages_needed(n, cache.page_size)]
        bad = (used < 0) | (used >= cache.num_pages)
        if bad.any():
            page = int(np.argmax(bad))
            raise ValueError(
                f"sequence {b}: block table entry {page} -> physical page {int(used[page])} "
                f"is outside the cache of {cache.num_pages} pages"
            )
    return table.astype(np.int64), lens.astype(np.int64)


def gather(cache: PagedKVCache, block_table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logical K and V per sequence: (batch, pages*page_size, kv_heads, dim) each.

    Entries past a sequence's context read page 0 (any valid page); callers mask them.
    """
    table = np.where(np.asarray(block_table) < 0, 0, block_table)
    b, p = table.shape
    k = cache.k_pages[table].reshape(b, p * cache.page_size, cache.kv_heads, cache.head_dim)
    v = cache.v_pages[table].reshape(b, p * cache.page_size, cache.kv_heads, cache.v_head_dim)
    return k, v


def build_cache(
    keys: list[np.ndarray],
    values: list[np.ndarray],
    page_size: int,
    num_pages: int | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[PagedKVCache, np.ndarray]:
    """Place per-sequence K/V (each (len, kv_heads, dim) int8) into pages; return cache, table.

    Physical pages are handed out in a shuffled order when ``rng`` is given (as an
    allocator would after some churn), else in order. ``num_pages`` defaults to the pages
    needed; unused slots are zero.
    """
    if len(keys) != len(values) or not keys:
        raise ValueError("build_cache needs the same, non-zero number of key and value sequences")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    needed = [pages_needed(len(k), page_size) for k in keys]
    total = sum(needed)
    num_pages = total if num_pages is None else num_pages
    if num_pages < total:
        raise ValueError(f"{total} pages needed but the cache has {num_pages}")
    order = np.arange(num_pages) if rng is None else rng.permutation(num_pages)
    kvh, dk, dv = keys[0].shape[1], keys[0].shape[2], values[0].shape[2]
    k_pages = np.zeros((num_pages, page_size, kvh, dk), np.int8)
    v_pages = np.zeros((num_pages, page_size, kvh, dv), np.int8)
    table = np.full((len(keys), max(needed)), -1, np.int64)
    next_page = 0
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        if k.shape[0] != v.shape[0] or k.shape[1:] != (kvh, dk) or v.shape[1:] != (kvh, dv):
            raise ValueError(f"sequence {b}: key {k.shape} / value {v.shape} shapes disagree")
        for page in range(needed[b]):
            phys = int(order[next_page])
            next_page += 1
            table[b, page] = phys
            chunk = slice(page * page_size, (page + 1) * page_size)
            n = k[chunk].shape[0]
            k_pages[phys, :n] = k[chunk]
            v_pages[phys, :n] = v[chunk]
    return PagedKVCache(k_pages, v_pages), table
