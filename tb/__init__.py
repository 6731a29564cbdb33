"""cocotb test modules: each runs inside a simulation started by ``sim`` (one per design)."""
