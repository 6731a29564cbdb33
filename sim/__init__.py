"""The simulator layer: builds and runs of the RTL under Verilator or Icarus.

The runner and object cache (``runner``, ``objcache``, ``verilog_tidy``, ``processes``),
the stream harness and its drivers (``harness``, ``harness_driver``, ``tile_driver``,
``chip_driver``), the traffic bench (``traffic``, ``noc_run``), each design's build and
run (``tile_run``, ``chip_run``, ``gemm_run``, ``vector_unit_run``, ``router_bench``),
the scenarios they share (``attention_scenario``, ``gemm_stream``), functional coverage
(``coverage``) and the energy proxy (``energy``). ``bench``, ``fpga``, ``verif`` and the
CLI import from here; the cocotb modules these runs load live in ``tb``.
"""
