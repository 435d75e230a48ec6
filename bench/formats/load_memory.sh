#!/usr/bin/env bash
# Files used in place: load time, peak resident memory and decode speed of `tlm generate` on F32
# GGUF files of random llama2.c-shaped 15M and 110M models, with the weights memory-mapped (the
# default) and read into memory (--no-mmap), alternating the two, medians of REPS runs.
# Usage: bash bench/formats/load_memory.sh [REPS=3] [TOKENS=64]
# Target (issue 11): peak RSS of a short generation <= 1.2 x file + 64 MiB; load time
# independent of the model's size. Writes bench/out/load_memory.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TLM=${TLM:-$ROOT/build/tlm}
REPS=${1:-3}
N=${2:-64}
THREADS=${THREADS:-2}
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
W=$ROOT/bench/out/decode_models
mkdir -p "$W"
echo "# $(nproc) cores; threads $THREADS; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset};" \
     "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-tlm default (passive)}; load $(cut -d' ' -f1-3 /proc/loadavg)"
results=()
for spec in "15M 288 768 6 6 256" "110M 768 2048 12 12 1024"; do
  read -r name dim hidden layers heads seq <<<"$spec"
  gguf=$W/$name.gguf
  if [ ! -f "$gguf" ]; then
    /usr/bin/python3 "$ROOT/bench/formats/random_llama2c.py" "$W/$name.bin" "$dim" "$hidden" \
      "$layers" "$heads" 32000 "$seq"
    "$TLM" convert "$W/$name.bin" "$gguf" --to gguf 2>/dev/null
    rm -f "$W/$name.bin"
  fi
  bytes=$(stat -c %s "$gguf")
  out=$(/usr/bin/python3 - "$TLM" "$gguf" "$REPS" "$N" "$THREADS" "$bytes" "$name" <<'EOF'
import json, re, resource, statistics, subprocess, sys
tlm, gguf, reps, n, threads, size, name = sys.argv[1:8]
reps, size = int(reps), int(size)
runs = {"mmap": [], "copy": []}
for r in range(reps):
    for mode in ("mmap", "copy"):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        cmd = [tlm, "generate", "-m", gguf, "--ids", "1", "-n", n, "--temp", "0", "--print-ids",
               "-t", threads] + (["--no-mmap"] if mode == "copy" else [])
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = p.communicate()
        err = err.decode()
        load = float(re.search(r"loaded in ([0-9.]+) s", err).group(1))
        tps = float(re.search(r"decode steps in [0-9.]+ s \(([0-9.]+) tok/s\)", err).group(1))
        runs[mode].append((load, tps))
# Peak RSS per mode, measured once each in a fresh child (RUSAGE_CHILDREN keeps a maximum).
peak = {}
for mode in ("mmap", "copy"):
    cmd = [tlm, "generate", "-m", gguf, "--ids", "1", "-n", "8", "--temp", "0", "--print-ids",
           "-t", threads] + (["--no-mmap"] if mode == "copy" else [])
    rss = subprocess.run(["/usr/bin/python3", "-c",
        "import resource,subprocess,sys; subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,"
        "stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"]
        + cmd, capture_output=True, text=True).stdout
    peak[mode] = int(rss) * 1024
res = {"model": name, "file_bytes": size, "reps": reps, "tokens": int(n)}
for mode in ("mmap", "copy"):
    res[mode] = {"load_s": statistics.median(l for l, _ in runs[mode]),
                 "decode_tok_s": statistics.median(t for _, t in runs[mode]),
                 "peak_rss_bytes": peak[mode]}
limit = 1.2 * size + 64 * 2**20
res["rss_limit_bytes"] = limit
mb = 2**20
print(f"{name:5s} file {size/mb:7.1f} MiB | mmap: load {res['mmap']['load_s']*1e3:7.1f} ms, "
      f"peak RSS {peak['mmap']/mb:7.1f} MiB (limit {limit/mb:.0f}), decode "
      f"{res['mmap']['decode_tok_s']:7.1f} tok/s | --no-mmap: load {res['copy']['load_s']*1e3:7.1f} ms, "
      f"peak RSS {peak['copy']/mb:7.1f} MiB, decode {res['copy']['decode_tok_s']:7.1f} tok/s",
      file=sys.stderr)
print(json.dumps(res))
EOF
)
  results+=("$out")
done
(IFS=,; echo "[${results[*]}]") >"$ROOT/bench/out/load_memory.json"
echo "# wrote bench/out/load_memory.json"
