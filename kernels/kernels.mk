# kernels/kernels.mk — GPU code objects and their static resource report.
# Included by the top-level Makefile. Targets:
#   make kernels         every kernels/*.hip for each $(GFX) with $(CLANG)
#   make kernels-report  build with each of $(REPORT_CLANGS), print the tables and comparisons
#   make kernels-gate    build gfx1151 with each of $(REPORT_CLANGS), fail on any unlisted spill/scratch
# CLANG=llvm23 is ROCm's LLVM 23 from PyPI behind clang-22's front end (scripts/llvm23/clang-llvm23,
# installed into build/llvm23 by scripts/llvm23-setup.sh on first use); its tag is llvm-23.0.0git.
# Output per compiler and arch: $(BUILD)/<clang-tag>/<arch>/<kernel>.hsaco, <kernel>.s (ISA,
# for counting scratch_ instructions), <kernel>.remarks (clang's resource-usage remarks),
# and $(BUILD)/<clang-tag>/compiler.txt. gemm_* also build a <kernel>.sb.* variant with a
# sched_barrier per K block (-DCIVETTA_SCHED_BARRIER=1).

CLANG ?= clang-22
GFX ?= gfx1151 gfx1100
BUILD ?= build/kernels
REPORT_CLANGS ?= clang-19 clang-22 llvm23
LLVM23_DRIVER := scripts/llvm23/clang-llvm23
ifeq ($(CLANG),llvm23)
override CLANG := $(LLVM23_DRIVER)
endif
# The LLVM 23 driver's library is installed before its --version names the build folder.
ifeq ($(CLANG),$(LLVM23_DRIVER))
LLVM23_SETUP := $(shell scripts/llvm23-setup.sh >&2 || echo failed)
KERNEL_DEPS_EXTRA := $(LLVM23_DRIVER)
endif
GATE_GFX ?= gfx1151
KERNELS_ALLOWLIST ?= kernels/spill-allowlist.toml
KERNELS_CIVETTA ?= $(CARGO) run --quiet --bin civetta --

# -mcode-object-version=5: clang-22 defaults to v6, which older HIP runtimes cannot load.
KERNEL_FLAGS := -x hip --offload-device-only --no-gpu-bundle-output -nogpuinc -nogpulib \
  -O3 -std=c++17 -mcode-object-version=5 -Wall -Werror
KERNEL_SOURCES := $(wildcard kernels/*.hip)
# Every kernel rebuilds when a shared header changes (civetta_gpu.h, gemm_stage.h).
KERNEL_HEADERS := $(wildcard kernels/*.h)
KERNEL_NAMES := $(basename $(notdir $(KERNEL_SOURCES)))
SCHED_BARRIER_KERNELS := gemm_w8a8 gemm_f16 gemm_w8a8_pipe

# "clang-22.1.8" from "Debian clang version 22.1.8 (...)", "llvm-23.0.0git" from the LLVM 23
# driver's "ROCm AMD LLVM version 23.0.0git ..."; empty when $(CLANG) is missing.
clang_tag = $(shell $(1) --version 2>/dev/null | sed -n -e '1s/.*LLVM version \([0-9][0-9a-z.]*\).*/llvm-\1/p' -e t \
  -e '1s/.*clang version \([0-9][0-9.]*\).*/clang-\1/p')
CLANG_TAG := $(call clang_tag,$(CLANG))
KERNELS_OUT := $(BUILD)/$(CLANG_TAG)

# $(1) arch, $(2) output stem, $(3) source name, $(4) extra flags
define kernel_rule
$(KERNELS_OUT)/$(1)/$(2).hsaco: kernels/$(3).hip $(KERNEL_HEADERS) $(KERNEL_DEPS_EXTRA)
	@mkdir -p $$(@D)
	$(CLANG) $(KERNEL_FLAGS) --offload-arch=$(1) $(4) -c $$< -o $$@ \
	  -Rpass-analysis=kernel-resource-usage 2> $(KERNELS_OUT)/$(1)/$(2).remarks \
	  || { cat $(KERNELS_OUT)/$(1)/$(2).remarks; exit 1; }
$(KERNELS_OUT)/$(1)/$(2).s: kernels/$(3).hip $(KERNEL_HEADERS) $(KERNEL_DEPS_EXTRA)
	@mkdir -p $$(@D)
	$(CLANG) $(KERNEL_FLAGS) --offload-arch=$(1) $(4) -S $$< -o $$@
KERNEL_OUTPUTS += $(KERNELS_OUT)/$(1)/$(2).hsaco $(KERNELS_OUT)/$(1)/$(2).s
endef
$(foreach a,$(GFX),$(foreach k,$(KERNEL_NAMES),$(eval $(call kernel_rule,$(a),$(k),$(k),))))
$(foreach a,$(GFX),$(foreach k,$(SCHED_BARRIER_KERNELS),$(eval $(call kernel_rule,$(a),$(k).sb,$(k),-DCIVETTA_SCHED_BARRIER=1))))

.PHONY: kernels kernels-check-clang kernels-report kernels-gate kernels-out

kernels-check-clang: ## Check that $(CLANG) is there and is clang
	@test -n "$(CLANG_TAG)" || { echo "kernels: '$(CLANG)' not found or not clang (apt-get install clang-22 lld-22 llvm-22; for llvm23 see scripts/llvm23-setup.sh)"; exit 1; }

kernels-out: ## Print the build folder of $(CLANG)
	@echo $(KERNELS_OUT)

kernels: kernels-check-clang $(KERNEL_OUTPUTS) ## Compile GPU kernels: CLANG=clang-22 GFX="gfx1151 gfx1100"
	@$(CLANG) --version > $(KERNELS_OUT)/compiler.txt
	@echo "kernels: $(words $(filter %.hsaco,$(KERNEL_OUTPUTS))) code objects in $(KERNELS_OUT)"

kernels-report: ## Build kernels with clang-19, clang-22 and LLVM 23 and compare their resource usage
	@set -e; dirs=""; for c in $(REPORT_CLANGS); do \
	  $(MAKE) --no-print-directory kernels CLANG=$$c GFX="$(GFX)" BUILD=$(BUILD); \
	  dirs="$$dirs $$($(MAKE) --no-print-directory -s kernels-out CLANG=$$c BUILD=$(BUILD))"; \
	done; \
	for d in $$dirs; do $(KERNELS_CIVETTA) kernels report $$d; done; \
	set -- $$dirs; while [ $$# -ge 2 ]; do $(KERNELS_CIVETTA) kernels report --compare $$1 $$2; shift; done

kernels-gate: ## Fail if any gfx1151 kernel spills or uses scratch (every compiler) unless allow-listed
	@set -e; rc=0; for c in $(REPORT_CLANGS); do \
	  $(MAKE) --no-print-directory kernels CLANG=$$c GFX="$(GATE_GFX)" BUILD=$(BUILD); \
	  d=$$($(MAKE) --no-print-directory -s kernels-out CLANG=$$c BUILD=$(BUILD)); \
	  $(KERNELS_CIVETTA) kernels gate $$d --allowlist $(KERNELS_ALLOWLIST) || rc=1; \
	done; exit $$rc

# ---- NVIDIA path of the same sources: PTX for the CUDA backend (docs/GPU.md) ----
# The driver JIT-compiles the PTX for the GPU it runs on; mma.sync needs sm_80+ and PTX 8.0.
CUDA_ARCH ?= sm_90
PTX_FLAGS := -x cuda --cuda-device-only -nocudainc -nocudalib -O3 -std=c++17 -Wall -Werror \
  -Xclang -target-feature -Xclang +ptx80
PTX_OUT := $(KERNELS_OUT)/$(CUDA_ARCH)
PTX_OUTPUTS := $(foreach k,$(KERNEL_NAMES),$(PTX_OUT)/$(k).ptx)

$(PTX_OUT)/%.ptx: kernels/%.hip $(KERNEL_HEADERS)
	@mkdir -p $(@D)
	$(CLANG) $(PTX_FLAGS) --cuda-gpu-arch=$(CUDA_ARCH) -S $< -o $@

.PHONY: kernels-ptx
kernels-ptx: kernels-check-clang $(PTX_OUTPUTS) ## Compile the kernels to PTX for the CUDA backend: CLANG=clang-22 CUDA_ARCH=sm_90
	@$(CLANG) --version > $(PTX_OUT)/compiler.txt
	@echo "kernels-ptx: $(words $(PTX_OUTPUTS)) PTX files in $(PTX_OUT)"
