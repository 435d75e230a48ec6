# Thin wrapper over CMake: `make` builds build/tlm and the library, `make test` runs every test
# (TESTS=REGEX: those whose names match; EXCLUDE=REGEX: not those). CMAKE_FLAGS=-DTLM_NATIVE=ON builds for this machine's
# CPU alone, =OFF for any x86-64 (CMakeLists.txt's TLM_NATIVE: which is the default, and why).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
TESTS ?=
EXCLUDE ?=

.PHONY: all test asan tsan clean format bench

all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Tests run JOBS at a time (each sized for a couple of threads, waiting passively).
test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(if $(TESTS),-R '$(TESTS)') \
		$(if $(EXCLUDE),-E '$(EXCLUDE)')

# Every test under AddressSanitizer and UndefinedBehaviorSanitizer but lora_convert, whose time is
# llama.cpp's Python converter: tlm's part of it, loading a GGUF adapter, runs instrumented in
# test_lora_files and the lora fuzz target.
asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DTLM_SANITIZE=ON -DTLM_NATIVE=OFF" \
		EXCLUDE='^lora_convert$$'

# ThreadSanitizer over the C tests (two sessions on one model in two threads, and the rest of the
# suite). OMP_THREAD_LIMIT=1 keeps every OpenMP team (ours and OpenBLAS's) to its calling thread:
# libgomp is not instrumented, so races between its workers could not be told from its own
# synchronisation; the threads under test are the callers' own (pthreads). test_quant is left to
# the other builds: its comparisons with ggml's quantizers, single-threaded here, take minutes
# under ThreadSanitizer and start no thread of tlm's.
tsan:
	$(MAKE) all BUILD=build-tsan CMAKE_FLAGS="-DTLM_TSAN=ON -DTLM_NATIVE=OFF"
	cd build-tsan && OMP_THREAD_LIMIT=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
		ctest --output-on-failure -j $(JOBS) -R '^(gen_fixtures|test_)' -E '^test_quant$$'

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-*/
