# The harness of the shell tests (tests/*.sh), sourced first by each of them:
#   . "$(dirname "$0")/lib.sh"
# It sets TLM (the program: $TLM, else build/tlm of this checkout), SRC (the repository), DATA
# (the shared test data: $TLM_SHARED_DATA, else ../shared/data next to the repository) and TMP (a
# directory of the test's own under $TMPDIR, removed at exit unless KEEP_TMP is set), so a test
# writes nothing in the tree whatever directory it runs from. Checks count with ok/bad/expect and
# the test ends with `finish`; die stops at once. Run by itself (ctest runs every tests/*.sh), the
# file tests its own helpers (at the end).

set -u
T_NAME=$(basename "$0" .sh)
SRC=${TLM_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TLM=${TLM:-$SRC/build/tlm}
DATA=${TLM_SHARED_DATA:-$SRC/../shared/data}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tlm-$T_NAME.XXXXXX")
T_PASS=0 T_FAIL=0
T_PIDS=() # background processes still to stop at exit

t_cleanup() {
    local p
    for p in "${T_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    if [ -n "${KEEP_TMP:-}" ]; then
        echo "$T_NAME: files kept in $TMP" >&2
    else
        rm -rf "$TMP"
    fi
}
trap t_cleanup EXIT

ok() { T_PASS=$((T_PASS + 1)); }
bad() { # MESSAGE: a failed check; the test goes on
    T_FAIL=$((T_FAIL + 1))
    echo "FAIL: $*" >&2
}
die() { # MESSAGE: a failed check that ends the test
    echo "FAIL: $*" >&2
    exit 1
}
expect() { # DESCRIPTION COMMAND...: a check that COMMAND succeeds
    local d=$1
    shift
    if "$@"; then ok; else bad "$d"; fi
}
skip() { # MESSAGE: the test cannot run here (ctest's SKIP_RETURN_CODE)
    echo "SKIP: $*"
    exit 77
}
finish() { # the summary line; succeeds when every check passed and there was one at least
    echo "$T_NAME: $T_PASS passed, $T_FAIL failed"
    [ "$T_FAIL" -eq 0 ] && [ "$T_PASS" -gt 0 ]
}

need() { # FILE...: the shared test data the test reads
    local f
    for f in "$@"; do
        [ -e "$f" ] || die "the shared test data is missing: no $f"
    done
}

# capture COMMAND...: runs it with its output in $TMP/stdout and $TMP/stderr; sets RC, OUT, ERR.
capture() {
    "$@" >"$TMP/stdout" 2>"$TMP/stderr"
    RC=$?
    OUT=$(cat "$TMP/stdout")
    ERR=$(cat "$TMP/stderr")
}

# refuses DESCRIPTION PATTERN COMMAND...: the command fails (not by a timeout) with one line on
# stderr that matches the grep PATTERN.
refuses() {
    local d=$1 pat=$2
    shift 2
    capture "$@"
    expect "$d: non-zero exit (got $RC)" test "$RC" -ne 0 -a "$RC" -ne 124
    expect "$d: one line ($ERR)" test "$(printf '%s\n' "$ERR" | wc -l)" -eq 1 -a -n "$ERR"
    expect "$d: names the problem ($ERR)" grep -q -- "$pat" <<<"$ERR"
}

# wait_until SECONDS COMMAND...: polls COMMAND (in this shell, so it may set variables) every
# 0.05 s until it succeeds; fails when the time runs out.
wait_until() {
    local i n=$(($1 * 20))
    shift
    for ((i = 0; i < n; i++)); do
        "$@" && return 0
        sleep 0.05
    done
    return 1
}

# holds EXPRESSION NAME=VALUE...: whether the awk expression holds for these values (numbers).
holds() {
    local e=$1 args=() v
    shift
    for v in "$@"; do args+=(-v "$v"); done
    awk "${args[@]}" "BEGIN { exit !($e) }"
}

# json_get EXPRESSION [FILE]: a Python expression over the JSON of FILE (else stdin), bound to j;
# a string prints as it is, anything else as JSON.
json_get() {
    /usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin)
v = eval(sys.argv[1], {"j": j})
print(v if isinstance(v, str) else json.dumps(v))' "$@"
}

# log_col RUNDIR KEY: "step value" for each line of a training run's log.jsonl that has KEY.
log_col() { sed -n "s/.*\"step\": \([0-9]*\).*\"$2\": \([-0-9.e]*\).*/\1 \2/p" "$1/log.jsonl"; }

# toy_text FILE: 300 lines of a few repeated sentences, text that a tiny model learns in seconds.
toy_text() {
    local i
    for i in $(seq 1 300); do echo "the cat sat on the mat. a dog ran to the log. $((i % 7))"; done >"$1"
}

# node_run SCRIPT ARGS...: a client of tests/node (node-llama-cpp, the openai package, Chromium),
# run from there so that it finds its modules.
node_run() { (cd "$SRC/tests/node" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node "$@"); }

# Run rather than sourced (ctest runs every tests/*.sh), the file checks its own helpers: each must
# be able to fail.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    # each case in a subshell of its own, from zero
    out=$( (T_PASS=0 T_FAIL=0; ok; expect "a false command" false; finish) 2>&1)
    expect "a failed check fails the test" test $? -ne 0
    expect "... and is named ($out)" grep -q "^FAIL: a false command$" <<<"$out"
    expect "... and counted ($out)" grep -q "1 passed, 1 failed$" <<<"$out"
    ( (T_PASS=0 T_FAIL=0; ok; expect "true" true; finish) >/dev/null)
    expect "passed checks pass" test $? -eq 0
    ( (T_PASS=0 T_FAIL=0; finish) >/dev/null)
    expect "no check at all fails" test $? -ne 0
    (T_PASS=0 T_FAIL=0; die "stop" 2>/dev/null; ok; finish >/dev/null)
    expect "die ends the test" test $? -eq 1
    refused() { (T_PASS=0 T_FAIL=0; refuses "x" "$@" >/dev/null 2>&1; finish >/dev/null); }
    refused "bad" sh -c 'echo "a bad thing" >&2; exit 3'
    expect "refuses: one line naming it" test $? -eq 0
    refused "bad" sh -c 'echo "a bad thing" >&2; echo more >&2; exit 3'
    expect "refuses: two lines" test $? -ne 0
    refused "bad" sh -c 'echo "a good thing" >&2; exit 3'
    expect "refuses: another message" test $? -ne 0
    refused "bad" sh -c 'echo "a bad thing" >&2'
    expect "refuses: success" test $? -ne 0
    expect "holds" holds "a < b" a=1.5 b=2e0
    expect "holds can fail" test "$(holds "a < b" a=2 b=1.5; echo $?)" = 1
    expect "json_get" test "$(json_get 'j["a"][1]' <<<'{"a": [1, {"b": "c"}]}')" = '{"b": "c"}'
    echo '{"x": "y"}' >"$TMP/j.json"
    expect "json_get of a file" test "$(json_get 'j["x"]' "$TMP/j.json")" = y
    mkdir "$TMP/run"
    printf '{"step": 1, "train_loss": 2.5}\n{"step": 2, "train_loss": 2e-1, "val_loss": 3}\n' \
        >"$TMP/run/log.jsonl"
    expect "log_col" test "$(log_col "$TMP/run" train_loss | tr '\n' ,)" = "1 2.5,2 2e-1,"
    expect "log_col of a sparse key" test "$(log_col "$TMP/run" val_loss)" = "2 3"
    n=0
    count_to_3() { n=$((n + 1)) && [ $n -ge 3 ]; }
    expect "wait_until" wait_until 1 count_to_3
    expect "wait_until gives up" test "$(wait_until 1 false; echo $?)" = 1
    dir=$(bash -c ". '${BASH_SOURCE[0]}'; echo \$TMP")
    expect "a temporary directory ($dir), removed at exit" test -n "$dir" -a ! -e "$dir"
    finish
fi
