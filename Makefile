# The two commands of README.md. Both install what is missing and build.
#   make demo   the main job: PyTorch's data-parallel tutorial on DataParallel, then an MLP
#               trained by 2 DDP processes on the shipped Fashion-MNIST subset (test
#               accuracy per epoch; plot in build/demo.png, metrics in build/demo.jsonl).
#               An MLP with momentum, not d2l's sigmoid LeNet, because it learns from the
#               first epoch (README.md, Two commands).
#   make test   the whole test suite (GoogleTest through CTest) on both libtorch lines, each
#               leg on the line it fits: Debian's libtorch 1.13 built by clang with
#               AddressSanitizer + UndefinedBehaviorSanitizer, every test and each fuzz target
#               for FUZZ_SECONDS (build-asan/); pip's torch 2.x (CUDA: the CUDA sources compile
#               and link; the CPU suite runs, the `gpu` tests skip without a GPU) in
#               build-torch2/, beside a CPU-bound process; the threaded suites under
#               ThreadSanitizer (build-tsan/); and the offline bundle built and run by
#               scripts/gpu_check.sh in a Debian chroot without datapar's -dev packages
#               (test-bundle: every gpu test reported skipped with its reason).
#               Sanitizers run on Debian's line: pip's libtorch carries its own gloo, which
#               datapar's gloo module shadows with RTLD_DEEPBIND, and the sanitizers' runtimes
#               do not support DEEPBIND.
# One leg alone: make test-asan, make test-torch2, make test-tsan; the plain Debian build:
# make test-debian. On a GPU machine: make test-gpu. Longer fuzzing: make fuzz.
# For a GPU node without network: make bundle (build/datapar-bundle.tar.gz; there, run
# datapar/scripts/gpu_check.sh OUTDIR); make test-bundle proves it builds and runs in a Debian
# chroot that has none of the -dev packages (tests/bundle/chroot_check.sh).
BUILD_DIR ?= build
TORCH2_BUILD_DIR ?= build-torch2
ASAN_BUILD_DIR ?= build-asan
TSAN_BUILD_DIR ?= build-tsan
FUZZ_SECONDS ?= 20
TORCH_VERSION ?= 2.15.0
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

# What `make demo` runs, and so all that it builds.
# (and the examples a user copies: built with it, run by the tests).
DEMO_TARGETS := datapar_cli data_parallel_tutorial ddp_fashion_mnist fsdp_fashion_mnist ft_ddp_fashion_mnist
# make test's legs, in this order (scripts/test_legs.sh): the quickest to a first failure first.
LEGS ?= tsan torch2 asan bundle

.PHONY: all help setup build build-torch2 build-asan build-tsan build-bundle demo test test-debian test-torch2 \
  test-asan test-tsan test-gpu fuzz bench bundle test-bundle clean

include tests/sanitizers/sanitizers.mk

all: build

# What each target builds and runs, and how long it takes on a 2-core machine (docs/benchmarks.md,
# "Build and CI times"): a fresh clone, scripts/setup.sh already run; "again" with ccache warm.
help:
	@echo "make demo          the library, the CLI, the tutorial and the examples only; runs the tutorial"
	@echo "                   and 2 DDP processes training an MLP on the shipped Fashion-MNIST subset"
	@echo "                   (2.4 min from a fresh clone, 0.6 with ccache warm)"
	@echo "make build         everything (library, CLI, examples, benchmarks, tests) in build/ (6.9 min)"
	@echo "make test          every leg of the suite (LEGS='$(LEGS)'), each built beside the tests of the one"
	@echo "                   before, a summary at the end (44 min cold):"
	@echo "  make test-tsan     ThreadSanitizer over the threaded suites (build-tsan/; 2.1 + 3.3 min)"
	@echo "  make test-torch2   pip's torch $(TORCH_VERSION) (CUDA), the whole suite, 3 suites at a time (build-torch2/; 8.3 + 8.6)"
	@echo "  make test-asan     Debian's libtorch under ASan+UBSan, every test and fuzz target (build-asan/; 6.6 + 14.3)"
	@echo "  make test-bundle   the offline bundle built and checked in a chroot without -dev packages (4.2)"
	@echo "make test-debian   the whole suite on the plain Debian build (build/)"
	@echo "make test-gpu      the tests labelled gpu (a CUDA machine)"
	@echo "make bundle        build/datapar-bundle.tar.gz for a GPU node without network"
	@echo "make fuzz          each fuzz target for FUZZ_SECONDS (default $(FUZZ_SECONDS))"
	@echo "Minutes measured on 2 cores: docs/benchmarks.md, 'Build and CI times'."

setup:
	bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

# pip's torch in a virtual environment under ~/.cache/datapar (scripts/setup_torch.sh).
build-torch2: setup
	prefix=$$(bash scripts/setup_torch.sh $(TORCH_VERSION)) && \
	  cmake -S . -B $(TORCH2_BUILD_DIR) -G Ninja $(CMAKE_FLAGS) -DCMAKE_PREFIX_PATH="$$prefix"
	cmake --build $(TORCH2_BUILD_DIR) -j $(JOBS)

demo:
	bash scripts/setup.sh --demo
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS) --target $(DEMO_TARGETS)
	$(BUILD_DIR)/bin/data_parallel_tutorial
	$(BUILD_DIR)/bin/datapar launch --nproc-per-node 2 -- $(BUILD_DIR)/bin/datapar train --mode ddp \
	  --model mlp --epochs 10 --batch-size 64 --lr 0.005 --momentum 0.9 \
	  --plot $(BUILD_DIR)/demo.png --metrics $(BUILD_DIR)/demo.jsonl

test: setup
	bash scripts/test_legs.sh $(LEGS)

# The DCP interop tests run PyTorch 2.15's Python (scripts/setup_torch.sh) on either line.
build-debian: build

test-debian: build
	bash scripts/setup_torch.sh $(TORCH_VERSION) >/dev/null
	$(BUILD_DIR)/bin/datapar --version
	rm -rf $(BUILD_DIR)/gtest-results
	cd $(BUILD_DIR) && ctest --output-on-failure -j 1

# Beside a CPU-bound process (scripts/with_cpu_load.sh): the suite must not need a quiet machine.
test-torch2: build-torch2
	$(TORCH2_BUILD_DIR)/bin/datapar --version
	rm -rf $(TORCH2_BUILD_DIR)/gtest-results
	cd $(TORCH2_BUILD_DIR) && bash $(CURDIR)/scripts/with_cpu_load.sh ctest --output-on-failure -j 3

# Debian's libtorch under clang with AddressSanitizer + UndefinedBehaviorSanitizer: the whole
# suite, and each fuzz target (fuzz/) for FUZZ_SECONDS under libFuzzer.
build-asan: setup
	bash scripts/setup_torch.sh $(TORCH_VERSION) >/dev/null
	CC=clang CXX=clang++ cmake -S . -B $(ASAN_BUILD_DIR) -G Ninja $(CMAKE_FLAGS) \
	  -DDATAPAR_SANITIZE=address,undefined -DDATAPAR_FUZZ=ON -DDATAPAR_FUZZ_SECONDS=$(FUZZ_SECONDS) \
	  -DDATAPAR_BUILD_BENCH=OFF
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)

test-asan: build-asan
	rm -rf $(ASAN_BUILD_DIR)/gtest-results
	cd $(ASAN_BUILD_DIR) && $(ASAN_ENV) ctest --output-on-failure -j 3

# ThreadSanitizer over the threaded parts (tests/CMakeLists.txt: datapar_thread_tests).
build-tsan: setup
	CC=clang CXX=clang++ cmake -S . -B $(TSAN_BUILD_DIR) -G Ninja $(CMAKE_FLAGS) -DDATAPAR_SANITIZE=thread
	cmake --build $(TSAN_BUILD_DIR) -j $(JOBS) --target datapar_thread_tests

test-tsan: build-tsan
	$(TSAN_ENV) $(TSAN_BUILD_DIR)/bin/datapar_thread_tests

# A longer fuzzing run of every target (docs/fuzzing.md), e.g. make fuzz FUZZ_SECONDS=3600.
fuzz: setup
	CC=clang CXX=clang++ cmake -S . -B $(ASAN_BUILD_DIR) -G Ninja $(CMAKE_FLAGS) \
	  -DDATAPAR_SANITIZE=address,undefined -DDATAPAR_FUZZ=ON -DDATAPAR_FUZZ_SECONDS=$(FUZZ_SECONDS)
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	cd $(ASAN_BUILD_DIR) && $(FUZZ_ENV) ctest --output-on-failure -L fuzz -j $(JOBS)

# The tests that need CUDA devices (CTest label gpu), on pip's CUDA torch.
test-gpu: build-torch2
	cd $(TORCH2_BUILD_DIR) && ctest --output-on-failure -j 1 -L gpu

# The source and every dependency but libtorch and CUDA, from Debian's packages (docs/building.md,
# On a GPU machine).
bundle: setup
	bash scripts/make_bundle.sh $(BUILD_DIR)/datapar-bundle.tar.gz

# The bundle in a debootstrapped chroot with a compiler, CMake, ninja, pip's torch and CUDA
# but no -dev package: gpu_check.sh builds, runs the gpu tests (all skipped) and reports.
# Its build runs inside the chroot, in test-bundle; build-bundle makes the tarball.
build-bundle: bundle

test-bundle: build-bundle
	bash scripts/setup_torch.sh $(TORCH_VERSION) >/dev/null
	DATAPAR_TORCH_VERSION=$(TORCH_VERSION) bash tests/bundle/chroot_check.sh $(BUILD_DIR)/datapar-bundle.tar.gz

bench: build
	$(BUILD_DIR)/bin/dp_step_bench

clean:
	rm -rf $(BUILD_DIR) $(TORCH2_BUILD_DIR) $(ASAN_BUILD_DIR) $(TSAN_BUILD_DIR)
