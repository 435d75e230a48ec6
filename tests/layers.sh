#!/usr/bin/env bash
# The layering of src/ (../shared/DESIGN.md): every `#include "folder/..."` in a folder of src/
# must name that folder or one it may depend on, and a header called *_internal.h may only be
# included from its own folder. The checker first runs on a small tree with known violations and
# must report each of them, so that a broken checker cannot pass silently.
. "$(dirname "$0")/lib.sh"

# folder -> the other folders it may include from (cli may include everything)
declare -A ALLOWED=(
  [core]=""
  [io]="core"
  [kernels]="core"
  [model]="core kernels"
  [infer]="core kernels model"
  [train]="core io kernels model"
  [tokenizer]="core io"
  [formats]="core io kernels model tokenizer"
  [dist]="core"
  [serve]="core"
  [cli]="*"
)

# check_tree SRC_DIR: prints "FILE: #include "X" ..." for each violation; returns 1 if any.
check_tree() {
  local src=$1 bad=0 file rel folder line inc target allowed
  while IFS= read -r file; do
    rel=${file#"$src"/}
    folder=${rel%%/*}
    if [ "$folder" = "$rel" ]; then
      echo "$rel: files belong in a folder of src/"
      bad=1
      continue
    fi
    if [ -z "${ALLOWED[$folder]+x}" ]; then
      echo "$rel: folder '$folder' is not in the layering table of tests/layers.sh"
      bad=1
      continue
    fi
    allowed=${ALLOWED[$folder]}
    while IFS= read -r line; do
      inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*)".*/\1/' <<<"$line")
      case $inc in
      ../* | */../* | /*)
        echo "$rel: #include \"$inc\": include by folder name, not by relative or absolute path"
        bad=1
        continue
        ;;
      */*) target=${inc%%/*} ;;
      *) continue ;; # tlm.h or a header of the same folder
      esac
      if [ "$target" != "$folder" ]; then
        if [[ "$inc" == *_internal.h ]]; then
          echo "$rel: #include \"$inc\": an _internal.h header is private to $target/"
          bad=1
          continue
        fi
        if [ -z "${ALLOWED[$target]+x}" ]; then
          echo "$rel: #include \"$inc\": '$target' is not a folder of src/"
          bad=1
        elif [ "$allowed" != "*" ] && [[ " $allowed " != *" $target "* ]]; then
          echo "$rel: #include \"$inc\": $folder/ may not depend on $target/" \
            "(allowed: ${allowed:-nothing but itself})"
          bad=1
        fi
      fi
    done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file")
  done < <(find "$src" -type f \( -name '*.c' -o -name '*.h' \) | sort)
  return $bad
}

# Self-test on a tree with one violation of each kind, and clean files that must pass.
mkdir -p "$TMP"/src/{core,io,tokenizer,formats,cli,model}
printf '#include "core/core.h"\n#include "tlm.h"\n' >"$TMP/src/io/ok.c"
printf '#include "io/gguf.h"\n#include "tok_internal.h"\n' >"$TMP/src/tokenizer/ok.c"
printf '#include "tokenizer/tok_gguf.h"\n#include "model/model.h"\n' >"$TMP/src/cli/ok.c"
printf '#include "model/x_internal.h"\n' >"$TMP/src/cli/private.c"
printf '#include "formats/gguf.h"\n' >"$TMP/src/tokenizer/up.c"
printf '  #  include "tokenizer/tok_internal.h"\n' >"$TMP/src/formats/private.c"
printf '#include "../core/core.h"\n' >"$TMP/src/model/relative.c"
printf '#include "nowhere/x.h"\n' >"$TMP/src/core/unknown.h"
want=("tokenizer/up.c: #include \"formats/gguf.h\""
      "formats/private.c: #include \"tokenizer/tok_internal.h\""
      "cli/private.c: #include \"model/x_internal.h\""
      "model/relative.c: #include \"../core/core.h\""
      "core/unknown.h: #include \"nowhere/x.h\"")
got=$(check_tree "$TMP/src")
expect "self-test: the checker fails a tree with violations" test $? -ne 0
for w in "${want[@]}"; do
  expect "self-test: a report of [$w]" grep -qF "$w" <<<"$got"
done
if grep -q "/ok.c" <<<"$got"; then bad "self-test: allowed includes reported: $got"; else ok; fi
[ $T_FAIL -eq 0 ] || { finish; exit; }

expect "includes above break the layering of src/ (table in tests/layers.sh)" check_tree "$SRC/src"
finish
