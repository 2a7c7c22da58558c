# The two commands a new user needs: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: serve test bench bench-peers bench-isolation soak fuzz install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## serve: set up the virtualenv and run the broker on ppmq.example.yaml (data under ./var/)
serve: $(STAMP)
	mkdir -p var/sub
	$(BIN)/ppmq serve -c ppmq.example.yaml

## test: set up the virtualenv and run the whole test suite
test: $(STAMP)
	bash tests/systemd/setup.sh
	$(BIN)/python -m pytest -q

## bench-peers: install the peer brokers (apt) and the bench extra (clients, charts)
bench-peers: $(STAMP)
	bash bench/install-peers.sh

## bench: ppmq side by side with its peers, every workload, 3 runs (not part of the tests)
bench: $(STAMP)
	$(BIN)/ppmq bench $(BENCH_ARGS)

## bench-isolation: a good subscriber's rate with and without four misbehaving ones
bench-isolation: $(STAMP)
	$(BIN)/python bench/isolation.py

## soak: 500 kill -9 cycles on one store; prints confirmed messages, losses (must be 0), duplicates
soak: $(STAMP)
	$(BIN)/python bench/crash_soak.py

## fuzz: the wire fuzzing with 5000 hypothesis examples per test instead of 200
fuzz: $(STAMP)
	$(BIN)/python bench/fuzz_long.py

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis build/system-venv
