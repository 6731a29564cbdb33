# serrano — every entry point. The first use of any target creates .venv and installs
# the pinned toolchain into it (see pyproject.toml); nothing else is assumed but
# Python >= 3.11, a C++ compiler, make and perl.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# pytest-xdist workers for `make test`; the suite is sized for 2 cores.
JOBS   ?= 2
# make regress: seeds per random test, the first seed, and this machine's shard (i/k).
SEEDS     ?= 4
SEED_BASE ?= 1
SHARD     ?= 1/1
# make fpga: the board and what goes on it (tile or tensor_core).
BOARD     ?= ulx3s-85f
DESIGN    ?= tile
# Simulator for cocotb runs: verilator (default) or icarus.
SIM    ?= verilator
export SIM

.DEFAULT_GOAL := help
.PHONY: help sim test regress mutate bench results synth formal fpga lint clean

help: ## list the targets
	@echo "serrano — make targets (first use creates .venv):"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 16
	@echo "variables: SIM=verilator|icarus  WAVES=1  JOBS=$(JOBS)  ARGS='extra CLI options'  PYTHON=$(PYTHON) (creates .venv)"
	@echo "           make regress: SEEDS=$(SEEDS) SEED_BASE=$(SEED_BASE) SHARD=$(SHARD)"
	@echo "           make fpga: BOARD=$(BOARD) DESIGN=$(DESIGN)"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "serrano needs Python >= 3.11, found " + sys.version.split()[0])'
	@command -v c++ >/dev/null || { echo "serrano needs a C++ compiler (c++) for Verilator"; exit 1; }
	@command -v perl >/dev/null || { echo "serrano needs perl for Verilator"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@touch $@

sim: $(STAMP) ## simulate the default design on the default workload and print the report
	$(BIN)/serrano sim $(ARGS)

test: $(STAMP) ## the test suite (quick, fixed seeds; < 15 min on 2 cores)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadgroup $(ARGS)

regress: $(STAMP) ## nightly: the suite with every random test over SEEDS seeds (SHARD=i/k): JUnit, coverage, build/regress.json
	$(BIN)/python -m verif.regress --seeds $(SEEDS) --seed-base $(SEED_BASE) --shard $(SHARD) --jobs $(JOBS) $(ARGS)

mutate: $(STAMP) ## Yosys mutants of router, tensor core, vector unit, sequencer, DMA engine vs the suite's checks: build/mutate.json
	$(BIN)/python -m verif.mutate $(ARGS)

bench: $(STAMP) ## benchmarks: print a table, write build/bench.json
	$(BIN)/python -m bench $(ARGS)

results: $(STAMP) ## the result tables of README.md and docs/results.md, from build/bench.json, mutate.json and synth.json
	$(BIN)/python -m verif.results $(ARGS)

synth: $(STAMP) ## Yosys + nextpnr-ecp5 area and Fmax: print a table, write build/synth.json
	$(BIN)/python -m synth $(ARGS)

formal: $(STAMP) ## SymbiYosys proofs on the router: files and traces under build/formal/
	$(BIN)/python -m formal $(ARGS)

fpga: $(STAMP) ## bitstream of DESIGN behind a UART bridge for BOARD: utilisation, Fmax, build/fpga.json
	$(BIN)/python -m fpga --board $(BOARD) --design $(DESIGN) $(ARGS)

lint: $(STAMP) ## ruff, the layer contracts (import-linter), Verilator --lint-only on every generated top
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m verif.lint

clean: ## remove generated files (keeps .venv)
	rm -rf sim_build build .pytest_cache .ruff_cache .hypothesis
