"""Functional coverage: the cover points of every block, with cocotb-coverage.

The tests sample these points where they check results (a scoreboard, a response, a
passing program), in the pytest process or inside a cocotb simulation. Every process
that sampled exports its counts to ``$SERRANO_COVERAGE_DIR`` (set by ``make regress``;
unset, nothing is written), and :func:`merge` sums the files of every seed and shard
into one report. ``docs/testplan.yaml`` names, per testpoint, the cover points below.

Groups (bins):

- ``router.turn``: input port -> output port x VC, every turn dimension-ordered routing
  allows at a router with all four neighbours (17 turns x 2 VCs);
- ``router.multicast``: the set of outputs one multicast flit from the local port is
  copied to (every non-empty subset of the five);
- ``router.backpressure``: an output whose downstream buffer was full (no credit);
- ``scratchpad.conflict``: a port whose request lost its bank to another port;
- ``scratchpad.status``: every response status a plain and the KV port can return
  (ECC corrected / uncorrectable, the KV cache full, unmapped pages, bad requests);
- ``sequencer.opcode``, ``sequencer.error``: every instruction executed, every error
  status raised; ``sequencer.hazard``: every kind of cross-engine dependency (RAW, WAR,
  WAW between GEMM, VEC and DMA, where their memories overlap) in a program that ran;
- ``attention.context``: prefill and decode with the context ending on a page's last
  token, on a new page's first token, or inside a page; ``attention.gqa``: query heads
  per KV head;
- ``moe.load``: experts' token loads balanced, skewed, with an idle expert (a layer may
  be several); ``moe.ties``: a top-k choice decided between equal router scores (on the
  chip, and in the vector unit's routing programs).
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from cocotb_coverage.coverage import CoverPoint, coverage_db

from rtl.sequencer import ErrorCode
from spec.isa import Opcode

#: Directory the processes of a regression export their counts to.
ENV = "SERRANO_COVERAGE_DIR"
_PROCESS = uuid.uuid4().hex[:12]

# --- router ----------------------------------------------------------------------------

PORTS = ("L", "N", "E", "S", "W")
#: Turns XY routing allows: X first (a packet arriving from W or E may still turn), then
#: Y (one arriving from N or S only goes on or leaves).
_TURNS = {"L": "LNESW", "W": "LNES", "E": "LNSW", "N": "LS", "S": "LN"}
ROUTER_VCS = 2


@CoverPoint("top.router.turn", xf=lambda i, o, vc: f"{i}>{o}:vc{vc}",
            bins=[f"{i}>{o}:vc{vc}" for i, outs in _TURNS.items() for o in outs
                  for vc in range(ROUTER_VCS)])
def router_flit(inp: str, out: str, vc: int) -> None:
    """A flit left the router: came in on port ``inp``, left on ``out``, on ``vc``."""


_SUBSETS = ["+".join(s) for r in range(1, 6) for s in itertools.combinations(PORTS, r)]


@CoverPoint("top.router.multicast", xf=lambda outs: "+".join(p for p in PORTS if p in outs),
            bins=_SUBSETS)
def router_multicast(outs: Iterable[str]) -> None:
    """A multicast flit injected at the local port was copied to the outputs ``outs``."""


@CoverPoint("top.router.backpressure", xf=lambda out: out, bins=list(PORTS))
def router_backpressure(out: str) -> None:
    """Output ``out`` had a flit to send and no credit (its downstream buffer full)."""


# --- scratchpad ------------------------------------------------------------------------

SCRATCHPAD_PORTS = ("tc", "vu", "ni", "kv")
PLAIN_STATUS = ("corrected", "uncorrectable", "bad_address")
KV_STATUS = ("corrected", "uncorrectable", "bad_address", "bad_request", "kv_full",
             "unmapped", "bad_page")


@CoverPoint("top.scratchpad.conflict", xf=lambda port: port, bins=list(SCRATCHPAD_PORTS))
def scratchpad_conflict(port: str) -> None:
    """Port ``port`` (of the tile's scratchpad: tensor core, vector unit, network, KV)
    waited at least one cycle for a bank another port had."""


@CoverPoint("top.scratchpad.status", xf=lambda kind, flag: f"{kind}:{flag}",
            bins=[f"plain:{f}" for f in PLAIN_STATUS] + [f"kv:{f}" for f in KV_STATUS])
def scratchpad_status(kind: str, flag: str) -> None:
    """A ``kind`` (``plain`` or ``kv``) port answered with status flag ``flag``."""


# --- sequencer -------------------------------------------------------------------------

OPCODES = tuple(op.name for op in Opcode)
ERRORS = tuple(e.name for e in ErrorCode if e is not ErrorCode.NONE)
#: The memories each engine reads and writes (compiler.hazards.accesses): a GEMM reads
#: scratchpad operands (and its accumulator entries when accumulating) and writes
#: accumulator entries; a VEC reads accumulator entries and writes either; a DMA copies
#: scratchpad words.
ENGINES = {"GEMM": ({"spad", "acc"}, {"acc"}), "VEC": ({"acc"}, {"acc", "spad"}),
           "DMA": ({"spad"}, {"spad"})}


def _possible(kind: str, first: str, then: str) -> bool:
    (r1, w1), (r2, w2) = ENGINES[first], ENGINES[then]
    return bool({"RAW": w1 & r2, "WAR": r1 & w2, "WAW": w1 & w2}[kind])


#: Every cross-engine dependency the engines' memories allow (12 of the 18 pairs).
HAZARDS = [f"{kind}:{a}>{b}" for kind in ("RAW", "WAR", "WAW") for a in ENGINES
           for b in ENGINES if a != b and _possible(kind, a, b)]


@CoverPoint("top.sequencer.opcode", xf=lambda op: op, bins=list(OPCODES))
def sequencer_opcode(op: str) -> None:
    """The sequencer executed an instruction with opcode ``op``."""


@CoverPoint("top.sequencer.error", xf=lambda error: error, bins=list(ERRORS))
def sequencer_error(error: str) -> None:
    """The sequencer halted with error status ``error``."""


@CoverPoint("top.sequencer.hazard", xf=lambda kind, first, then: f"{kind}:{first}>{then}",
            bins=HAZARDS)
def sequencer_hazard(kind: str, first: str, then: str) -> None:
    """A ``kind`` dependency of a ``then`` operation on an earlier ``first`` one."""


def sample_program(ops, n: int) -> None:
    """Sample a program that ran to the end: its opcodes and its cross-engine
    dependencies (``ops``: (Opcode, fields) pairs, as in ``compiler.program``)."""
    from compiler.hazards import accesses

    engines = set(ENGINES)
    last_write: dict[int, str] = {}
    readers: dict[int, set[str]] = {}
    for op, fields in ops:
        name = op.name
        sequencer_opcode(name)
        if name not in engines:
            continue
        reads, writes = accesses(op, fields, n)
        for address in reads:
            if address in last_write and last_write[address] != name:
                sequencer_hazard("RAW", last_write[address], name)
        for address in writes:
            if address in last_write and last_write[address] != name:
                sequencer_hazard("WAW", last_write[address], name)
            for reader in readers.get(address, ()):
                if reader != name:
                    sequencer_hazard("WAR", reader, name)
        for address in reads:
            readers.setdefault(address, set()).add(name)
        for address in writes:
            last_write[address] = name
            readers[address] = set()


# --- attention and MoE ------------------------------------------------------------------

GQA_RATIOS = (3, 8)


def _context_bin(phase: str, context: int, page: int) -> str:
    where = "page_end" if context % page == 0 else "page_start" if context % page == 1 \
        else "mid_page"
    return f"{phase}:{where}"


@CoverPoint("top.attention.context", xf=_context_bin,
            bins=[f"{p}:{w}" for p in ("prefill", "decode")
                  for w in ("page_end", "page_start", "mid_page")])
def attention_context(phase: str, context: int, page: int) -> None:
    """An attention ``phase`` ran (bit-exact) over ``context`` tokens in pages of ``page``."""


@CoverPoint("top.attention.gqa", xf=lambda heads, kv_heads: heads // kv_heads,
            bins=list(GQA_RATIOS))
def attention_gqa(heads: int, kv_heads: int) -> None:
    """Attention ran (bit-exact) with ``heads`` query heads over ``kv_heads`` KV heads."""


def _load_is(counts, shape: str) -> bool:
    counts = list(counts)
    mean = sum(counts) / len(counts)
    return {"balanced": min(counts) > 0 and max(counts) <= 1.5 * mean,
            "skewed": max(counts) >= 2 * mean,
            "idle_expert": min(counts) == 0}[shape]


@CoverPoint("top.moe.load", xf=lambda counts: tuple(counts), rel=_load_is, inj=False,
            bins=["balanced", "skewed", "idle_expert"])
def moe_load(counts: Iterable[int]) -> None:
    """A MoE layer ran (bit-exact) with ``counts`` tokens per expert: every expert busy
    and none above 1.5x the mean (balanced), one at 2x the mean or more (skewed), one
    with no token (idle_expert); a layer may be skewed with an idle expert."""


@CoverPoint("top.moe.ties", xf=lambda tied: "tie" if tied else "no_tie", bins=["tie", "no_tie"])
def moe_ties(tied: bool) -> None:
    """A top-k choice (a MoE layer, or a routing row on the vector unit) ran bit-exact
    that did (or did not) decide between equal scores at the k-th place."""


# --- export and merge -------------------------------------------------------------------


def export(worker: str = "main") -> Path | None:
    """Write this process's counts to ``$SERRANO_COVERAGE_DIR`` (if set); return the file."""
    directory = os.environ.get(ENV)
    if not directory:
        return None
    path = Path(directory) / f"{worker}-{os.getpid()}-{_PROCESS}.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    coverage_db.export_to_yaml(str(path))
    return path


def merge(files: list[Path], output: Path) -> dict:
    """Sum the counts of ``files`` into ``output`` (YAML); return per cover point the bins
    and their hits, and ``bins_hit_share`` over all of them."""
    from cocotb_coverage.coverage import merge_coverage

    if not files:
        raise ValueError("no coverage files to merge (did the tests run with "
                         f"{ENV} set?)")
    import yaml

    output.parent.mkdir(parents=True, exist_ok=True)
    merge_coverage(lambda _: None, str(output), *map(str, files))
    merged = yaml.safe_load(output.read_text())
    points, hit, total = {}, 0, 0
    for name, entry in sorted(merged.items()):
        bins = entry.get("bins:_hits")
        if bins is None:
            continue
        least = entry.get("at_least", 1)
        points[name.removeprefix("top.")] = bins
        total += len(bins)
        hit += sum(count >= least for count in bins.values())
    return {"points": points, "bins_hit": hit, "bins_total": total,
            "bins_hit_share": hit / total if total else 0.0}
