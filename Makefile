# The two commands of README.md. Both install what is missing (Debian packages) and build.
#   make demo   the main job: PyTorch's data-parallel tutorial on DataParallel
#   make test   the whole test suite (GoogleTest through CTest)
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all setup build demo test bench clean

all: build

setup:
	bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/bin/data_parallel_tutorial

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j 1

bench: build
	$(BUILD_DIR)/bin/dp_step_bench

clean:
	rm -rf $(BUILD_DIR)
