# The two commands of README.md. Both install what is missing (Debian packages) and build.
#   make demo   the main job: PyTorch's data-parallel tutorial on DataParallel, then LeNet
#               trained by 2 DDP processes on the shipped Fashion-MNIST subset (test
#               accuracy per epoch; plot in build/demo.png, metrics in build/demo.jsonl)
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
	$(BUILD_DIR)/bin/datapar launch --nproc-per-node 2 -- $(BUILD_DIR)/bin/datapar train --mode ddp \
	  --model lenet --epochs 15 --batch-size 64 --lr 0.9 --plot $(BUILD_DIR)/demo.png --metrics $(BUILD_DIR)/demo.jsonl

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j 1

bench: build
	$(BUILD_DIR)/bin/dp_step_bench

clean:
	rm -rf $(BUILD_DIR)
