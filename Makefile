# Thin wrapper over CMake: `make` builds build/tlm and the library, `make test` runs every test.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all test asan clean format bench

all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: all
	cd $(BUILD) && ctest --output-on-failure -j 1

asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DTLM_SANITIZE=ON -DTLM_NATIVE=OFF"

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-clang
