# civetta — top-level tasks. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
CIVETTA := target/release/civetta
MODEL ?= models/default.gguf
GRPC_ADDR ?= 127.0.0.1:50051
METRICS_ADDR ?= 127.0.0.1:9464

.PHONY: help build run model model-synth test test-fast generate chat clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

build: ## Build the release binary
	$(CARGO) build --release --bin civetta --example stream_client

$(MODEL): | build
	@mkdir -p $(dir $(MODEL))
	$(CIVETTA) model synth --arch llama --quant q8_0 --seed 1 -o $(MODEL)

model-synth: $(MODEL) ## Write the synthetic default model if absent

model: model-synth ## Put the default model in place

run: build model ## Build, make the default model if absent, and serve it (CPU backend)
	$(CIVETTA) serve --model $(MODEL) --grpc-addr $(GRPC_ADDR) --metrics-addr $(METRICS_ADDR)

generate: build model ## One-shot generation on the default model
	$(CIVETTA) generate --model $(MODEL) --prompt "The capital of France is" --max-tokens 32

chat: ## Stream a chat completion from the running daemon over gRPC
	target/release/examples/stream_client --addr http://$(GRPC_ADDR) --chat "Write one sentence about owls."

test: ## Run the test suite (what CI runs)
	$(CARGO) test --all-targets --no-fail-fast -- --test-threads=2

SOAK_REQUESTS ?= 2000
SOAK_CONCURRENCY ?= 16
.PHONY: soak fuzz
soak: ## Soak the real daemon: SOAK_REQUESTS streams (2000), SOAK_CONCURRENCY at a time (16), cancels and deadlines; RSS and gauges checked
	$(CARGO) build --bin civetta --example soak
	target/debug/examples/soak --civetta target/debug/civetta --requests $(SOAK_REQUESTS) --concurrency $(SOAK_CONCURRENCY)

fuzz: ## Run every cargo-fuzz target for FUZZ_SECONDS (60) each on stable (scripts/fuzz-ci.sh)
	scripts/fuzz-ci.sh

clean:
	$(CARGO) clean
	rm -rf build models

-include kernels/kernels.mk
-include containers/containers.mk
