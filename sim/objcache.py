"""Share Verilator's run-time objects between builds: a compiler wrapper for ``OBJCACHE``.

Every Verilator model compiles the same run-time library (``verilated.cpp``,
``verilated_vpi.cpp``, ``verilated_threads.cpp``, ``verilated_dpi.cpp``: about 15 s of
compiler time per build). Verilator's makefile runs each compile as
``$(OBJCACHE) $(CXX) ...``; :mod:`sim.runner` sets ``OBJCACHE`` to this script, which
compiles a source of the Verilator installation's ``include/`` directory once per
distinct command line and copies the object into later builds. Every other compile
(the model's own files, cocotb's main, which includes the model's header) runs
unchanged.

The cache key is the full command line without the output path, the source's path, size
and modification time, and the compiler's identity; the cache lives in
``sim_build/.objcache`` and ``make clean`` removes it.

Usage (by make): ``python -m sim.objcache c++ <flags> -c -o verilated.o .../verilated.cpp``
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(__file__).resolve().parent.parent / "sim_build" / ".objcache"


def _output(args: list[str], source: str) -> str:
    if "-o" in args:
        return args[args.index("-o") + 1]
    return Path(source).with_suffix(".o").name


def _key(args: list[str], source: Path) -> str:
    kept = [a for i, a in enumerate(args) if a != "-o" and (i == 0 or args[i - 1] != "-o")]
    compiler = shutil.which(args[0]) or args[0]
    stat, compiler_stat = source.stat(), Path(compiler).stat()
    return hashlib.sha256(json.dumps([
        kept, str(source), stat.st_size, stat.st_mtime_ns, compiler,
        compiler_stat.st_size, compiler_stat.st_mtime_ns,
    ]).encode()).hexdigest()


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m sim.objcache <compiler> <arguments>", file=sys.stderr)
        return 2
    root = os.environ.get("VERILATOR_ROOT")
    sources = [a for a in argv[1:] if a.endswith((".cpp", ".cc", ".c"))]
    cacheable = (root is not None and "-c" in argv and len(sources) == 1
                 and Path(sources[0]).resolve().is_relative_to(Path(root, "include").resolve()))
    if not cacheable:
        return subprocess.call(argv)
    source = Path(sources[0])
    output = _output(argv, sources[0])
    cached = CACHE / f"{_key(argv, source)}.o"
    if cached.exists():
        shutil.copyfile(cached, output)
        return 0
    status = subprocess.call(argv)
    if status == 0:
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=CACHE, delete=False) as tmp:
            shutil.copyfile(output, tmp.name)
        os.replace(tmp.name, cached)  # atomic: a concurrent build sees all or nothing
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
