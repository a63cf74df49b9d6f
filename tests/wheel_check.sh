#!/usr/bin/env bash
# hopwise.torch as a wheel, as a user installs it (ctest: wheel_install):
#   1. pip wheel --no-build-isolation . from the torch environment: scikit-build-core builds the library and the
#      extension; the wheel is named after that torch (+torchX.Y.Z) and requires exactly it
#   2. a fresh virtual environment that sees torch (a .pth to the torch environment: no second download of several
#      GB) but not the tree: pip install --no-index the wheel, import hopwise.torch from there with no PYTHONPATH,
#      a 2-rank job (python -m torch.distributed.run) allreducing through it
#   3. another torch release refuses it at import, in one line naming both versions
# usage: wheel_check.sh SOURCE_DIR WORK_DIR PYTHON   (PYTHON: the torch environment's interpreter)
set -euo pipefail
src=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
python=$3
rm -rf "$work/dist" "$work/env" "$work/other-torch"
step() { echo "== $*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

step "0. pyproject.toml's build requirements are in frontends/torch/requirements.txt"
# Without isolation pip installs none of them: the torch environment (scripts/setup.sh) must already hold each.
"$python" - "$src/pyproject.toml" "$src/frontends/torch/requirements.txt" <<'PY' || fail "a build requirement is missing"
import re, sys, tomllib
name = lambda req: re.split(r"[<>=!~;\[ ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")
requires = tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]
listed = {name(l.split("#")[0]) for l in open(sys.argv[2]) if l.split("#")[0].strip()}
missing = [r for r in requires if name(r) not in listed]
assert not missing, f"pyproject.toml's [build-system] requires {missing}, which {sys.argv[2]} does not list"
print(f"build requirements listed: {', '.join(requires)}")
PY

step "1. pip wheel --no-build-isolation $src"
# The build directory is kept (build/wheel: pyproject.toml), so a rerun compiles only what changed; on a fresh
# checkout ccache gives it build/'s objects: the same generator, compiler names (pip would name Python's own, which
# ccache hashes apart) and flags (HOPWISE_WERROR passes through), every core.
CC=$(command -v cc) CXX=$(command -v c++) CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$python" -m pip wheel --no-build-isolation --check-build-dependencies --no-deps --disable-pip-version-check \
  -w "$work/dist" "$src" \
  >"$work/wheel.log" 2>&1 || fail "pip wheel: $(tail -30 "$work/wheel.log")"
wheels=("$work"/dist/hopwise-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || fail "no single hopwise wheel in $work/dist: $(ls "$work/dist")"
wheel=${wheels[0]}
torch_release=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
case "${wheel##*/}" in
  hopwise-*+torch${torch_release}-*.whl) echo "wheel: ${wheel##*/}" ;;
  *) fail "the wheel ${wheel##*/} does not name torch $torch_release" ;;
esac
"$python" - "$wheel" "$torch_release" <<'PY' || fail "the wheel's metadata or contents are wrong"
import sys, zipfile
wheel, release = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)
names = z.namelist()
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
requires = [l for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist:")]
assert requires == [f"Requires-Dist: torch=={release}"], requires
assert any(n.startswith("hopwise/torch/_C.") and n.endswith(".so") for n in names), names
assert "hopwise/torch/__init__.py" in names and "hopwise/torch/_build.py" in names, names
print(f"metadata: {requires[0]}; {len(names)} files")
PY

step "2. a fresh virtual environment: pip install the wheel, import, a 2-rank job"
# Without a pip of its own (whose older setuptools would shadow the one torch requires): the torch environment's
# pip installs into it (pip --python).
/usr/bin/python3 -m venv --without-pip "$work/env"
env_site=$("$work/env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$torch_site" >"$env_site/torch-environment.pth"
# No index: the wheel's one dependency (torch==X) must be met by the torch that is there, or the install fails.
"$python" -m pip --python "$work/env/bin/python" install --no-index --disable-pip-version-check "$wheel" \
  >"$work/install.log" 2>&1 || fail "pip install $wheel: $(tail -20 "$work/install.log")"
[ -d "$env_site/hopwise/torch" ] || fail "pip installed the wheel somewhere else than $env_site: $(cat "$work/install.log")"
clean_env=(env -i PATH=/usr/bin:/bin HOME="$work" LANG=C.UTF-8 OMP_NUM_THREADS=1)
(cd "$work" && "${clean_env[@]}" "$work/env/bin/python" -c "
import hopwise.torch, sys
f = hopwise.torch.__file__
print(f'hopwise.torch {hopwise.torch.__version__} imported from {f}')
sys.exit(0 if f.startswith('$env_site/') else f'hopwise.torch came from {f}, not from the fresh environment')") || fail "import hopwise.torch from the fresh environment"
cat >"$work/smoke.py" <<'PY'
import os
import torch, torch.distributed as dist
import hopwise.torch
dist.init_process_group("hopwise")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.arange(1000, dtype=torch.float32) + r
dist.all_reduce(t)
assert torch.equal(t, torch.arange(1000, dtype=torch.float32) * n + n * (n - 1) / 2), f"rank {r}: wrong sum"
if r == 0:
    print(f"hopwise.torch {hopwise.torch.__version__} from {os.path.dirname(hopwise.torch.__file__)}: "
          f"allreduce over {n} ranks ok")
dist.destroy_process_group()
PY
(cd "$work" && "${clean_env[@]}" "$work/env/bin/python" -m torch.distributed.run --standalone --nproc_per_node 2 \
   --redirects 1 --tee 1 "$work/smoke.py" 2>&1 | tee "$work/job.log" | grep "allreduce over 2 ranks ok") ||
  fail "the 2-rank job through the installed wheel failed: $(tail -30 "$work/job.log")"

step "3. another torch release is refused at import"
mkdir -p "$work/other-torch/torch"
echo '__version__ = "2.0.1+cpu"' >"$work/other-torch/torch/__init__.py"
out=$(cd "$work" && "${clean_env[@]}" PYTHONPATH="$work/other-torch" "$work/env/bin/python" -c "import hopwise.torch" 2>&1) &&
  fail "hopwise.torch imported under torch 2.0.1"
echo "$out" | tail -1 | grep -q "was built for torch ${torch_release}.*but this is torch 2.0.1" ||
  fail "the refusal does not name both versions: $out"
echo "refused: $(echo "$out" | tail -1)"
echo "wheel ok: ${wheel##*/}"
