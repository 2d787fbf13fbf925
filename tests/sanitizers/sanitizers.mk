# Runtime options of the sanitizer legs, included by the Makefile. Every report is fatal
# (halt_on_error / exitcode), so a finding fails the test that caused it.
SANITIZER_DIR := $(CURDIR)/tests/sanitizers
# Reports name functions (and suppressions can match them) only with a symbolizer (llvm-14).
SYMBOLIZER := /usr/lib/llvm-14/bin/llvm-symbolizer
ASAN_ENV = ASAN_SYMBOLIZER_PATH=$(SYMBOLIZER) ASAN_OPTIONS=halt_on_error=1:detect_stack_use_after_return=0:strict_string_checks=1:check_initialization_order=1:detect_leaks=1 \
  LSAN_OPTIONS=suppressions=$(SANITIZER_DIR)/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SANITIZER_DIR)/ubsan.supp
TSAN_ENV = TSAN_SYMBOLIZER_PATH=$(SYMBOLIZER) TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(SANITIZER_DIR)/tsan.supp \
  OMP_NUM_THREADS=1
