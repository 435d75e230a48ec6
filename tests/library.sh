#!/usr/bin/env bash
# docs/library.md's program against the INSTALLED library: cmake --install into a temporary
# prefix, the page's ```c block compiled with only what pkg-config gives for tlm.pc, then run on a
# model it creates and on a model file (checking what it prints). So the installed headers, the
# archive, tlm.pc's link flags and the page's code all keep working.
set -u
SRC=${TLM_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=$(cd "$(dirname "${TLM:-./tlm}")" && pwd)
CC=${CC:-cc}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! cmake --install "$BUILD" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log" >&2
  echo "FAIL: cmake --install $BUILD" >&2
  exit 1
fi
for f in lib/libtlm.a include/tlm.h include/tlm/base.h include/tlm/model.h lib/pkgconfig/tlm.pc; do
  [ -f "$tmp/prefix/$f" ] && ok || bad "installed $f"
done

export PKG_CONFIG_PATH=$tmp/prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs tlm) && ok || bad "pkg-config --cflags --libs tlm"
for want in -ltlm -lopenblas -ldnnl -lcjson -lm -pthread; do
  grep -qw -- "$want" <<<"$flags" && ok || bad "tlm.pc's flags lack $want: $flags"
done

# The first ```c block of the page, as it is written there.
awk '/^```c$/ {on = 1; next} on && /^```$/ {exit} on' "$SRC/docs/library.md" >"$tmp/prog.c"
[ -s "$tmp/prog.c" ] && ok || bad "docs/library.md has no \`\`\`c block"
# Nothing from the source tree: the include path is the installed one only.
# shellcheck disable=SC2086
if $CC -std=c11 -Wall -Wextra -Werror -O2 "$tmp/prog.c" $flags -o "$tmp/prog" 2>"$tmp/cc.log"; then
  ok
else
  cat "$tmp/cc.log" >&2
  bad "the page's program does not compile against the installed library"
fi

if [ -x "$tmp/prog" ]; then
  out=$(cd "$tmp" && ./prog 2>&1); rc=$?
  printf '%s\n' "$out"
  [ $rc -eq 0 ] && ok || bad "program (created model) exits $rc"
  grep -qE '^model: [0-9]+ parameters, 2 layers, vocabulary 64$' <<<"$out" && ok ||
    bad "model line"
  grep -qE '^generated:( [0-9]+){8}$' <<<"$out" && ok || bad "8 generated ids"
  ids=$(sed -n 's/^generated: //p' <<<"$out")
  for id in $ids; do [ "$id" -lt 64 ] || bad "id $id outside the vocabulary"; done
  # GPT-2's initialization starts near ln(64) = 4.159; one step lowers the loss
  read -r before after < <(sed -nE 's/^loss ([0-9.]+) -> ([0-9.]+) after 1 step .*/\1 \2/p' <<<"$out")
  if [ -n "${before:-}" ] && awk -v b="$before" -v a="$after" \
       'BEGIN { exit !(b > 3.9 && b < 4.4 && a < b) }'; then
    ok
  else
    bad "loss line: $(grep '^loss' <<<"$out")"
  fi

  data=${TLM_SHARED_DATA:-$SRC/../shared/data}
  model=$data/models/stories260K.bin
  if [ -f "$model" ]; then
    out=$(cd "$tmp" && ./prog "$model" 2>&1); rc=$?
    printf '%s\n' "$out"
    [ $rc -eq 0 ] && ok || bad "program on $model exits $rc"
    grep -qE '^model: [0-9]+ parameters, 5 layers, vocabulary 512$' <<<"$out" && ok ||
      bad "stories260K's model line"
    grep -qE '^generated:( [0-9]+){8}$' <<<"$out" && ok || bad "8 ids from stories260K"
  else
    bad "no $model (scripts/setup.sh puts the shared data next to the repository)"
  fi
  out=$(cd "$tmp" && ./prog /nonexistent/model.gguf 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "tlm_model_load" <<<"$out" && ok ||
    bad "a missing model file: exit $rc, $out"
fi

echo "library: $pass passed, $fail failed"
[ $fail -eq 0 ]
