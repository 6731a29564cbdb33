"""The program builder: tile programs for the golden workloads (see docs/compiler.md).

- :class:`TileConfig` (``spec.config``): the tile's memories, slots, program memory
  and KV cache.
- ``compiler.attention``: one attention layer, prefill, extend (a chunked prefill over
  a cached context) and decode, bit-exact with ``golden.attention``.
- :class:`TileProgram` (``compiler.program``): instruction words, host writes, KV pages,
  output reader, static summary; :func:`run_on_model` runs one on the functional model.
- :func:`check_synchronisation` (``compiler.hazards``): every cross-engine dependency
  covered by a semaphore.
"""

from compiler.attention import (
    AttentionLayer,
    build_decode,
    build_extend,
    build_prefill,
    decode_from_workload,
    prefill_from_workload,
)
from compiler.hazards import check_synchronisation
from compiler.kv import KvLayout, PageAllocator
from compiler.program import ProgramSummary, TileProgram, run_on_model
from spec.config import TileConfig

__all__ = [
    "AttentionLayer", "KvLayout", "PageAllocator", "ProgramSummary", "TileConfig",
    "TileProgram", "build_decode", "build_extend", "build_prefill", "check_synchronisation",
    "decode_from_workload", "prefill_from_workload", "run_on_model",
]
