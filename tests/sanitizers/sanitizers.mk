# Runtime options of the sanitizer legs, included by the Makefile. Every report is fatal
# (halt_on_error / exitcode), so a finding fails the test that caused it.
SANITIZER_DIR := $(CURDIR)/tests/sanitizers
# Reports name functions (and suppressions can match them) only with a symbolizer (llvm-14).
SYMBOLIZER := /usr/lib/llvm-14/bin/llvm-symbolizer
# Allocation stacks stay whole (malloc_context_size 30): recording them is a tenth of a worker's
# start under ASan, but lsan.supp matches a frame deeper than 5 (tried: fuzz.checkpoint failed).
ASAN_OPTIONS_ALL := halt_on_error=1:detect_stack_use_after_return=0:strict_string_checks=1:check_initialization_order=1:detect_leaks=1
ASAN_ENV = ASAN_SYMBOLIZER_PATH=$(SYMBOLIZER) ASAN_OPTIONS=$(ASAN_OPTIONS_ALL) \
  LSAN_OPTIONS=suppressions=$(SANITIZER_DIR)/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SANITIZER_DIR)/ubsan.supp
TSAN_ENV = TSAN_SYMBOLIZER_PATH=$(SYMBOLIZER) TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(SANITIZER_DIR)/tsan.supp \
  OMP_NUM_THREADS=1
# Long fuzzing runs (make fuzz): over a grown corpus ASan's quarantine of freed memory (256 MiB
# by default) fills up and, on top of libtorch's 352 MiB, crosses libFuzzer's RSS limit with
# no input to blame (docs/fuzzing.md). 64 MiB keeps the resident size near 460-510 MiB.
FUZZ_ENV = $(ASAN_ENV) ASAN_OPTIONS=$(ASAN_OPTIONS_ALL):quarantine_size_mb=64
