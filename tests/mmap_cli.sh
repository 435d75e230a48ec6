#!/usr/bin/env bash
# Files used in place: a short generation from an F32 model file (llama2.c .bin, GGUF, tlm
# safetensors) keeps its peak resident memory within 1.2 x the file + 64 MiB, because the weights
# are the file's own pages (read-only mmap), not a copy. --no-mmap (a copy) must exceed the file
# size, which shows the measure can fail.
. "$(dirname "$0")/lib.sh"
set -eo pipefail

# ~118 MB of F32 weights: dim 512, hidden 1376, 8 layers, vocab 8000, context 256.
/usr/bin/python3 "$SRC/bench/formats/random_llama2c.py" "$TMP/m.bin" 512 1376 8 8 8000 256
"$TLM" convert "$TMP/m.bin" "$TMP/m.gguf" --to gguf 2>/dev/null
"$TLM" convert "$TMP/m.bin" "$TMP/tlmdir" --to safetensors 2>/dev/null

# Peak resident set (KiB) of a command, from the kernel's accounting of the finished child.
peak_kib() {
  /usr/bin/python3 - "$@" <<'EOF'
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
if r.returncode:
    sys.stderr.write(r.stderr.decode()); sys.exit(1)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
for line in r.stderr.decode().splitlines():
    if line.startswith("model:"): sys.stderr.write(line + "\n")
EOF
}

check() { # label model-path file-bytes
  local label=$1 model=$2 bytes=$3
  local limit=$(( (bytes * 12 / 10 + 64 * 1048576) / 1024 ))
  local rss copy
  rss=$(peak_kib "$TLM" generate -m "$model" --ids "1 2 3" -n 8 --temp 0 --print-ids -t 2)
  copy=$(peak_kib "$TLM" generate -m "$model" --ids "1 2 3" -n 8 --temp 0 --print-ids -t 2 --no-mmap)
  echo "$label: file $((bytes / 1048576)) MiB; peak RSS $((rss / 1024)) MiB in place (limit $((limit / 1024)) MiB), $((copy / 1024)) MiB with --no-mmap"
  [ "$rss" -le "$limit" ] || die "$label: peak RSS $rss KiB exceeds $limit KiB"
  [ "$copy" -gt $((bytes / 1024)) ] || die "$label: --no-mmap should hold a copy ($copy KiB)"
  # The weights are the file's pages: every byte of every tensor is used in place.
  local report
  report=$("$TLM" generate -m "$model" --ids 1 -n 1 --temp 0 --print-ids 2>&1 >/dev/null)
  [[ $report == *"MiB of weights used in place, 0."?" MiB in memory"* ]] ||
    die "$label: weights were copied: $report"
  ok
}

check "llama2.c .bin" "$TMP/m.bin" "$(stat -c %s "$TMP/m.bin")"
check "GGUF" "$TMP/m.gguf" "$(stat -c %s "$TMP/m.gguf")"
check "tlm safetensors" "$TMP/tlmdir" "$(stat -c %s "$TMP/tlmdir/model.safetensors")"

# --no-mmap reads a quantized file into memory in its own type (it used to widen it to F32: four
# times the memory): the report names the copy, and the peak stays near the file's size.
"$TLM" quantize "$TMP/m.gguf" "$TMP/q8.gguf" --type q8_0 >/dev/null 2>&1
q8=$(stat -c %s "$TMP/q8.gguf")
rss=$(peak_kib "$TLM" generate -m "$TMP/q8.gguf" --ids "1 2 3" -n 8 --temp 0 --print-ids -t 2 --no-mmap)
limit=$(( (q8 * 12 / 10 + 64 * 1048576) / 1024 ))
echo "Q8_0 --no-mmap: file $((q8 / 1048576)) MiB; peak RSS $((rss / 1024)) MiB (limit $((limit / 1024)) MiB)"
[ "$rss" -le "$limit" ] || die "Q8_0 --no-mmap: peak RSS $rss KiB exceeds $limit KiB"
report=$("$TLM" generate -m "$TMP/q8.gguf" --ids 1 -n 1 --temp 0 --print-ids --no-mmap 2>&1 >/dev/null)
[[ $report == *"MiB of weights read into 2 MiB pages, 0."?" MiB in memory"* ]] ||
  die "Q8_0 --no-mmap: weights converted: $report"
a=$("$TLM" generate -m "$TMP/q8.gguf" --ids "1 2 3" -n 8 --temp 0 --print-ids 2>/dev/null)
b=$("$TLM" generate -m "$TMP/q8.gguf" --ids "1 2 3" -n 8 --temp 0 --print-ids --no-mmap 2>/dev/null)
[ "$a" = "$b" ] || die "Q8_0 mapped and read generate differently: $a / $b"
# tlm bench reads by default (as tlm serve), maps with --mmap, and says which in its JSON.
for flag in "" --mmap; do
  u=$("$TLM" bench -m "$TMP/q8.gguf" -p 0 -n 2 -r 1 -t 1 -o json $flag |
    json_get 'j[0]["use_mmap"]')
  want=false
  [ -n "$flag" ] && want=true
  [ "$u" = "$want" ] || die "bench $flag: use_mmap $u, want $want"
done

# The same tokens either way.
a=$("$TLM" generate -m "$TMP/m.gguf" --ids "1 2 3" -n 8 --temp 0 --print-ids 2>/dev/null)
b=$("$TLM" generate -m "$TMP/m.gguf" --ids "1 2 3" -n 8 --temp 0 --print-ids --no-mmap 2>/dev/null)
[ "$a" = "$b" ] || die "mapped and copied models generate differently: $a / $b"
ok
finish
