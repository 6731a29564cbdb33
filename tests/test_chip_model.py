"""The chip's functional model (golden/chip_model.py): tiles joined by DMA and semaphores."""

from __future__ import annotations

import pytest

from golden.chip_model import ChipModel, mask_of
from spec import isa
from spec.isa import DmaTarget


def dma(src, dst, length, tiles, sem=None):
    f = {"src": src, "dst": dst, "length": length, "tiles": tiles}
    if sem is not None:
        f.update(remote_signal=1, remote_semaphore=sem)
    return ("DMA", f)


def wait(sem, count=1):
    return ("WAIT", {"semaphore": sem, "count": count})


HALT = ("HALT", {})


def test_cross_tile_dma_and_signal():
    chip = ChipModel(2, n=4, spad_words=64, acc_depth=8)
    chip.tile(0, 0).spad[0:3] = [7, 8, 9]
    # Tile (1, 1) waits first: it blocks until (0, 0)'s DMA raises its semaphore 3.
    programs = {
        (1, 1): [wait(3), dma(10, 20, 3, mask_of((0, 1)), sem=5), HALT],
        (0, 0): [("NOP", {}), dma(0, 10, 3, mask_of((1, 1)), sem=3), HALT],
        (0, 1): [wait(5), HALT],
    }
    executed = chip.run(programs)
    assert chip.tile(1, 1).spad[10:13] == [7, 8, 9]
    assert chip.tile(0, 1).spad[20:23] == [7, 8, 9]
    assert chip.tile(0, 0).spad[10:13] == [0, 0, 0]  # not named: untouched
    assert all(s == 0 for t in chip.tiles for s in t.semaphores)  # WAITs consumed them
    assert executed == [3, 0, 2, 3]
    assert chip.words_received == [0, 0, 3, 3] and chip.dmas_sent == [1, 0, 0, 1]


def test_multicast_includes_the_sender_and_encoded_words():
    chip = ChipModel(3, n=2, spad_words=32, acc_depth=4)
    chip.tiles[4].spad[5] = 0x1234
    everyone = mask_of(*[(x, y) for y in range(3) for x in range(3)])
    words = [isa.encode(isa.Opcode.DMA, src=5, dst=6, length=1, tiles=everyone,
                        remote_signal=1, remote_semaphore=2),
             isa.encode(isa.Opcode.HALT)]
    waiters = [isa.encode(isa.Opcode.WAIT, semaphore=2, count=1), isa.encode(isa.Opcode.HALT)]
    programs = [waiters] * 9
    programs[4] = [isa.encode(isa.Opcode.WAIT, semaphore=2, count=0), *words[:1],
                   *waiters]
    chip.run(programs)
    assert [t.spad[6] for t in chip.tiles] == [0x1234] * 9
    assert chip.words_sent[4] == 1 and sum(chip.words_received) == 9
    assert not any(s for t in chip.tiles for s in t.semaphores)


def test_deadlock_names_every_blocked_tile():
    chip = ChipModel(2, n=2, spad_words=16, acc_depth=4)
    programs = {0: [wait(1), dma(0, 0, 1, mask_of((1, 0)), sem=2), HALT],
                1: [wait(2), dma(0, 0, 1, mask_of((0, 0)), sem=1), HALT],
                3: [HALT]}
    with pytest.raises(ValueError, match=r"deadlock.*\(0, 0\) pc 0 WAIT semaphore 1.*"
                                         r"\(1, 0\) pc 0 WAIT semaphore 2"):
        chip.run(programs)


def test_bad_masks_and_regions_are_refused_before_anything_lands():
    chip = ChipModel(2, n=2, spad_words=16, acc_depth=4)
    chip.tiles[0].spad[0] = 5
    with pytest.raises(ValueError, match=r"tile \(2, 0\).*outside the 2 x 2 mesh"):
        chip.run({0: [dma(0, 1, 1, mask_of((1, 0), (2, 0))), HALT]})
    with pytest.raises(ValueError, match="DMA dst"):
        chip.run({0: [dma(0, 15, 2, mask_of((1, 0), (0, 1))), HALT]})
    assert all(t.spad[1] == 0 and t.spad[15] == 0 for t in chip.tiles)
    with pytest.raises(ValueError, match=r"tile \(2, 2\) is outside"):
        chip.run({(2, 2): [HALT]})
    with pytest.raises(ValueError, match="names no tile"):
        chip.run({4: [HALT]})
    with pytest.raises(ValueError, match="mesh size"):
        ChipModel(9)


def test_one_tile_keeps_refusing_remote_dma():
    from golden.tile_model import TileModel

    tile = TileModel(2, spad_words=8, acc_depth=4)
    assert not tile.would_block("WAIT", {"semaphore": 0, "count": 0})
    assert tile.would_block("WAIT", {"semaphore": 0, "count": 1})
    with pytest.raises(NotImplementedError, match="ChipModel"):
        tile.step("DMA", {"src": 0, "dst": 0, "length": 1, "tiles": 2})


def test_memory_channels_store_and_load():
    """A STORE's words land in its channel; a LOAD copies them into the requester and
    raises its semaphore; one of no words raises it alone; a channel the chip lacks,
    or words past a channel, are refused."""
    chip = ChipModel(2, n=4, spad_words=64, acc_depth=8, memory_channels=2, channel_words=100)
    a = chip.tile(0, 0)
    a.spad[0:3] = [11, 12, 13]
    store = ("DMA", dict(src=0, length=3, target=DmaTarget.STORE, channel=1, mem_addr=97))
    load = ("DMA", dict(dst=10, length=4, target=DmaTarget.LOAD, channel=1, mem_addr=96,
                        remote_signal=1, remote_semaphore=5))
    fence = ("DMA", dict(target=DmaTarget.LOAD, channel=0, remote_signal=1, remote_semaphore=6))
    chip.run({(0, 0): [store, ("HALT", {})], (1, 1): [load, fence, ("WAIT", dict(semaphore=5,
                                                                                 count=1)),
                                                      ("WAIT", dict(semaphore=6, count=1)),
                                                      ("HALT", {})]})
    assert chip.channels[1] == {97: 11, 98: 12, 99: 13}
    assert chip.tile(1, 1).spad[10:14] == [0, 11, 12, 13]
    for bad in (dict(channel=2, mem_addr=0), dict(channel=0, mem_addr=98)):
        with pytest.raises(ValueError, match="channel"):
            chip.tile(0, 1).step("DMA", dict(src=0, length=3, target=DmaTarget.STORE, **bad))
