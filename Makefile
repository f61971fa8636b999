# zplan — plan, simulate and validate ZeRO training.
# `make run` and `make test` install what is missing (Debian packages, as root) and then do
# their job; everything is built under build/ (build-asan/ for `make check-asan`).

BUILD      ?= build
CUDA_HOME  ?= /usr/local/cuda
# NCCL's headers and library: CUDA's own tree where NCCL was installed into it (as here), or
# a separate NCCL (a pip wheel's nvidia/nccl, with include/ and lib/) named by NCCL_HOME.
NCCL_HOME  ?= $(CUDA_HOME)
DEB_PACKAGES := build-essential pkg-config perl libglib2.0-dev libjansson-dev libgsl-dev \
                libopenblas-dev libopenmpi-dev openmpi-bin gnuplot-nox zlib1g-dev chromium

CC       := mpicc
PLANNER_LAYERS := $(patsubst %/,%,$(sort $(dir $(wildcard planner/*/*.c planner/*/*.h))))
PKGS     := glib-2.0 jansson gsl zlib
CFLAGS   ?= -O2 -g
override CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -MMD -MP \
            $(patsubst %,-I%,$(PLANNER_LAYERS)) -Isim -Ireal $(shell pkg-config --cflags $(PKGS) 2>/dev/null) \
            -DZP_DATA_DIR=\"$(CURDIR)\" -DZP_BUILD_DIR=\"$(abspath $(BUILD))\"
# GSL's CBLAS interface, implemented by OpenBLAS (not GSL's reference gslcblas).
LDLIBS   := $(shell pkg-config --libs-only-L --libs-only-l glib-2.0 jansson zlib 2>/dev/null) \
            -lgsl -lopenblas -lm

# CUDA and NCCL are optional. Where $(CUDA_HOME)/bin/nvcc exists (ZP_WITH_CUDA=yes) the CUDA
# backend (real/*.cu) and the NCCL communicator (the .c files in CUDA_C_SRC include CUDA and
# NCCL headers, so they are kept out of REAL_SRC) go into libzcuda.a, which tests/gpu/ links
# (built for `make gpu-test`), and into libzcuda.so beside zreal, which zreal opens only for
# --backend cuda (real_cuda_load.c, told by -DZP_HAVE_CUDA that it exists): linked into zreal,
# CUDA's libraries took 77 ms of each CPU rank's start, a 4-rank run of the tiny model 1.08 s
# against 0.55 s. zreal exports its symbols (--export-dynamic), whole libzreal.a included, for
# the library's calls back into it. Elsewhere all of it is skipped and `zreal --backend cuda`
# says it was built without CUDA.
NVCC         := $(CUDA_HOME)/bin/nvcc
ZP_WITH_CUDA ?= $(if $(wildcard $(NVCC)),yes,no)
CUDA_C_SRC   := real/real_comm_nccl.c
CUDA_CU_SRC  := $(wildcard real/*.cu)
GPU_TEST_SRC := $(wildcard tests/gpu/test_*.c)
# What the GPU test programs share (tests/gpu/gpu_testutil.h), linked into each.
GPU_TEST_UTIL := $(filter-out $(GPU_TEST_SRC),$(wildcard tests/gpu/*.c))
# sm_90 machine code and compute_90 PTX (what -arch=sm_90 gives: H100, and newer GPUs through
# the driver's JIT), plus sm_80 machine code for A100s. --fmad=false keeps a * b + c rounded
# twice, as the CPU backend's C computes it, so the elementwise kernels match it bit for bit
# (the GEMMs are cuBLAS's and unaffected). GLib's headers are passed as system headers: nvcc's
# front end warns about their gnu_printf format attribute otherwise.
NVCCFLAGS := -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90 -gencode arch=compute_80,code=sm_80 \
             --fmad=false -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-fPIC -MMD -MP -Ireal \
             $(patsubst -I%,-isystem %,$(shell pkg-config --cflags-only-I glib-2.0 2>/dev/null))
# libstdc++: nvcc's object is C++ (static-initialisation guards).
# libnccl.so.2 by its soname: a wheel ships no unversioned libnccl.so for -lnccl to find.
NCCL_LIB := $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so.2 $(NCCL_HOME)/lib/libnccl.so.2))
NCCL_LIB_DIR := $(patsubst %/,%,$(dir $(or $(NCCL_LIB),$(CUDA_HOME)/lib64/)))
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt \
               -L$(NCCL_LIB_DIR) -Wl,-rpath,$(NCCL_LIB_DIR) -l:libnccl.so.2 -lstdc++

# planner/ is a house of layers, one folder each (planner/LAYERS, docs/architecture.md); every
# folder is on the include path, so a header keeps its bare name wherever it lives.
PLANNER_SRC := $(wildcard planner/*/*.c)
SIM_SRC     := $(wildcard sim/*.c)
REAL_SRC    := $(filter-out $(CUDA_C_SRC),$(wildcard real/*.c))
# cli/: the two programs' mains and zplan's subcommands. Dependencies run one way: cli/ uses
# planner/, sim/ and real/, and only cli/, the tests and the benchmarks see cli/'s headers.
CLI_MAINS   := cli/zplan.c cli/zreal_main.c
CLI_SRC     := $(filter-out $(CLI_MAINS),$(wildcard cli/*.c))
TEST_SRC    := $(wildcard tests/test_*.c)
TEST_UTIL   := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))
# The fuzz harnesses, one per input loader, and what they share (tests/fuzz/fuzz.h).
FUZZ_SRC    := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_UTIL   := tests/fuzz/fuzz_util.c
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(filter-out $(FUZZ_UTIL),$(FUZZ_SRC)))
BENCH_SRC   := $(wildcard bench/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIBS := $(BUILD)/libzcli.a $(BUILD)/libzsim.a $(BUILD)/libzreal.a $(BUILD)/libzplanner.a
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
BINS := $(BUILD)/zplan $(BUILD)/zreal
CUDA_OBJ := $(call obj,$(CUDA_C_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_CU_SRC))
GPU_TESTS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(GPU_TEST_SRC))
ifeq ($(ZP_WITH_CUDA),yes)
override CFLAGS += -DZP_HAVE_CUDA
ZREAL_PLUGIN := $(BUILD)/libzcuda.so
ZREAL_LDFLAGS := -Wl,--export-dynamic
ALL_GPU_TESTS := $(GPU_TESTS)
endif

.PHONY: all setup run test test-run check-asan clean cuda-check gpu-test bench reports fuzz \
        fuzz-setup
all: cuda-check $(BINS) $(TESTS) $(BENCHES) $(ALL_GPU_TESTS)

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

# Says whether this build compiles the GPU parts, and why not when it does not.
cuda-check:
ifeq ($(ZP_WITH_CUDA),yes)
	@echo "cuda: building the CUDA backend and NCCL communicator with $(NVCC)"
else ifneq ($(wildcard $(NVCC)),)
	@echo "cuda: GPU parts not built in $(BUILD) (ZP_WITH_CUDA=$(ZP_WITH_CUDA))"
else
	@echo "cuda: no nvcc under $(CUDA_HOME) (set CUDA_HOME); GPU parts skipped"
endif

run: setup
	@$(MAKE) --no-print-directory all
	$(BUILD)/zplan memory --model gpt2-1.5b --cluster dgx2-v100 --gpus 64

test: setup
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory test-run

# GLib test programs speak TAP; prove runs them and prints the closing summary CI reads.
# tests/layers.t checks every include against planner/LAYERS and for cycles (a perl script).
test-run: $(TESTS)
	prove -f -e '' tests/layers.t $(TESTS) :: --tap

# The same variables go to both steps, so that nothing is relinked without the sanitizers.
# Leaks are detected; tests/lsan.supp names the third-party internals that leak by design
# (Open MPI's), found through full stacks (fast_unwind_on_malloc=0) with Open MPI's plugins
# kept loaded so their frames have names.
# intercept_tls_get_addr=0: this runtime's (GCC 12 libasan's) __tls_get_addr hook takes a dynamic
# TLS block that starts 16 bytes into a page for one with glibc 2.19's header and records the two
# words before it as the block's range (sanitizer_tls_get_addr.cpp DTLS_on_tls_get_addr;
# google/sanitizers#1322; newer LLVM asks its allocator, GetDTLSRange, llvm/llvm-project#108120).
# During MPI_Init hwloc's OpenCL plugin loads libOpenCL.so.1, whose 4-byte TLS block ld.so
# mallocs; where it lands depends only on earlier 16-byte allocations (argv's length moves it),
# and at such an address LeakSanitizer's tracer scans {0x3b86, 0x400001102} and dies at exit
# ("Tracer caught signal 11: addr=0x3b88"). A program that calls only MPI_Init and MPI_Finalize
# does so after 76 live malloc(16) and passes with the hook off. Off, the hook records no
# ranges, so LSan has fewer roots: it can report more, never hide a leak.
# The CUDA parts are left out (ZP_WITH_CUDA=no): nvcc's objects would not be instrumented, and
# the CUDA runtime maps memory where ASan keeps its shadow, so a sanitized zreal could not even
# ask for a device; the sanitized tests then check the without-CUDA path instead.
ASAN_VARS := BUILD=build-asan ZP_WITH_CUDA=no LDFLAGS="-fsanitize=address,undefined" \
  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
check-asan: setup
	@$(MAKE) --no-print-directory $(ASAN_VARS) all
	ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:intercept_tls_get_addr=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	  OMPI_MCA_mca_base_component_disable_dlclose=1 \
	  $(MAKE) --no-print-directory $(ASAN_VARS) test-run

$(call obj,$(CLI_SRC) $(CLI_MAINS) $(TEST_SRC) $(TEST_UTIL) $(FUZZ_SRC) $(BENCH_SRC)): \
  override CFLAGS += -Icli
# The simulator's event loop runs once per op and rank (2,000 ops x 100,000 ranks): -O3 inlines
# the per-op path (counting dependencies down, starting a stream's next op) into the loop, 12%
# fewer instructions per rank-op than -O2 (bench/bench_sim).
$(call obj,$(SIM_SRC)): override CFLAGS += -O3
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(call obj,$(CUDA_C_SRC)): $(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -isystem $(NCCL_HOME)/include -isystem $(CUDA_HOME)/include -c $< -o $@
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/libzplanner.a: $(call obj,$(PLANNER_SRC))
$(BUILD)/libzsim.a: $(call obj,$(SIM_SRC))
$(BUILD)/libzreal.a: $(call obj,$(REAL_SRC))
$(BUILD)/libzcuda.a: $(CUDA_OBJ)
$(BUILD)/libzcli.a: $(call obj,$(CLI_SRC))
$(BUILD)/lib%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# zplan needs a CBLAS only for GSL's fits (calibrate, the op tables), a few dozen numbers:
# GSL's own gslcblas, not OpenBLAS, whose load (buffers, CPU detection, its thread pool) was
# 4.5 ms of every run, half of a small plan's `zplan simulate` (zreal keeps OpenBLAS: its CPU
# backend's GEMMs).
ZPLAN_LDLIBS := $(subst -lopenblas,-lgslcblas,$(LDLIBS))
$(BUILD)/zplan: $(call obj,cli/zplan.c) $(LIBS)
	$(CC) $(LDFLAGS) $^ -o $@ $(ZPLAN_LDLIBS)
# libzcuda.so takes position-independent objects only: those built before this file said
# -fPIC are rebuilt (any change here rebuilds the seven, a minute of nvcc).
$(call obj,$(CUDA_C_SRC)): override CFLAGS += -fPIC
$(CUDA_OBJ): Makefile
$(BUILD)/libzcuda.so: $(CUDA_OBJ)
	$(CC) $(LDFLAGS) -shared $^ -o $@ $(CUDA_LDLIBS)
$(BUILD)/zreal: $(call obj,cli/zreal_main.c) $(LIBS) | $(ZREAL_PLUGIN)
	$(CC) $(LDFLAGS) $(ZREAL_LDFLAGS) $(call obj,cli/zreal_main.c) $(BUILD)/libzcli.a \
	  $(BUILD)/libzsim.a -Wl,--whole-archive $(BUILD)/libzreal.a -Wl,--no-whole-archive \
	  $(BUILD)/libzplanner.a -o $@ $(LDLIBS)
$(BUILD)/tests/gpu/%: $(call obj,tests/gpu/%.c) $(call obj,$(GPU_TEST_UTIL)) $(BUILD)/libzcuda.a \
                      $(LIBS) | $(BINS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(CUDA_LDLIBS) $(LDLIBS)
# The replay test links every harness (tests/fuzz/ is on its include path).
$(BUILD)/tests/test_fuzz_replay: EXTRA_OBJ = $(call obj,$(FUZZ_SRC))
$(BUILD)/tests/test_fuzz_replay: $(call obj,$(FUZZ_SRC))
$(call obj,tests/test_fuzz_replay.c $(FUZZ_SRC)): override CFLAGS += -Itests/fuzz
$(BUILD)/tests/%: $(call obj,tests/%.c) $(call obj,$(TEST_UTIL)) $(LIBS) | $(BINS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(EXTRA_OBJ) $(call obj,$(TEST_UTIL)) $(LIBS) -o $@ $(LDLIBS)
$(BUILD)/bench/%: $(call obj,bench/%.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(LIBS) -o $@ $(LDLIBS)

# The checks that need a GPU: every CUDA backend entry against the CPU backend (every
# tests/gpu/test_* program, each run even when one before fails), then zreal trained on both
# backends (bench/gpu_validate.sh). Non-zero exit when any fails, or when this build has no
# CUDA parts to check.
ifeq ($(ZP_WITH_CUDA),yes)
gpu-test: all
	@status=0; for t in $(GPU_TESTS); do echo "gpu-test: $$t"; $$t || status=1; done; \
	  exit $$status
	sh bench/gpu_validate.sh $(BUILD)
else
gpu-test:
	@echo "gpu-test: $(BUILD) has no CUDA parts (ZP_WITH_CUDA=$(ZP_WITH_CUDA); they need $(NVCC)); nothing to run" >&2
	@exit 1
endif

# Benchmarks print figures for the closing notes; they assert nothing about time.
bench: all
	$(BUILD)/bench/bench_sim
	$(BUILD)/bench/bench_plan
	$(BUILD)/bench/bench_io
	$(BUILD)/bench/bench_gemm
	sh bench/validate_cpu.sh $(BUILD)/validate-cpu
	sh bench/pipe_bubble.sh $(BUILD)

# Regenerates reports/ (README.md with the paper's tables beside zplan's, and the plots).
reports: $(BUILD)/zplan
	sh reports/generate.sh $(BUILD)/zplan

# Fuzzing, outside CI: every harness built by clang with libFuzzer and ASan/UBSan against the
# project's sources (build-fuzz/), then run FUZZ_S seconds each over its seed corpus (models/,
# hwprofiles/ and tests/fuzz/corpus/hwprofile/ (a calibrated profile with a collective table),
# models/hf/ (libFuzzer reads folders recursively) or tests/fuzz/corpus/TARGET/)
# and its past crashes. New inputs collect in
# build-fuzz/corpus/TARGET/, crashes in build-fuzz/crashes/; a fixed crash's input goes into
# tests/fuzz/regressions/TARGET/, which test_fuzz_replay replays in `make test`.
FUZZ_S      ?= 60
FUZZ_BUILD  := build-fuzz
FUZZ_DEBS   := clang libclang-rt-dev
FUZZ_VARS := BUILD=$(FUZZ_BUILD) ZP_WITH_CUDA=no CC=clang \
  CFLAGS="-O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
          -fno-sanitize-recover=undefined -DZP_LIBFUZZER -Itests/fuzz $(shell mpicc --showme:compile 2>/dev/null)" \
  LDFLAGS="-fsanitize=fuzzer,address,undefined $(shell mpicc --showme:link 2>/dev/null)"

fuzz-setup:
	@$(MAKE) --no-print-directory DEB_PACKAGES="$(FUZZ_DEBS)" setup

fuzz: setup fuzz-setup
	@$(MAKE) --no-print-directory $(FUZZ_VARS) $(patsubst %,$(FUZZ_BUILD)/fuzz/fuzz_%,$(FUZZ_TARGETS))
	@mkdir -p $(FUZZ_BUILD)/crashes
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  case $$t in model) seeds=models;; hwprofile) seeds="hwprofiles tests/fuzz/corpus/hwprofile";; \
	    hfconfig) seeds=models/hf;; \
	    *) seeds=tests/fuzz/corpus/$$t;; esac; \
	  regressions=; [ -d tests/fuzz/regressions/$$t ] && regressions=tests/fuzz/regressions/$$t; \
	  echo "fuzz: $$t for $(FUZZ_S) s"; \
	  ASAN_OPTIONS=detect_leaks=0 $(FUZZ_BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_S) \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/$$t- \
	    $(FUZZ_BUILD)/corpus/$$t $$seeds $$regressions || exit 1; \
	done

$(BUILD)/fuzz/fuzz_%: $(call obj,tests/fuzz/fuzz_%.c) $(call obj,$(FUZZ_UTIL)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDFLAGS) $(LDLIBS)

clean:
	rm -rf build build-asan build-nocuda build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
