"""Parameter checks the blocks share: a refused parameter names itself and its range.

    check_int("acc_depth", acc_depth, 2, 4096, power_of_two=True)
    check_grid("mesh", mesh, 8)          # (columns, rows), each 1..8
    check_coord("position", position, mesh)
    check_array_size("n", n)             # a tile's N: a power of two MIN_N..MAX_N
"""

from __future__ import annotations

__all__ = ["MAX_N", "MIN_N", "check_array_size", "check_bool", "check_coord", "check_grid",
           "check_int"]

#: Array sizes N: the tensor core is N x N, the vector unit and an accumulator entry N
#: lanes, a scratchpad word N int8 lanes. A tile's N is also a power of two.
MIN_N, MAX_N = 2, 32


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value, low: int, high: int, *, power_of_two: bool = False) -> int:
    """``value`` if it is an integer in [low, high] (and a power of two when asked);
    else a ValueError naming ``name``."""
    if not _is_int(value) or not low <= value <= high \
            or (power_of_two and value & (value - 1)):
        kind = "a power of two" if power_of_two else "an integer"
        raise ValueError(f"{name} must be {kind} in [{low}, {high}], not {value!r}")
    return value


def check_array_size(name: str, value, *, power_of_two: bool = True) -> int:
    """``value`` if it is an array size N (:data:`MIN_N`..:data:`MAX_N`, a power of two
    unless ``power_of_two`` is False); else a ValueError naming ``name``."""
    return check_int(name, value, MIN_N, MAX_N, power_of_two=power_of_two)


def check_bool(name: str, value) -> bool:
    """``value`` if it is a bool (a flag given as a string or a number is a mistake)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, not {value!r}")
    return value


def check_grid(name: str, value, most: int) -> tuple[int, int]:
    """``value`` as (columns, rows) if it is a pair of integers in [1, most]."""
    if not isinstance(value, tuple | list) or len(value) != 2 \
            or not all(_is_int(v) and 1 <= v <= most for v in value):
        raise ValueError(f"{name} must be (columns, rows), each 1..{most}, not {value!r}")
    return value[0], value[1]


def check_coord(name: str, value, grid: tuple[int, int]) -> tuple[int, int]:
    """``value`` as (x, y) if it is a pair of integers inside a ``grid`` = (columns, rows)."""
    if not isinstance(value, tuple | list) or len(value) != 2 \
            or not all(_is_int(v) for v in value) \
            or not (0 <= value[0] < grid[0] and 0 <= value[1] < grid[1]):
        raise ValueError(f"{name} {value!r} is outside the {grid[0]} x {grid[1]} mesh")
    return value[0], value[1]
