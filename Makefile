# regis: the two commands of the README are `make demo` and `make test`; both set up .venv themselves.
PYTHON ?= python3
VENV ?= .venv
# torch + torchvision first, pinned to releases that install from a local wheel cache on our CI machines;
# override with e.g. `make TORCH="torch torchvision" demo` elsewhere.
TORCH ?= torch==2.14.1 torchvision==0.29.1
BIN := $(VENV)/bin

# The Debian packages tests can use: chromium + chromium-driver (the browser tests, Playwright on /usr/bin/chromium),
# dataset-fashion-mnist (the real-data dataset test), redis-server (the worker and collection-delete fault tests),
# docker-compose (validates docker-compose.yml). Without one, its tests skip and say why (pytest -ra lists them).
SYSTEM_PACKAGES := chromium chromium-driver dataset-fashion-mnist redis-server docker-compose

.PHONY: install system-deps demo test test-heavy lint serve-demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Install the system packages the tests can use (Debian or Ubuntu; apt-get, with sudo when not root).
system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "installed: $(SYSTEM_PACKAGES)"; exit 0; fi; \
	sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	echo "installing:" $$missing; \
	$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing

## Install, index the bundled photos with the offline backbone, start the service, query it over HTTP.
demo: install
	$(BIN)/python scripts/demo.py

## Run the test suite (all but the tests marked heavy: under 10 minutes on a 2-core machine).
test: install
	$(BIN)/python -m pytest -q -m "not heavy"

## The heavy tests (a minute or more each); CI runs them after `make test`.
test-heavy: install
	$(BIN)/python -m pytest -q -m heavy; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]  # 5: none marked heavy

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf demo-data .pytest_cache
