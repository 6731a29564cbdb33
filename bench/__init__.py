"""Benchmarks: each module measures one part of serrano and returns flat metrics.

A benchmark module defines ``run(quick: bool) -> dict[str, float | int | None]`` and
``TARGETS``, a mapping from metric name to ``(">=" or "<=", bound)`` for the design targets
of ``shared/DESIGN.md``. ``python -m bench`` runs them, merges the metrics into
``build/bench.json`` (one flat object, names ``stage__category__metric``) and prints a table.
"""

#: Benchmark modules in the order they run; ``python -m bench --only NAME`` picks some.
MODULES = ["tensor_core", "vector_unit", "golden", "accuracy", "attention", "noc", "chip",
           "moe", "long_context", "reliability", "serve"]
