#!/usr/bin/env bash
# The README's quickstarts, run as a newcomer runs them (ctest: readme_quickstarts). The README marks which fenced
# blocks run, on the line before each fence:
#   <!-- quickstart: NAME -->           a shell block: run with bash, from the repository root as it looks to a
#                                       newcomer (a scratch directory whose entries are the source tree's, `build`
#                                       being this build tree), each block in a fresh shell, set -e
#   <!-- quickstart-compile: NAME -->   a C++ block: the same text as examples/NAME.cpp, which the build links
#                                       (a shell block runs it), and compiled here against the source headers
#   <!-- quickstart-syntax: NAME -->    a Python block: parsed (a fragment of a trainer, not a whole program)
# and every relative link of the README must name a file of the tree.
# usage: quickstart_check.sh SOURCE_DIR BUILD_DIR [--skip NAME]... [--venv DIR]
#   --skip NAME   leave block NAME out, saying so (the torch block where the PyTorch backend is not built)
#   --venv DIR    the torch environment (what scripts/venv.sh runs: HOPWISE_VENV)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
shift 2
skip=()
while [ $# -gt 0 ]; do
  case $1 in
    --skip) skip+=("$2"); shift 2 ;;
    --venv) export HOPWISE_VENV=$2; shift 2 ;;
    *) echo "quickstart_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
readme="$src/README.md"
work="$build/quickstart"
rm -rf "$work"
mkdir -p "$work/blocks" "$work/root"
fail() { echo "FAILED: $*" >&2; exit 1; }

# The marked blocks, one file each (NAME.sh, NAME.cpp, NAME.py), in README order, listed in blocks/order.
awk -v dir="$work/blocks" '
  match($0, /^<!-- quickstart(-compile|-syntax)?: [A-Za-z0-9_-]+ -->$/) {
    kind = $0; sub(/^<!-- quickstart/, "", kind); sub(/:.*/, "", kind)
    name = $0; sub(/^<!-- quickstart[a-z-]*: /, "", name); sub(/ -->$/, "", name)
    ext = kind == "-compile" ? "cpp" : kind == "-syntax" ? "py" : "sh"
    pending = 1; next
  }
  pending && /^```/ { pending = 0; inside = 1; file = dir "/" name "." ext; print name "." ext >> (dir "/order"); next }
  pending { print "quickstart_check: the marker of " name " is not followed by a fence" > "/dev/stderr"; exit 3 }
  inside && /^```/ { inside = 0; close(file); next }
  inside { print > file }
' "$readme" || fail "README.md's quickstart markers are malformed"
[ -s "$work/blocks/order" ] || fail "README.md marks no quickstart block (<!-- quickstart: NAME --> before a fence)"
echo "blocks: $(tr '\n' ' ' <"$work/blocks/order")"

# Every relative link of the README names a file or folder of the tree.
missing=0
while IFS= read -r link; do
  path=${link%%#*}
  [ -z "$path" ] && continue
  if [ ! -e "$src/$path" ]; then
    echo "README.md links to $path, which is not in the tree" >&2
    missing=1
  fi
done < <(grep -o '](\([^)]*\))' "$readme" | sed 's/^](//; s/)$//' | grep -v '^[a-z]*://')
[ "$missing" -eq 0 ] || fail "README.md has broken links"
echo "links: ok"

# The repository root as a newcomer sees it after scripts/build.sh: the source tree, with build/ this build tree.
for entry in "$src"/* "$src"/.[!.]*; do
  [ -e "$entry" ] || continue
  name=$(basename "$entry")
  [ "$name" = build ] || ln -s "$entry" "$work/root/$name"
done
ln -s "$build" "$work/root/build"
# As scripts/test.sh does for the whole suite: mpirun may start as root and place more ranks than cores.
# shellcheck source=scripts/mpi-env.sh
. "$src/scripts/mpi-env.sh"
export OMP_NUM_THREADS=1

skipped() { local n; for n in "${skip[@]+"${skip[@]}"}"; do [ "$n" = "$1" ] && return 0; done; return 1; }
includes=()
for layer in common topology compression comm training sim; do
  [ -d "$src/$layer/include" ] && includes+=(-I "$src/$layer/include")
done
summary=()
while IFS= read -r file <&3; do
  name=${file%.*}
  block="$work/blocks/$file"
  if skipped "$name"; then
    echo "== $name: skipped (--skip $name)"
    summary+=("$name skipped")
    continue
  fi
  start=$(date +%s%N)
  case $file in
    *.cpp)
      echo "== $name: the C++ block is examples/$name.cpp, and compiles against the source headers"
      cmp -s "$block" "$src/examples/$name.cpp" ||
        fail "the README's C++ block '$name' differs from examples/$name.cpp (the program the build links and runs)"
      mpicxx -std=c++20 -fsyntax-only -Wall -Wextra "${includes[@]}" -x c++ "$block" ||
        fail "the README's C++ block '$name' does not compile"
      ;;
    *.py)
      echo "== $name: parsing the Python block"
      python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$block" ||
        fail "the README's Python block '$name' does not parse"
      # What it calls on the averager (avg = hopwise.torch.ModelAverager(...)) is a method ModelAverager has.
      python3 - "$block" "$src/frontends/torch/hopwise/torch/averaging.py" <<'PY' || fail "the README's Python block '$name' calls what ModelAverager lacks"
import ast, sys
block, module = (ast.parse(open(f).read(), f) for f in sys.argv[1:3])
cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "ModelAverager")
methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
used = {n.attr for n in ast.walk(block)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "avg"}
assert used <= methods, f"avg.{sorted(used - methods)} is not a method of ModelAverager"
PY
      ;;
    *.sh)
      echo "== $name:"
      sed 's/^/   $ /' "$block"
      (cd "$work/root" && timeout 240 bash -euo pipefail "$block" </dev/null) ||
        fail "the README's quickstart '$name' failed (exit $?)"
      ;;
  esac
  tenths=$((($(date +%s%N) - start) / 100000000))
  echo "== $name: ok in $((tenths / 10)).$((tenths % 10)) s"
  summary+=("$name $((tenths / 10)).$((tenths % 10)) s")
done 3<"$work/blocks/order"
# The averager's quickstart shows every call a trainer makes of it: around each step, and the full average.
for call in before_step after_step full_average; do
  cat "$work"/blocks/*.py 2>/dev/null | grep -q "avg\.$call()" ||
    fail "the README's Python blocks never call avg.$call() (the averager's quickstart must show it)"
done
[ "${#summary[@]}" -eq "$(wc -l <"$work/blocks/order")" ] ||
  fail "only ${#summary[@]} of the $(wc -l <"$work/blocks/order") blocks were taken in turn"
echo "quickstarts ok: ${summary[*]}"
