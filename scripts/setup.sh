#!/usr/bin/env bash
# Installs what tlm needs on a fresh Debian machine (run as root). Idempotent.
set -euo pipefail
pkgs=(build-essential cmake clang clang-format libclang-rt-14-dev libomp-dev
      libopenblas-openmp-dev libdnnl-dev libcjson-dev openmpi-bin libopenmpi-dev libmicrohttpd-dev
      python3 python3-torch python3-numpy python3-jsonschema chromium git qemu-user pkg-config)
# git: test_tokenizer_gguf takes llama.cpp's vocabularies out of the source bundle node-llama-cpp carries.
# qemu-user: tests/portable.sh runs the build for any x86-64 on emulated older CPUs.
# pkg-config: tests/library.sh builds docs/library.md's program with tlm.pc's flags.
# python3-jsonschema: tests/grammar.sh validates structured output with a validator of its own.
# Node.js (for the llama.cpp and tiktoken peers from npm) may come from another source with npm inside.
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# llama.cpp as a real client of our GGUF files (tests/formats_cli.sh, bench/): node-llama-cpp ships
# prebuilt CPU libraries, so nothing is compiled or downloaded beyond the npm packages. `npm install`
# (which honours the lock file) rather than `npm ci`, which rejects a lock without every platform.
# tlm serve's tests also use the openai package and puppeteer-core (with Debian's chromium).
node_missing=0
for p in node-llama-cpp openai puppeteer-core; do
  [ -d "$(dirname "$0")/../tests/node/node_modules/$p" ] || node_missing=1
done
if [ "$node_missing" = 1 ]; then
  (cd "$(dirname "$0")/../tests/node" &&
   NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund --loglevel=error)
fi
