#!/usr/bin/env bash
# The main job on a fresh Debian machine (as root): install what is missing, build, then show a
# model's architecture and parameter counts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make
build/tlm info -c configs/gpt2-small.json
