# Runtime options of the sanitizer legs, included by the Makefile. Every report is fatal
# (halt_on_error / exitcode), so a finding fails the test that caused it.
SANITIZER_DIR := $(CURDIR)/tests/sanitizers
# Reports name functions (and suppressions can match them) only with a symbolizer (llvm-14).
SYMBOLIZER := /usr/lib/llvm-14/bin/llvm-symbolizer
# malloc_context_size=5: a report names 5 frames where each block was allocated and freed (30
# by default); recording those stacks at every malloc was a tenth of a worker's start-up (most
# of the ASan leg's CPU: libtorch's static initialisers allocate as each process starts).
ASAN_OPTIONS_ALL := halt_on_error=1:detect_stack_use_after_return=0:strict_string_checks=1:check_initialization_order=1:detect_leaks=1:malloc_context_size=5
ASAN_ENV = ASAN_SYMBOLIZER_PATH=$(SYMBOLIZER) ASAN_OPTIONS=$(ASAN_OPTIONS_ALL) \
  LSAN_OPTIONS=suppressions=$(SANITIZER_DIR)/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SANITIZER_DIR)/ubsan.supp
TSAN_ENV = TSAN_SYMBOLIZER_PATH=$(SYMBOLIZER) TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(SANITIZER_DIR)/tsan.supp \
  OMP_NUM_THREADS=1
# Long fuzzing runs (make fuzz): over a grown corpus ASan's quarantine of freed memory (256 MiB
# by default) fills up and, on top of libtorch's 352 MiB, crosses libFuzzer's RSS limit with
# no input to blame (docs/fuzzing.md). 64 MiB keeps the resident size near 460-510 MiB.
FUZZ_ENV = $(ASAN_ENV) ASAN_OPTIONS=$(ASAN_OPTIONS_ALL):quarantine_size_mb=64
