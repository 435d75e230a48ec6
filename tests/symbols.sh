#!/usr/bin/env bash
# The library's names (ARCHITECTURE.md, "Layers of the code"): every global symbol of libtlm.a is
# either a function that include/ declares (tlm_*) or carries its layer's internal prefix, and no
# file under src/ declares or defines a tlm_ function or type of its own, so that nothing internal
# can be mistaken for the public API or collide with a program's names. The checker first runs on
# a small library and tree with known violations and must report each of them, so that a broken
# checker cannot pass silently.
set -u
SRC_ROOT=${TLM_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
LIB=${TLM_LIB:-$(dirname "${TLM:-./tlm}")/libtlm.a}
CC=${CC:-cc}

# The internal prefixes, one per layer of src/ (cli and dist are linked into the program only).
PREFIXES="core_ io_ k_ mdl_ infer_ trn_ tok_ fmt_ srv_ dist_ cli_"

# C text without comments, strings and character literals, so that neither counts as a name, and
# without the extern "C" braces of headers.
strip_c() {
  /usr/bin/python3 - "$1" <<'EOF'
import re, sys
t = open(sys.argv[1], encoding="utf-8", errors="replace").read()
# C++'s extern "C" { ... } around a header is not a scope
t = re.sub(r'#ifdef __cplusplus\s*\n(extern "C" \{|\})\s*\n#endif', "", t)
t = re.sub(r'/\*.*?\*/|//[^\n]*|"(\\.|[^"\\\n])*"|\'(\\.|[^\'\\\n])*\'',
           lambda m: "\n" * m.group(0).count("\n") if m.group(0)[0] == "/" else '""', t, flags=re.S)
print(t)
EOF
}

# File-scope tlm_ names of one C file, as "KIND NAME": "fn" for a function declared or defined
# (a name followed by '(' outside any braces), "type" for a typedef's name.
file_scope_names() {
  strip_c "$1" | awk '
    cont { cont = /\\$/; next }
    /^[[:space:]]*#/ { cont = /\\$/; next }
    {
      line = $0
      for (i = 1; i <= length(line); i++) {
        ch = substr(line, i, 1)
        if (ch != "{" && ch != "}" && (ch != "t" || depth > 0)) continue
        if (ch == "{") depth++
        else if (ch == "}") {
          depth--
          if (depth == 0 && match(substr(line, i + 1), /^[[:space:]]*tlm_[a-z0-9_]+[[:space:]]*;/)) {
            s = substr(line, i + 1, RLENGTH); gsub(/[[:space:];]/, "", s); print "type " s
          }
        } else if (depth == 0 && match(substr(line, i), /^tlm_[a-z0-9_]+[[:space:]]*\(/) &&
                   (i == 1 || substr(line, i - 1, 1) !~ /[A-Za-z0-9_]/)) {
          s = substr(line, i, RLENGTH); sub(/[[:space:]]*\($/, "", s); print "fn " s
          i += RLENGTH - 1
        } else if (depth == 0 && match(substr(line, i), /^typedef[^;{]*[[:space:]*]tlm_[a-z0-9_]+[[:space:]]*;/) &&
                   (i == 1 || substr(line, i - 1, 1) !~ /[A-Za-z0-9_]/)) {
          s = substr(line, i, RLENGTH); sub(/;$/, "", s); gsub(/.*[[:space:]*]/, "", s); print "type " s
          i += RLENGTH - 1
        }
      }
    }'
}

# check LIB INCLUDE_DIR SRC_DIR: prints one line per violation; returns 1 if any.
check() {
  local lib=$1 inc=$2 src=$3 bad=0 public f kind name sym type
  public=$(for f in "$inc"/tlm.h "$inc"/tlm/*.h; do [ -f "$f" ] && file_scope_names "$f"; done |
    awk '$1 == "fn" {print $2}' | sort -u)
  if [ -z "$public" ]; then
    echo "$inc: no public function found"
    return 1
  fi
  # Every global symbol the archive defines, but the compilers' own (names no C program can write:
  # clang's .gomp_critical_user_* of OpenMP critical sections, reserved __ names of sanitizers).
  while read -r type sym; do
    case $sym in
    .* | __*) ;;
    tlm_*)
      if ! grep -qxF "$sym" <<<"$public"; then
        echo "libtlm.a: $sym is global but include/ declares no such function"
        bad=1
      fi
      ;;
    *)
      local ok=0 p
      for p in $PREFIXES; do [[ $sym == "$p"* ]] && ok=1; done
      if [ $ok -eq 0 ]; then
        echo "libtlm.a: $sym ($type) has none of the internal prefixes ($PREFIXES)"
        bad=1
      fi
      ;;
    esac
  done < <(nm -g --defined-only "$lib" 2>/dev/null | awk 'NF == 3 {print $2, $3}' | sort -u)
  # Internal sources: no tlm_ function or type but the public ones (defined, not redeclared).
  while IFS= read -r f; do
    while read -r kind name; do
      if [[ $f == *.h ]]; then
        echo "${f#"$src"/}: declares $kind $name: internal headers use their layer's prefix"
        bad=1
      elif [ "$kind" = type ] || ! grep -qxF "$name" <<<"$public"; then
        echo "${f#"$src"/}: $kind $name is not in include/: internal names use their layer's prefix"
        bad=1
      fi
    done < <(file_scope_names "$f")
  done < <(find "$src" -type f \( -name '*.c' -o -name '*.h' \) | sort)
  return $bad
}

# Self-test: a library and a tree with one violation of each kind, beside names that must pass.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP"/include/tlm "$TMP"/src/core "$TMP"/src/model
cat >"$TMP/include/tlm.h" <<'EOF'
#include "tlm/base.h"
/* tlm_commented(x) is prose */
EOF
cat >"$TMP/include/tlm/base.h" <<'EOF'
#ifdef __cplusplus
extern "C" {
#endif
typedef struct tlm_model tlm_model;
typedef struct { int x; } tlm_opts;
int tlm_public(int x);
void tlm_opts_defaults(tlm_opts *o);
typedef int (*tlm_callback)(void *user);
#define TLM_CALL(x)                                                                                \
    do {                                                                                           \
        tlm_public(x);                                                                             \
    } while (0)
#ifdef __cplusplus
}
#endif
EOF
cat >"$TMP/src/core/ok.c" <<'EOF'
#include "tlm.h"
struct tlm_model { int n; };
int core_helper(int x) { return tlm_public(x) + 1; }
static const char *s = "tlm_in_a_string(";
int tlm_public(int x) { return x; }
void tlm_opts_defaults(tlm_opts *o) { o->x = core_helper(0); }
EOF
cat >"$TMP/src/core/core.h" <<'EOF'
int core_helper(int x);
int tlm_internal(int x); /* a public-looking internal function */
EOF
cat >"$TMP/src/model/bad.c" <<'EOF'
typedef struct { int y; } tlm_view;
typedef int tlm_index;
static int tlm_local(void) { return 0; }
int read_file(void) { return tlm_local(); }
int tlm_unlisted(void) { return 1; }
int mdl_fine(void) { return 2; }
EOF
printf 'int gguf_open(void) { return 0; }\nint tlm_unlisted(void) { return 1; }\nint _x;\n' >"$TMP/lib.c"
printf 'int core_helper(int x) { return x; }\nint tlm_public(int x) { return x; }\n' >"$TMP/ok_lib.c"
(cd "$TMP" && $CC -c lib.c ok_lib.c && ar rcs libbad.a lib.o ok_lib.o) || {
  echo "FAIL self-test: cannot build the test library with $CC"
  exit 1
}
want=("libtlm.a: gguf_open (T) has none of the internal prefixes"
      "libtlm.a: _x (B) has none of the internal prefixes"
      "libtlm.a: tlm_unlisted is global but include/ declares no such function"
      "core/core.h: declares fn tlm_internal"
      "model/bad.c: type tlm_view is not in include/"
      "model/bad.c: type tlm_index is not in include/"
      "model/bad.c: fn tlm_local is not in include/"
      "model/bad.c: fn tlm_unlisted is not in include/")
got=$(check "$TMP/libbad.a" "$TMP/include" "$TMP/src")
rc=$?
fail=0
if [ $rc -eq 0 ]; then echo "FAIL self-test: the checker passed a tree with violations"; fail=1; fi
for w in "${want[@]}"; do
  if ! grep -qF "$w" <<<"$got"; then echo "FAIL self-test: no report of [$w]"; fail=1; fi
done
for ok in core_helper tlm_public tlm_opts_defaults ok.c tlm_commented tlm_in_a_string mdl_fine; do
  if grep -q "$ok" <<<"$got"; then echo "FAIL self-test: $ok reported: $got"; fail=1; fi
done
[ $fail -eq 0 ] || exit 1

if [ ! -f "$LIB" ]; then
  echo "FAIL: no library at $LIB (set TLM_LIB)"
  exit 1
fi
if ! check "$LIB" "$SRC_ROOT/include" "$SRC_ROOT/src"; then
  echo "FAIL: the names above break the library's naming (tests/symbols.sh, ARCHITECTURE.md)"
  exit 1
fi
echo "symbols: every global symbol of libtlm.a is public (include/) or carries its layer's prefix"
