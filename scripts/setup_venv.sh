#!/usr/bin/env bash
# Creates (or checks) .venv/ at the repo root with the pinned OpenMMLab stack.
# Re-running on a complete .venv only verifies it: a stamp file records the
# requirements it was built from, so a changed pin triggers a reinstall.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv="$root/.venv"
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null 2>&1 || py=python3
wheels="$root/../shared/wheels"

# The stamp covers everything that decides what gets installed.
stamp_src=$(cat "$root/scripts/setup_venv.sh" "$root/setup.py" "$root/requirements.txt" "$root/requirements-mim.txt")
stamp_hash=$(printf '%s' "$stamp_src" | sha256sum | cut -d' ' -f1)
stamp="$venv/.kcla_mm_setup_done"

verify() {
  "$venv/bin/python" - <<'PY'
import sys
try:
    import mmcv.ops  # noqa: F401  the compiled _ext is loaded on import
    from mmcv.utils import ext_loader
    ext_loader.load_ext('_ext', ['nms'])
except Exception as exc:  # pragma: no cover - install diagnostics
    sys.exit('mmcv was installed without its compiled ops (mmcv._ext failed to '
             f'load: {exc!r}). mmdet needs them for RoIAlign/NMS. Remove .venv and '
             're-run setup; when building from source use MMCV_WITH_OPS=1 '
             'FORCE_CUDA=0 and --no-build-isolation with torch installed first.')
import warnings
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
import torch, mmengine, mmdet, mmseg, mim, matplotlib, kcla_mm  # noqa: F401,E401
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_hash" ] && verify; then
  echo "[setup] .venv is complete (nothing to do)"
  exit 0
fi

echo "[setup] creating/updating $venv"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
# torch first, pinned exactly: 2.13.0 is the CPU build on this machine's disk.
"${pip[@]}" install "torch==2.13.0" "setuptools>=77,<82" wheel
if [ -d "$wheels" ] && ls "$wheels"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
  echo "[setup] mmcv 2.1.0 from $wheels"
  "${pip[@]}" install --no-index --find-links "$wheels" --no-deps "mmcv==2.1.0"
  # mmcv's own dependencies come from the index.
  "${pip[@]}" install "mmengine==0.10.7" "numpy<2" addict packaging Pillow pyyaml yapf opencv-python
else
  echo "[setup] building mmcv 2.1.0 with compiled ops from source (about 20 minutes on 2 cores)"
  MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-2} \
    "${pip[@]}" install --no-build-isolation "mmcv==2.1.0"
fi
# openmim (`mim search` / `mim download`) without its opendatalab dependency:
# opendatalab pulls openxlab, which pins setuptools~=60.2 and would undo the
# setuptools>=77 that torch needs. mim only shells out to opendatalab's CLI for
# `mim download --dataset`, so `pip check` reports exactly one missing
# requirement: "openmim 0.3.9 requires opendatalab".
# One resolver run for both files, so that mim's dependencies (pandas) honour
# the numpy<2 of requirements.txt.
"${pip[@]}" install -r "$root/requirements.txt" -r "$root/requirements-mim.txt"
"${pip[@]}" install --no-deps "openmim==0.3.9"
"${pip[@]}" install --no-deps --no-build-isolation -e "$root"
verify
echo "$stamp_hash" > "$stamp"
echo "[setup] done"
