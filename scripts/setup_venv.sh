#!/usr/bin/env bash
# Creates (or checks) the virtual environment of one development stack:
#
#   bash scripts/setup_venv.sh [main]   .venv/          torch 2.13.0 (CPU build)
#   bash scripts/setup_venv.sh torch21  .venv-torch21/  torch 2.1.2 + torchvision 0.16.2
#
# Every version comes from requirements/lock-STACK.txt (a pip constraint).
# Re-running on a complete venv only verifies it: a stamp file records the
# files it was built from, so a changed pin triggers a reinstall.
#
# mmcv 2.1.0 has no PyPI wheel for either torch: it comes from
# ../shared/wheels/ (main) or ../shared/wheels/torch2.1.2/ (torch21) when
# such a wheel is there, else it is built from source against the stack's
# torch. A source build never reads or writes pip's wheel cache: pip keys a
# wheel it built by the sdist alone, so a wheel built for one torch would
# otherwise be reused for the other and fail to load.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stack=${1:-main}
case "$stack" in
  main)
    venv="$root/.venv"
    torch_pkgs=(torch)
    # mmpretrain imports torchvision, whose PyPI build does not load its
    # ops against this CPU torch: the classification tests skip here.
    extras=()
    wheels="$root/../shared/wheels" ;;
  torch21)
    venv="$root/.venv-torch21"
    torch_pkgs=(torch torchvision)
    extras=(-r "$root/requirements/pretrain.txt")
    wheels="$root/../shared/wheels/torch2.1.2" ;;
  *)
    echo "[setup] unknown stack '$stack': expected main or torch21" >&2
    exit 2 ;;
esac
lock="$root/requirements/lock-$stack.txt"
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null 2>&1 || py=python3

# The stamp covers everything that decides what gets installed.
stamp_src=$(cat "$root/scripts/setup_venv.sh" "$root/scripts/check_mmcv.py" \
  "$root/setup.py" "$lock" "$root"/kcla_mm/csrc/*.cpp \
  "$root/requirements/runtime.txt" "$root/requirements/dev.txt" \
  "$root/requirements/mim.txt" "$root/requirements/pretrain.txt" \
  "$root/requirements/deploy.txt")
stamp_hash=$(printf '%s' "$stamp_src" | sha256sum | cut -d' ' -f1)
stamp="$venv/.kcla_mm_setup_done"

# 0: mmcv's compiled ops load; 1: they do not (why, on stderr); 2: no mmcv.
check_mmcv() {
  "$venv/bin/python" "$root/scripts/check_mmcv.py" "$stack"
}

verify() {
  check_mmcv || return 1
  "$venv/bin/python" - "${extras[@]}" <<'PY'
import sys
import warnings
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
import torch, mmengine, mmdet, mmseg, mim, matplotlib, vermin, kcla_mm  # noqa: F401,E401
import onnx, onnxruntime, onnxscript  # noqa: F401,E401  the deploy extra
if len(sys.argv) > 1:  # the stack has the pretrain extra
    import mmpretrain  # noqa: F401
PY
  # The compiled KCLA kernels (kcla_mm/csrc), built by `pip install -e .`
  # wherever there is a C++ compiler; without one kcla_mm runs its
  # pure-PyTorch layer, and says so here. A build of older sources (its
  # interface number is not the one the Python side calls) counts as none.
  if command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; then
    "$venv/bin/python" -c 'import sys
from kcla_mm.models.layers.kcla.compiled import load_extension
sys.exit(load_extension() is None)' || {
      echo "[setup] $stack: kcla_mm's compiled kernels did not build" >&2
      return 1
    }
  else
    echo "[setup] $stack: no C++ compiler: kcla_mm's compiled kernels are" \
      "not built (the pure-PyTorch layer is used)" >&2
  fi
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_hash" ] && verify; then
  echo "[setup] $stack: $venv is complete (nothing to do)"
  exit 0
fi

echo "[setup] $stack: creating/updating $venv"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
# torch first (mmcv's build imports it), then setuptools and wheel for that
# build, and ninja: without it torch's extension builder compiles one file
# at a time, whatever MAX_JOBS says.
"${pip[@]}" install -c "$lock" "${torch_pkgs[@]}" setuptools wheel ninja
# A broken mmcv (a wheel for another torch, no ops) would stay "already
# satisfied": remove it so that it is installed anew.
status=0
check_mmcv 2>/dev/null || status=$?
if [ "$status" = 1 ]; then
  echo "[setup] the installed mmcv's ops do not load: reinstalling it"
  "${pip[@]}" uninstall -y mmcv
fi
if [ "$status" != 0 ]; then
  if ls "$wheels"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
    echo "[setup] mmcv from $wheels"
    "${pip[@]}" install -c "$lock" --no-index --find-links "$wheels" --no-deps mmcv
  else
    echo "[setup] building mmcv with compiled ops from source for $stack's torch (12-15 minutes on 2 cores)"
    MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-2} \
      "${pip[@]}" install -c "$lock" --no-build-isolation --no-cache-dir \
      --no-binary mmcv --no-deps mmcv
  fi
fi
# openmim (`mim search` / `mim download`) without its opendatalab dependency:
# opendatalab pulls openxlab, which pins setuptools~=60.2 and would undo the
# setuptools>=77 that torch needs. mim only shells out to opendatalab's CLI for
# `mim download --dataset`, so `pip check` reports exactly one missing
# requirement: "openmim 0.3.9 requires opendatalab".
# One resolver run for everything else, within the lock; both stacks have
# the deploy extra (ONNX export, tests/test_export.py).
"${pip[@]}" install -c "$lock" -r "$root/requirements/dev.txt" \
  -r "$root/requirements/mim.txt" -r "$root/requirements/deploy.txt" \
  "${extras[@]}"
"${pip[@]}" install -c "$lock" --no-deps openmim
"${pip[@]}" install --no-deps --no-build-isolation -e "$root"
verify
echo "$stamp_hash" > "$stamp"
echo "[setup] $stack: done"
