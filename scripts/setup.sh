#!/usr/bin/env bash
# Installs what tlm needs on a fresh Debian machine (run as root). Idempotent.
set -euo pipefail
pkgs=(build-essential cmake clang clang-format libclang-rt-14-dev libomp-dev
      libopenblas-openmp-dev libcjson-dev libpcre2-dev
      python3 python3-torch python3-numpy)
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
