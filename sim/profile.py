"""Where the tiles' sequencers spend a run's cycles (``serrano sim --profile``).

The harness samples every running tile's pc every ``period`` cycles
(``sim.chip_driver.ChipDriver.run_tiles``); a sample stands for ``period`` cycles of
the instruction at that pc. An instruction holds the sequencer either as a WAIT — on
an engine's completion (the compiler's :data:`compiler.emit.ENGINE_SEMAPHORES`: GEMM,
VEC, DMA) or on words arriving from the network or a memory channel (any other
semaphore) — or while it is fetched and issued, which takes longer while its engine
is still busy with the one before. :func:`profile` sums the samples per phase by that
holder and lists the instructions that held the tiles longest.
"""

from __future__ import annotations

from compiler.emit import ENGINE_SEMAPHORES
from spec.isa import Opcode, decode

__all__ = ["describe", "holder", "profile"]

#: Instructions per phase that :func:`profile` lists, the longest-held first.
HOT = 8
_WAITED = {semaphore: op.name for op, semaphore in ENGINE_SEMAPHORES.items()}


def holder(word: int) -> str:
    """What holds a sequencer at instruction ``word``: ``wait GEMM`` (VEC, DMA) for a
    WAIT on an engine's completion, ``wait arrivals`` for one on any other semaphore,
    else ``at OPCODE``."""
    op, fields = decode(word)
    if op is Opcode.WAIT:
        engine = _WAITED.get(fields["semaphore"])
        return f"wait {engine}" if engine else "wait arrivals"
    return f"at {op.name}"


def describe(word: int) -> str:
    """One line of an instruction: its opcode and the fields that are not 0 (a WAIT's
    semaphore always)."""
    op, fields = decode(word)
    if op is Opcode.WAIT:
        return f"WAIT semaphore={fields['semaphore']} count={fields['count']}"

    def flat(prefix: str, values: dict):
        for name, value in values.items():
            if isinstance(value, dict):
                yield from flat(f"{prefix}{name}.", value)
            elif value:
                yield f"{prefix}{name}={getattr(value, 'name', value)}"

    return " ".join([op.name, *flat("", fields)])


def profile(rounds: list, records: list[dict], period: int) -> dict[str, dict]:
    """Per phase of a sampled run (``records``, the result's rounds with
    ``pc_samples``, in the order of the compiled ``rounds``): ``tile_cycles`` sampled,
    ``holders`` {holder: cycles}, most first, and ``hot``, the :data:`HOT` instructions
    (round index, tile, pc) that held a tile longest, each with its cycles and text."""
    out: dict[str, dict] = {}
    for index, (compiled, record) in enumerate(zip(rounds, records, strict=True)):
        phase = out.setdefault(record["phase"], {"tile_cycles": 0, "holders": {}, "hot": []})
        for tile, samples in record["pc_samples"].items():
            image = compiled.loads[int(tile)].image()
            for pc, count in samples:
                cycles = count * period
                name = holder(image[pc])
                phase["tile_cycles"] += cycles
                phase["holders"][name] = phase["holders"].get(name, 0) + cycles
                phase["hot"].append({"round": index, "tile": int(tile), "pc": pc,
                                     "cycles": cycles, "instruction": describe(image[pc])})
    for phase in out.values():
        phase["holders"] = dict(sorted(phase["holders"].items(), key=lambda kv: -kv[1]))
        phase["hot"] = sorted(phase["hot"], key=lambda h: -h["cycles"])[:HOT]
    return out
