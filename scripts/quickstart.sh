#!/usr/bin/env bash
# The main job on a fresh Debian machine (as root): install what is missing, build, train a small
# character-level model for about a minute on text every Debian system has (the license texts in
# /usr/share/common-licenses), then sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make
mkdir -p runs
find /usr/share/common-licenses -type f | sort | xargs cat >runs/licenses.txt
build/tlm train -c configs/demo-char.json --data runs/licenses.txt --char -o runs/demo \
    --steps 600 --batch 16 --lr 2e-3 --warmup 50 --eval-interval 200 --eval-batches 20
echo
build/tlm generate -m runs/demo -p "This License" -n 110 --temp 0.8 --seed 1
echo
