"""Testbenches: the simulator runner, the stream harness, cocotb drivers and the CLI."""
