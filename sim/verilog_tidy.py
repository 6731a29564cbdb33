"""Rewrites of Amaranth's Verilog that make simulator builds cheaper without changing
what is simulated (used by sim/runner.py)."""

from __future__ import annotations

import re

__all__ = ["compact_memory_init"]

#: An ``initial`` block that sets every word of one memory to zero, one statement per
#: word, as Amaranth writes a memory without initial contents.
_ZERO_INIT = re.compile(
    r"^  initial begin\n((?:    (\\?\S+ ?)\[\d+\] = \d+'h0+;\n)+)  end\n", re.M)


def compact_memory_init(source: str) -> str:
    """Replace each all-zero memory ``initial`` block by one loop: a 64 Ki-word
    scratchpad is otherwise 64 Ki statements that Verilator and the C++ compiler process
    one by one (minutes of a tile's build). Memories with contents are left alone."""
    def loop(match: re.Match) -> str:
        lines = match.group(1).splitlines()
        name = match.group(2)
        expected = [f"{name}[{i}]" for i in range(len(lines))]
        if [line.strip().split(" = ")[0] for line in lines] != expected:
            return match.group(0)
        index = "\\" + name.strip().lstrip("\\") + "$init "
        return (f"  integer {index};\n  initial for ({index} = 0; {index} < {len(lines)}; "
                f"{index} = {index} + 1) {name}[{index}] = 0;\n")
    return _ZERO_INIT.sub(loop, source)
