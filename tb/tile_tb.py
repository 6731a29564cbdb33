"""cocotb tests of a tile in a StreamHarness (see tests/test_tile.py and tb/tile_run.py).

``tile_attention`` walks :func:`tb.attention_scenario.attention_steps`: before each
program the host issues its KV requests (MAPs for new pages, one APPEND per word of
each new token), writes the program's scratchpad words, pulses ``go``, waits for the
halt, reads the output words back and compares them with golden, bit for bit.
"""

from __future__ import annotations

import cocotb
import numpy as np

from compiler.config import TileConfig
from rtl.sequencer import ErrorCode
from tb.attention_scenario import attention_steps
from tb.runner import parameters, report
from tb.tile_driver import TileDriver
from tb.tile_run import harness_depths, tile_from_config

#: Cycles a program may take per instruction before the run is declared hung.
CYCLES_PER_INSTRUCTION = 400


@cocotb.test()
async def tile_attention(dut):
    p = parameters()
    config = TileConfig(**p["config"])
    steps = attention_steps(config, p["workload"], p["layer"], prefill=p["prefill"],
                            context=p["context"], steps=p["steps"])
    driver = TileDriver(dut, tile_from_config(config), harness_depths(config))
    driver.set_traffic(p["idle"], p["stall"], p["seed"])
    await driver.reset()
    phases = []
    for index, step in enumerate(steps):
        program = step.program
        await driver.load(program.instructions, program.spad_writes, step.kv_requests)
        run = await driver.execute(CYCLES_PER_INSTRUCTION * len(program.instructions) + 10_000)
        assert run.error == ErrorCode.NONE, f"step {index}: {run.error.name} at pc {run.pc}"
        assert run.engine_error == 0, f"step {index}: engine error flags {run.engine_error:#b}"
        words, _ = await driver.read(program.output_words)
        got = program.read_output(dict(zip(program.output_words, words, strict=True)).__getitem__)
        wrong = np.argwhere(got != step.expected)
        assert wrong.size == 0, (
            f"step {index} ({step.phase}, context {step.context}): {len(wrong)} of "
            f"{got.size} outputs differ from golden, first at {tuple(wrong[0])}: "
            f"{int(got[tuple(wrong[0])])} != {int(step.expected[tuple(wrong[0])])}")
        phases.append({"phase": step.phase, "context": step.context,
                       "instructions": len(program.instructions),
                       "outputs": int(np.prod(program.output_shape)),
                       "summary": program.summary.as_dict(), "counters": run.counters,
                       "cycles_per_s": run.cycles / run.wall_s if run.wall_s else 0.0})
    report(passed=True, phases=phases)
