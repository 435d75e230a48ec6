#!/usr/bin/env bash
# A build for any x86-64 (cmake -DTLM_NATIVE=OFF) runs on CPUs without AVX: its objects hold AVX
# instructions only in functions compiled for them (target attributes: the quantized kernels, and
# the _avx2/_avx512 versions of K_VERSIONS), and `tlm info`, `tlm train`, `tlm quantize`,
# `tlm generate` and `tlm eval` run under QEMU's user-mode emulation of older CPUs: Nehalem (no
# AVX), qemu64 (SSE3 alone) and Haswell (AVX2, no AVX-512), each evaluating a model trained here to
# the same loss. Skips (exit 77) for a -march=native or a sanitizer build, without qemu-x86_64
# (Debian's qemu-user, which scripts/setup.sh installs), or off x86-64.
set -u
TLM=${TLM:-build/tlm}
BUILD_DIR=$(cd "$(dirname "$TLM")" && pwd)
SRC=${TLM_SOURCE_DIR:-.}
DATA=${TLM_SHARED_DATA:-$SRC/../shared/data}
if [ "$(uname -m)" != x86_64 ]; then
    echo "SKIP: not an x86-64 machine"
    exit 77
fi
if ! grep -q '^TLM_NATIVE:BOOL=OFF' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
    echo "SKIP: $BUILD_DIR is a -march=native build (TLM_NATIVE=ON)"
    exit 77
fi
if grep -Eq '^TLM_(SANITIZE|TSAN):BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
    echo "SKIP: a sanitizer build (qemu-user cannot map its shadow memory: the emulator is killed)"
    exit 77
fi
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    echo "SKIP: no qemu-x86_64 (Debian's qemu-user; scripts/setup.sh installs it)"
    exit 77
fi
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() { local d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- where AVX instructions are --------------------------------------------------------------------
# Every function of the library's and the program's objects that holds an instruction of AVX or
# later (VEX and EVEX encodings: mnemonics from v, mask registers, AMX tiles). Such a function must
# be a K_VERSIONS version (name ending _avx2 or _avx512), or lie in a file that gives functions
# target attributes of its own (K_TARGET_ or target(...)), whose callers check the CPU first.
own_targets() { # SOURCE_NAME: 0 when that file under src/ sets target attributes itself
    local f
    f=$(find "$SRC/src" -name "$1" | head -1)
    [ -n "$f" ] && grep -Eq 'K_TARGET_|__attribute__\(\(target\(' "$f"
}
objs=$(find "$BUILD_DIR/CMakeFiles/tlm.dir" "$BUILD_DIR/CMakeFiles/tlm_cli.dir" -name '*.o')
expect "objects to check in $BUILD_DIR" test -n "$objs"
avx_funcs=0 stray=0
for o in $objs; do
    src_name=$(basename "$o" .o)
    # "FUNCTION" for each function holding such an instruction, once
    funcs=$(objdump -d --no-show-raw-insn "$o" | awk '
        /^[0-9a-f]+ <.*>:$/ { f = substr($2, 2, length($2) - 3); next }
        /\t(v[a-z0-9]+|k[a-z]+[bwdq]|ldtilecfg|sttilecfg|tile[a-z0-9]+|tdp[a-z0-9]+) / ||
        /%[yz]mm|%k[0-7]|%tmm/ { if (!(f in seen)) { seen[f] = 1; print f } }')
    [ -n "$funcs" ] || continue
    own=1
    own_targets "$src_name" && own=0
    for f in $funcs; do
        avx_funcs=$((avx_funcs + 1))
        case $f in
        *_avx2 | *_avx512 | *_avx2.* | *_avx512.*) ;;
        *) if [ $own -ne 0 ]; then
            bad "$src_name: $f holds AVX instructions outside a target-attributed function"
            stray=$((stray + 1))
        fi ;;
        esac
    done
done
expect "no AVX outside target-attributed functions ($stray stray of $avx_funcs)" test $stray -eq 0
# K_VERSIONS compiled its versions (the loops of training and inference, for AVX2 and AVX-512)
expect "K_VERSIONS versions in the library" test \
    "$(objdump -t "$BUILD_DIR/libtlm.a" 2>/dev/null | grep -Ec ' (rmsnorm_rows|act_grad_span|adamw_span)_avx(2|512)$')" -eq 6

# --- the program on older CPUs ------------------------------------------------------------------
# tlm re-executes itself to set libgomp's spin count unless a wait policy is set, and a re-executed
# program would leave the emulator: the policy keeps it in.
export OMP_WAIT_POLICY=passive
# qemu64 says its vendor is AMD, and OpenBLAS then picks kernels with 3DNow! (femms), which it
# lacks: OpenBLAS gets its SSE3 kernels by name there.
on() { # CPU COMMAND...: COMMAND on the CPU's instruction sets (here: this machine's)
    local cpu=$1; shift
    case $cpu in
    here) timeout 600 "$@" ;;
    qemu64) OPENBLAS_CORETYPE=Prescott timeout 600 qemu-x86_64 -cpu qemu64 "$@" ;;
    *) timeout 600 qemu-x86_64 -cpu "$cpu" "$@" ;;
    esac
}
STORIES=$DATA/models/stories260K.gguf
expect "the shared data's $STORIES" test -f "$STORIES"
head -c 12000 "$DATA/text/tinyshakespeare.txt" >"$tmp/train.txt"
tail -c 600 "$tmp/train.txt" >"$tmp/val.txt"
cat >"$tmp/cfg.json" <<'JSON'
{"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2}
JSON
# A model trained here, which every CPU evaluates, and stories260K (a real model) quantized here.
expect "tlm train" "$TLM" train -c "$tmp/cfg.json" --data "$tmp/train.txt" --char -o "$tmp/model" \
    --steps 20 --batch 4 --warmup 2 --eval-interval 10 --eval-batches 2 --precision fp32 -t 2 \
    >/dev/null 2>&1
for t in q8_0 q4_k_m; do
    expect "tlm quantize $t" "$TLM" quantize "$STORIES" "$tmp/stories-$t.gguf" --type $t \
        >/dev/null 2>&1
done
loss() { # CPU: tlm eval's loss of the trained model on the held-out text
    on "$1" "$TLM" eval -m "$tmp/model" --data "$tmp/val.txt" -t 2 --json 2>/dev/null |
        sed -nE 's/.*"loss": *([0-9.eE+-]+).*/\1/p'
}
greedy() { # CPU MODEL: the ids of a greedy continuation
    on "$1" "$TLM" generate -m "$2" -p "Once upon a time" -n 12 --temp 0 -t 2 --print-ids \
        2>/dev/null | head -1
}
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(a != "" && b != "" && (d < 0 ? -d : d) <= 1e-4 * b) }'; }
ref_loss=$(loss here)
expect "tlm eval gives a loss here ($ref_loss)" test -n "$ref_loss"
declare -A ref_ids
for m in "$STORIES" "$tmp/stories-q8_0.gguf" "$tmp/stories-q4_k_m.gguf"; do
    ref_ids[$m]=$(greedy here "$m")
    expect "greedy ids here from $(basename "$m")" test "$(wc -w <<<"${ref_ids[$m]}")" -ge 12
done

# Nehalem: SSE4.2, no AVX; qemu64: SSE3; Haswell: AVX2 (the _avx2 versions, the quantized kernels'
# AVX2 level), about 20x slower under emulation than SSE, hence its shorter training.
for cpu in Nehalem qemu64 Haswell; do
    expect "$cpu: tlm info" grep -q 'total' <<<"$(on "$cpu" "$TLM" info -m "$STORIES" 2>/dev/null)"
    steps=4
    [ "$cpu" = Haswell ] && steps=2
    expect "$cpu: tlm train" on "$cpu" "$TLM" train -c "$tmp/cfg.json" --data "$tmp/train.txt" \
        --char -o "$tmp/run-$cpu" --steps $steps --batch 2 --seq-len 16 --warmup 1 \
        --eval-interval $steps --eval-batches 1 -t 2 >"$tmp/train-$cpu.log" 2>&1
    expect "$cpu: fp32 products (no AVX-512 BF16)" grep -q 'precision: fp32' "$tmp/train-$cpu.log"
    l=$(loss "$cpu")
    expect "$cpu: tlm eval's loss ($l) is this machine's ($ref_loss)" near "$l" "$ref_loss"
    for m in "$STORIES" "$tmp/stories-q8_0.gguf" "$tmp/stories-q4_k_m.gguf"; do
        ids=$(greedy "$cpu" "$m")
        expect "$cpu: tlm generate from $(basename "$m"): the ids generated here ($ids)" \
            test "$ids" = "${ref_ids[$m]}"
    done
    # the quantizers write the same bytes on every CPU (llama-quantize's)
    on "$cpu" "$TLM" quantize "$STORIES" "$tmp/$cpu.gguf" --type q4_k_m >/dev/null 2>&1
    expect "$cpu: tlm quantize q4_k_m writes this machine's bytes" \
        cmp -s "$tmp/$cpu.gguf" "$tmp/stories-q4_k_m.gguf"
done
echo "portable: $pass passed, $fail failed"
[ $fail -eq 0 ]
