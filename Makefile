# zplan — plan, simulate and validate ZeRO training.
# `make run` and `make test` install what is missing (Debian packages, as root) and then do
# their job; everything is built under build/ (build-asan/ for `make check-asan`).

BUILD      ?= build
CUDA_HOME  ?= /usr/local/cuda
DEB_PACKAGES := build-essential pkg-config perl libglib2.0-dev libjansson-dev libgsl-dev \
                libopenblas-dev libopenmpi-dev openmpi-bin gnuplot-nox

CC       := mpicc
PKGS     := glib-2.0 jansson gsl
CFLAGS   ?= -O2 -g
override CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -MMD -MP \
            -Iplanner -Isim -Ireal $(shell pkg-config --cflags $(PKGS) 2>/dev/null) \
            -DZP_DATA_DIR=\"$(CURDIR)\" -DZP_BUILD_DIR=\"$(abspath $(BUILD))\"
# GSL's CBLAS interface, implemented by OpenBLAS (not GSL's reference gslcblas).
LDLIBS   := $(shell pkg-config --libs-only-L --libs-only-l glib-2.0 jansson 2>/dev/null) \
            -lgsl -lopenblas -lm

PLANNER_SRC := $(wildcard planner/*.c)
SIM_SRC     := $(filter-out sim/zplan.c,$(wildcard sim/*.c))
REAL_SRC    := $(filter-out real/zreal_main.c,$(wildcard real/*.c))
TEST_SRC    := $(wildcard tests/test_*.c)
TEST_UTIL   := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))
BENCH_SRC   := $(wildcard bench/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIBS := $(BUILD)/libzsim.a $(BUILD)/libzreal.a $(BUILD)/libzplanner.a
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
BINS := $(BUILD)/zplan $(if $(wildcard real/zreal_main.c),$(BUILD)/zreal)

.PHONY: all setup run test test-run check-asan clean cuda-check bench reports
all: cuda-check $(BINS) $(TESTS) $(BENCHES)

# Installs the Debian packages that are missing; does nothing when all are present.
setup:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing \
	    >/dev/null || { echo "setup: apt-get install failed for:$$missing" >&2; exit 1; }; \
	fi

# CUDA/NCCL are optional: found under CUDA_HOME, and the GPU parts are skipped otherwise.
cuda-check:
	@if [ -x "$(CUDA_HOME)/bin/nvcc" ]; then echo "cuda: nvcc found in $(CUDA_HOME)"; \
	else echo "cuda: no nvcc under $(CUDA_HOME) (set CUDA_HOME); GPU parts skipped"; fi

run: setup
	@$(MAKE) --no-print-directory all
	$(BUILD)/zplan memory --model gpt2-1.5b --cluster dgx2-v100 --gpus 64

test: setup
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory test-run

# GLib test programs speak TAP; prove runs them and prints the closing summary CI reads.
test-run: $(TESTS)
	prove -f -e '' $(TESTS) :: --tap

# The same variables go to both steps, so that nothing is relinked without the sanitizers.
ASAN_VARS := BUILD=build-asan LDFLAGS="-fsanitize=address,undefined" \
  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
check-asan: setup
	@$(MAKE) --no-print-directory $(ASAN_VARS) all
	ASAN_OPTIONS=detect_leaks=0 $(MAKE) --no-print-directory $(ASAN_VARS) test-run

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libzplanner.a: $(call obj,$(PLANNER_SRC))
$(BUILD)/libzsim.a: $(call obj,$(SIM_SRC))
$(BUILD)/libzreal.a: $(call obj,$(REAL_SRC))
$(BUILD)/lib%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/zplan: $(call obj,sim/zplan.c) $(LIBS)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/zreal: $(call obj,real/zreal_main.c) $(LIBS)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/%: $(call obj,tests/%.c) $(call obj,$(TEST_UTIL)) $(LIBS) | $(BINS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(call obj,$(TEST_UTIL)) $(LIBS) -o $@ $(LDLIBS)
$(BUILD)/bench/%: $(call obj,bench/%.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(LIBS) -o $@ $(LDLIBS)

# Benchmarks print figures for the closing notes; they assert nothing about time.
bench: all
	$(BUILD)/bench/bench_sim
	$(BUILD)/bench/bench_plan
	$(BUILD)/bench/bench_gemm
	sh bench/validate_cpu.sh 2

# Regenerates reports/ (README.md with the paper's tables beside zplan's, and the plots).
reports: $(BUILD)/zplan
	sh reports/generate.sh $(BUILD)/zplan

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
