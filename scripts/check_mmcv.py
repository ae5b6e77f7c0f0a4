"""Checks that mmcv's compiled ops load; run by scripts/setup_venv.sh.

    python scripts/check_mmcv.py STACK

Exit status 0: they load; 1: they do not (the likely cause and the command
that clears it on stderr); 2: mmcv is not installed.
"""
import importlib.util
import sys

VENVS = {'main': '.venv', 'torch21': '.venv-torch21'}


def diagnose(error: str, torch_version: str) -> str:
    """The likely cause of an ``mmcv._ext`` that does not load."""
    if 'undefined symbol' in error:
        return (f'it was compiled against another torch than the installed '
                f'{torch_version} (a wheel built for another stack, e.g. '
                "one from pip's wheel cache or from a wheels folder)")
    if "No module named 'mmcv._ext'" in error:
        return ('it was built without its ops (MMCV_WITH_OPS unset, or '
                'mmcv-lite)')
    return 'unknown cause'


def main(stack: str) -> int:
    if importlib.util.find_spec('mmcv') is None:
        return 2
    import torch
    try:
        from mmcv.utils import ext_loader
        ext_loader.load_ext('_ext', ['nms'])
    except Exception as exc:  # noqa: B902  any failure is reported
        error = f'{type(exc).__name__}: {exc}'
        print(
            '[setup] mmcv is installed but its compiled ops (mmcv._ext) do '
            f'not load: {diagnose(error, torch.__version__)}.\n'
            f'  {error[:300]}\n'
            'mmdet needs them for RoIAlign/NMS. Setup reinstalls mmcv; to '
            'clear everything by hand: `pip cache remove mmcv; rm -rf '
            f'{VENVS.get(stack, ".venv")}; bash scripts/setup_venv.sh '
            f'{stack}` (a source build runs with MMCV_WITH_OPS=1 '
            'FORCE_CUDA=0 --no-build-isolation --no-cache-dir, torch '
            'installed first).',
            file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else 'main'))
