# Container image and deployment targets; included by the top-level Makefile.
# docs/IMAGES.md and docs/DEPLOY.md describe the images and how to run them.
IMAGE ?= cpu

.PHONY: image images image-cpu image-base containers-gen containers-check test-containers test-repro test-prometheus

image: ## Build one image of containers/matrix.toml: make image IMAGE=rocm-6.4.4-clang19 (default cpu)
	scripts/containers-build.sh $(IMAGE)

images: ## Build every image of the matrix (ROCm images need network access)
	@set -e; for tag in $$(python3 scripts/containers-gen.py --list); do scripts/containers-build.sh $$tag; done

image-cpu: ## Build localhost/civetta:cpu from the release binary (no registry needed)
	scripts/containers-build-cpu.sh

image-base: ## Build the local Debian base image (debootstrap + podman import, cached)
	scripts/containers-base.sh

containers-gen: ## Regenerate containers/Containerfile.* from containers/matrix.toml
	python3 scripts/containers-gen.py

containers-check: ## Check the Containerfiles are generated from the matrix and pass the lint
	python3 scripts/containers-gen.py --check
	$(CARGO) test --test containers_lint --test deploy_config

test-containers: ## Build and run the CPU image: gRPC, /metrics, HEALTHCHECK, civetta env (podman)
	scripts/test-containers.sh

test-repro: ## civetta repro run --layers host,podman on SmolLM2 (after test-containers), then repro check
	scripts/repro-check.sh

test-prometheus: ## Real Prometheus against a live civetta: every dashboard/rule query returns data
	scripts/prometheus-check.sh
