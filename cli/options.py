"""The command line's option types and shared options: each type refuses a bad value
with a one-line reason before anything is built, and every output path is checked
before a run starts (:func:`check_output_paths`)."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
from pathlib import Path

from sim.runner import SIMULATORS
from spec.isa import MAX_GEMM_DIM
from spec.noc import MAX_K
from spec.params import MAX_N, MIN_N


def probability(text: str) -> float:
    """A stall or idle probability the harness can draw: 0 to 255/256, in steps of 1/256."""
    from sim.harness_driver import MAX_PROBABILITY

    value = float(text)
    if not 0.0 <= value <= MAX_PROBABILITY:
        raise argparse.ArgumentTypeError(
            f"a probability in [0, {MAX_PROBABILITY:.4f}] is needed (the harness draws in "
            f"steps of 1/256), not {text}")
    return value


def fault_rates(text: str):
    """``RATE`` or ``RATE,double=RATE``: a :class:`sim.faults.FaultPlan` (seed 1)."""
    from sim.faults import FaultPlan

    try:
        return FaultPlan.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``, else the error names ``what``."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"a {what} integer is needed, not {text}")
        return value
    return parse


positive = at_least(1, "positive")


non_negative = at_least(0, "non-negative")


def seconds(above_zero: bool):
    """An argparse type: a finite number of seconds, > 0 if ``above_zero`` else >= 0."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value) or value < 0 or (above_zero and value == 0):
            raise argparse.ArgumentTypeError(
                f"a finite number of seconds {'> 0' if above_zero else '>= 0'} is needed, "
                f"not {text}")
        return value
    return parse


def moe_tokens(text: str) -> int:
    """Tokens per MoE round: 1 to ``compiler.chip.MAX_MOE_TOKENS``."""
    from compiler.chip import check_moe_tokens

    value = positive(text)
    try:
        return check_moe_tokens(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bandwidth(text: str) -> str:
    """Bytes per cycle as a positive number or fraction ("4", "7/8"); the chip checks
    what its channels can move."""
    from fractions import Fraction

    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"bytes per cycle as a number or a fraction (7/8), "
                                         f"not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the memory bandwidth must be positive, not {text}")
    return str(value)


def array_size(text: str) -> int:
    value = int(text)
    if not MIN_N <= value <= MAX_N:
        raise argparse.ArgumentTypeError(f"the array size must be {MIN_N}..{MAX_N}, not {text}")
    return value


def tile_array_size(text: str) -> int:
    """A tile's N: the tensor core's range, and a power of two (the vector unit's lanes,
    the scratchpad's word layout)."""
    value = array_size(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"a tile's array size must be a power of two, "
                                         f"{MIN_N}..{MAX_N}, not {text}")
    return value


def dimension(text: str) -> int:
    """A shape option: at most what a GEMM instruction's field takes, so an absurd
    shape is refused before its tensors are generated."""
    value = positive(text)
    if value > MAX_GEMM_DIM:
        raise argparse.ArgumentTypeError(f"at most {MAX_GEMM_DIM} (a GEMM instruction's "
                                         f"field), not {text}")
    return value


def workload(text: str) -> str:
    from golden.workloads import WORKLOADS

    if text not in WORKLOADS:
        raise argparse.ArgumentTypeError(f"unknown workload {text!r}; known: "
                                         f"{', '.join(WORKLOADS)}")
    return text


def mesh(text: str) -> int:
    """``KxK`` (a square mesh, 1..``spec.noc.MAX_K``) -> k."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or parts[0] != parts[1]:
        raise argparse.ArgumentTypeError(f"the mesh is given as KxK (square), e.g. 2x2, "
                                         f"not {text!r}")
    k = int(parts[0])
    if not 1 <= k <= MAX_K:
        raise argparse.ArgumentTypeError(f"the mesh side must be 1..{MAX_K}, not {k}")
    return k


#: Workload fields a custom shape may override from the command line.
SHAPE_OPTIONS = (("heads", "query heads"), ("kv_heads", "KV heads"),
                 ("head_dim", "key/query head dimension"), ("experts", "routed experts"),
                 ("top_k", "experts per token"))


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=at_most_cores, default=1,
                        help="Verilator threads evaluating the chip (default 1; a separate "
                             "build). 2 runs the 2 x 2 chip up to 1.7x faster on two idle "
                             "cores, and several times slower when other jobs share them: "
                             "a waiting thread spins")


def at_most_cores(text: str) -> int:
    threads, cores = positive(text), os.cpu_count() or 1
    if threads > cores:
        raise argparse.ArgumentTypeError(f"{threads} threads on {cores} cores would spin "
                                         "against each other")
    return threads


def threads_of(args: argparse.Namespace) -> int:
    """Verilator threads for a chip run (Icarus runs on one)."""
    return args.threads if args.sim == "verilator" else 1


def add_run_options(parser: argparse.ArgumentParser, *, workload_default: str = "gpt-oss"
                     ) -> None:
    """Options every simulating command shares: workload, array size, simulator, waves,
    JSON output."""
    parser.add_argument("--workload", type=workload, default=workload_default,
                        help="miniature workload (tiny, gpt-oss, deepseek-r1, kimi-k2; "
                             f"default {workload_default})")
    parser.add_argument("--array", type=tile_array_size, default=8, metavar="N",
                        help="tensor core and vector unit size N (a power of two, default 8)")
    add_output_options(parser)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """The simulator, waves and JSON output of a simulating command."""
    parser.add_argument("--sim", choices=SIMULATORS, default="verilator",
                        help="simulator (default verilator)")
    parser.add_argument("--waves", action="store_true",
                        help="record waves (in the run directory under sim_build/)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")


def _unwritable(path: Path) -> str | None:
    """Why a file could not be created at ``path`` (None if it could): the nearest
    existing folder on its way must be a writable folder."""
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:  # a probe: permissions, a read-only or pseudo file system alike
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return f"{folder} is not writable ({error.strerror or error})"
    return None


def check_output_paths(args: argparse.Namespace) -> str | None:
    """Check every output path of a command before anything is built or simulated:
    ``--json`` (a file), ``--plot`` (a prefix of files), ``--dump`` (an empty or new
    folder; with ``--force`` a used one is emptied first). Returns the problem, if any."""
    for name in ("json", "plot"):
        path = getattr(args, name, None)
        if path is None:
            continue
        if path.is_dir():
            return f"--{name} {path} is a folder, not a file"
        if (reason := _unwritable(path)) is not None:
            return f"cannot write --{name} {path}: {reason}"
        if path.exists() and not os.access(path, os.W_OK):
            return f"cannot write --{name} {path}: the file is not writable"
    dump = getattr(args, "dump", None)
    if dump is not None:
        if dump.exists() and not dump.is_dir():
            return f"--dump {dump} is a file, not a folder"
        if dump.is_dir() and any(dump.iterdir()):
            if not args.force:
                return (f"--dump {dump} holds an earlier run's files; give an empty or new "
                        "folder, or --force to empty it first")
            try:
                shutil.rmtree(dump)
            except OSError as error:
                return f"cannot empty --dump {dump}: {error.strerror or error}"
        if (reason := _unwritable(dump / "run.json")) is not None:
            return f"cannot write --dump {dump}: {reason}"
    return None


def list_of(parse):
    """An argparse type: a comma-separated list of ``parse`` values."""
    def parse_list(text: str) -> list:
        values = [parse(part) for part in text.split(",") if part]
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return values
    return parse_list


def add_memory_bandwidth_option(parser: argparse.ArgumentParser, *, many: bool = False
                                ) -> None:
    """``--memory-bandwidth B`` (``many``: a comma-separated list, a design point each):
    the memory channels' bandwidth in all."""
    parser.add_argument("--memory-bandwidth", type=list_of(bandwidth) if many else bandwidth,
                        default=[None] if many else None, metavar="B[,B]" if many else "B",
                        help="the memory channels' bandwidth in all, bytes per cycle (a "
                             "number or a fraction, e.g. 4 or 7/8; each channel moves at "
                             "most a word a cycle); default: the machine balance of an "
                             "H100 for the chip's peak (7/8 for 2x2, N = 8; "
                             "docs/memory_channel.md)" + ("; several are several design "
                                                         "points" if many else ""))


def kv_rows(text: str) -> int:
    """Block-table rows of a tile: a power of two >= 2 (each job a K and a V row)."""
    value = int(text)
    if value < 2 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"a power of two >= 2 is needed, not {text}")
    return value


def add_kv_rows_option(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    """``--kv-rows R``: block-table rows per tile (one build each); ``default``: the
    command's, else ``sim.chip_run.KV_ROWS``."""
    from sim.chip_run import KV_ROWS

    default = default or KV_ROWS
    parser.add_argument("--kv-rows", type=kv_rows, default=default, metavar="R",
                        help="block-table rows of each tile's KV cache: R / 2 jobs (a "
                             "sequence's KV head) a tile, so R / 2 x tiles / KV heads "
                             "sequences at once; the table's 2048 entries then map "
                             f"2048 / R pages per row (default {default}; one build per "
                             "value)")


def add_prefill_chunk_option(parser: argparse.ArgumentParser) -> None:
    """``--prefill-chunk C``: prompt tokens per prefill step (chunked prefill)."""
    from compiler.chip import PREFILL_CHUNK

    parser.add_argument("--prefill-chunk", type=positive, default=PREFILL_CHUNK,
                        help="prompt tokens per prefill step: a step that adds more is "
                             "prefilled in chunks, each attending to the cache the chunks "
                             f"before it filled (default {PREFILL_CHUNK})")


def add_moe_options(parser: argparse.ArgumentParser, after: str) -> None:
    """``--moe sparse|dense|off`` (default sparse), ``--no-moe``, an alias of off,
    ``--moe-tokens T`` and ``--weights streamed|resident``; ``after``: when the MoE layer
    runs."""
    from compiler.chip import MOE_MODES, MOE_TOKENS, WEIGHT_MODES

    parser.add_argument("--moe", choices=MOE_MODES, default="sparse",
                        help=f"the MoE layer {after}: sparse dispatch (each token to its "
                             "experts' tiles, each expert over its own tokens; default), "
                             "dense-masked (every expert over every token, unchosen ones "
                             "weighted 0), or off (attention alone); the build sized for "
                             "dense runs all three")
    parser.add_argument("--no-moe", dest="moe", action="store_const", const="off",
                        help="attention alone (= --moe off)")
    parser.add_argument("--moe-tokens", type=moe_tokens, default=MOE_TOKENS,
                        metavar="T",
                        help="tokens per MoE round: a step's tokens go through the MoE layer "
                             "in rounds of T; larger rounds stream each expert's weights once "
                             "for more tokens but keep larger buffers on every tile, so fewer "
                             f"KV pages (default {MOE_TOKENS})")
    parser.add_argument("--weights", choices=WEIGHT_MODES, default=None,
                        help="where the MoE layer's weights (experts, router, W_o) are: "
                             "in the memory channels, "
                             "loaded by the MoE programs within the counted cycles "
                             "(streamed; the default with --moe sparse), or written into "
                             "the tiles' scratchpads through the host port before the "
                             "first MoE round and where a round wrote over them "
                             "(resident; the default, and the only choice, with "
                             "--moe dense)")


def policy(text: str) -> str:
    """A prefill/decode policy of ``serrano serve`` (``serve.scheduler.POLICIES``)."""
    from serve.scheduler import POLICIES

    if text not in POLICIES:
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}; known: "
                                         f"{', '.join(POLICIES)}")
    return text


def placement(text: str) -> str:
    from compiler.chip import PLACEMENTS

    if text not in PLACEMENTS:
        raise argparse.ArgumentTypeError(f"unknown placement {text!r}; known: "
                                         f"{', '.join(PLACEMENTS)}")
    return text
