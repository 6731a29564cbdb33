"""SymbiYosys proofs on the network's router (run them with ``python -m formal`` or
``make formal``): :mod:`formal.router_proofs` holds the harness and the properties,
:mod:`formal.__main__` writes the Verilog (RTLIL) and .sby files under build/formal/
and runs yowasp-sby."""
