#!/usr/bin/env bash
# The build for any x86-64 (cmake -DTLM_NATIVE=OFF, the working tree in build-portable) against
# the -march=native build of REV (default HEAD: the same source, committed), on compare.sh's
# benchmarks, alternately, in one run. Above 1 (ok within 3%): the portable build is as fast.
# REV f4086ef measures against the native build of the revision before the portable one.
# usage: bench/native_vs_portable.sh [REV=HEAD] [REPS]   (compare.sh's environment applies)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export BUILD=${BUILD:-build-portable}
export CMAKE_FLAGS="-DTLM_NATIVE=OFF${CMAKE_FLAGS:+ $CMAKE_FLAGS}"
export REV_CMAKE_FLAGS="-DTLM_NATIVE=ON${REV_CMAKE_FLAGS:+ $REV_CMAKE_FLAGS}"
exec bash "$ROOT/bench/compare.sh" "$@"
