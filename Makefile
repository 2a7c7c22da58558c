# The two commands a new user needs: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: serve test test-slow bench bench-isolation install clean

$(STAMP): pyproject.toml
	command -v java >/dev/null || (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless)  # Spark
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,spark]'
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

## test-slow: the longer runs kept out of `make test` (spark-submit in a JVM of its own)
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

## bench: quick figures for ppmq alone (not part of the tests)
bench: $(STAMP)
	$(BIN)/python bench/quick.py

## bench-isolation: a good subscriber's rate with and without four misbehaving ones
bench-isolation: $(STAMP)
	$(BIN)/python bench/isolation.py

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis build/system-venv
