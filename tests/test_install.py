"""The installed stack: locked versions, compiled mmcv ops, idempotent setup,
and the package's requirements as a library."""
import importlib.metadata as metadata
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from helpers import ROOT, dynamic_symbols

# Checks of the installed environment rather than of kcla_mm's code: in an
# environment other than the two locked stacks, `pytest -m "not env"`.
pytestmark = pytest.mark.env

STACKS = ('main', 'torch21')


def read_lock(stack):
    """``{name: version}`` of the ``==`` pins of
    requirements/lock-STACK.txt."""
    pins = {}
    with open(osp.join(ROOT, 'requirements', f'lock-{stack}.txt')) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line:
                req = Requirement(line)
                (spec, ) = req.specifier
                assert spec.operator == '==', line
                pins[req.name.lower()] = spec.version
    return pins


def running_stack():
    """The development stack whose torch this interpreter has."""
    torch_version = Version(torch.__version__).public
    stacks = [s for s in STACKS if read_lock(s)['torch'] == torch_version]
    assert len(stacks) == 1, (
        f'torch {torch.__version__} is the torch of no lock file: run the '
        'suite in .venv/ (make test) or .venv-torch21/ (make test-compat)')
    return stacks[0]


def test_installed_versions_are_the_locked_ones():
    stack = running_stack()
    wrong = {}
    for name, version in read_lock(stack).items():
        try:
            installed = Version(metadata.version(name)).public
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f'{stack}: (locked, installed) differ: {wrong}'


def test_both_locks_pin_the_stacks_they_name():
    main, torch21 = read_lock('main'), read_lock('torch21')
    core = ('mmengine', 'mmcv', 'mmdet', 'mmsegmentation')
    assert main['torch'] == '2.13.0' and 'torchvision' not in main
    assert (torch21['torch'], torch21['torchvision']) == ('2.1.2', '0.16.2')
    for lock in (main, torch21):
        assert [lock[n] for n in core] == ['0.10.7', '2.1.0', '3.3.0', '1.2.2']
        assert Version(lock['numpy']) < Version('2')
    # The pretrain extra needs torchvision: only the torch 2.1.2 stack has
    # it, and test_installed_versions_are_the_locked_ones checks it is
    # installed there (its tests would otherwise skip unnoticed).
    assert 'mmpretrain' not in main and torch21['mmpretrain'] == '1.2.0'


def test_pretrain_extra_admits_the_locked_mmpretrain():
    requires = [Requirement(r) for r in metadata.requires('kcla_mm')]
    extra = [
        r for r in requires
        if r.marker is not None and r.marker.evaluate({'extra': 'pretrain'})
    ]
    assert [r.name for r in extra] == ['mmpretrain']
    assert extra[0].specifier.contains(read_lock('torch21')['mmpretrain'])


def test_deploy_extra_admits_both_locks():
    """The deploy extra (ONNX export) is in both stacks: both locks pin
    what requirements/deploy.txt asks for (read from the file: the
    installed metadata may come from another checkout)."""
    with open(osp.join(ROOT, 'requirements', 'deploy.txt')) as f:
        deploy = [
            Requirement(line) for line in f.read().splitlines()
            if line and not line.startswith('#')
        ]
    assert [r.name for r in deploy] == ['onnx', 'onnxruntime', 'onnxscript']
    for stack in STACKS:
        lock = read_lock(stack)
        assert all(r.specifier.contains(lock[r.name]) for r in deploy), stack


# In a fresh interpreter: mmpretrain itself, then what ``import kcla_mm``
# puts into its MODELS (kcla_mm warns instead of failing when mmpretrain is
# installed but broken, so the warning is looked for too).
PRETRAIN_PROBE = """
import json, warnings
warnings.simplefilter('always')
with warnings.catch_warnings(record=True) as caught:
    import mmpretrain
    import kcla_mm
from mmpretrain.registry import MODELS
names = ('KCLAResNet', 'LAResNet', 'MRLALightResNet', 'ResNetCIFAR',
         'KCLAResNetCIFAR', 'LAResNetCIFAR', 'MRLALightResNetCIFAR')
print(json.dumps(dict(
    version=mmpretrain.__version__,
    registered={n: getattr(MODELS.get(n), '__module__', None) for n in names},
    warnings=[str(w.message) for w in caught if 'mmpretrain' in
              str(w.message)])))
"""


def test_pretrain_extra_is_importable_where_the_lock_has_it():
    """The classification tests skip where mmpretrain is not installed
    (tests/helpers.requires_mmpretrain). In the torch 2.1.2 stack, whose
    lock pins it, it must import at the locked version and hold kcla_mm's
    backbones after ``import kcla_mm``, so that a broken install fails
    here instead of hiding behind those skips; in the main stack, whose
    lock has no mmpretrain, the skips are the expected ones."""
    from helpers import HAS_MMPRETRAIN
    lock = read_lock(running_stack())
    assert HAS_MMPRETRAIN == ('mmpretrain' in lock)
    if not HAS_MMPRETRAIN:
        return
    result = subprocess.run([sys.executable, '-c', PRETRAIN_PROBE],
                            capture_output=True,
                            text=True,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found['version'] == lock['mmpretrain']
    assert found['warnings'] == []
    unregistered = {
        name: module
        for name, module in found['registered'].items()
        if module is None or not module.startswith('kcla_mm.')
    }
    assert not unregistered, f'not kcla_mm backbones: {unregistered}'


def test_library_requirements_are_ranges_that_admit_both_stacks():
    requires = [Requirement(r) for r in metadata.requires('kcla_mm')]
    runtime = [r for r in requires if r.marker is None]
    names = {r.name for r in runtime}
    assert {
        'torch', 'mmengine', 'mmcv', 'mmdet', 'mmsegmentation', 'numpy',
        'pycocotools'
    } <= names
    assert 'setuptools' not in names
    assert not [
        r for r in runtime if any(s.operator == '==' for s in r.specifier)
    ]
    assert metadata.metadata('kcla_mm')['Requires-Python'] == '>=3.8'
    for stack in STACKS:
        lock = read_lock(stack)
        refused = [
            f'{r} refuses {lock[r.name]}' for r in runtime
            if not r.specifier.contains(lock[r.name], prereleases=True)
        ]
        assert not refused, f'{stack}: {refused}'


def test_mmcv_compiled_ops_run_on_cpu():
    from mmcv.ops import RoIAlign, nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.],
                          [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    _, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2]
    feats = torch.arange(16.).view(1, 1, 4, 4)
    rois = torch.tensor([[0., 0., 0., 3., 3.]])
    out = RoIAlign((2, 2), spatial_scale=1., sampling_ratio=2)(feats, rois)
    assert out.shape == (1, 1, 2, 2) and torch.isfinite(out).all()


@pytest.mark.slow
def test_rerunning_setup_changes_nothing():

    def freeze():
        return subprocess.run([sys.executable, '-m', 'pip', 'freeze'],
                              capture_output=True,
                              text=True,
                              check=True).stdout

    stack = running_stack()
    before = freeze()
    result = subprocess.run(
        ['bash', osp.join(ROOT, 'scripts/setup_venv.sh'), stack],
        capture_output=True,
        text=True)
    assert result.returncode == 0, result.stderr
    assert 'nothing to do' in result.stdout
    assert freeze() == before


def test_setup_refuses_an_unknown_stack():
    result = subprocess.run(
        ['bash', osp.join(ROOT, 'scripts/setup_venv.sh'), 'torch3'],
        capture_output=True,
        text=True)
    assert result.returncode == 2
    assert "unknown stack 'torch3'" in result.stderr


def vermin(*paths):
    # vermin has no __main__: its console script sits beside the interpreter.
    return subprocess.run([
        osp.join(osp.dirname(sys.executable), 'vermin'), '-t=3.8-',
        '--no-tips', '--violations', '--eval-annotations', *paths
    ],
                          capture_output=True,
                          text=True,
                          cwd=ROOT)


def test_package_and_tools_run_on_python_3_8():
    result = vermin('kcla_mm', 'tools')
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    'code',
    [
        'x = "a.pth".removesuffix(".pth")\n',  # 3.9
        'def f(x: list[int]) -> None:\n    pass\n',  # 3.9 in annotations
        'match 1:\n    case _:\n        pass\n',  # 3.10
    ])
def test_vermin_check_catches_newer_python(tmp_path, code):
    (tmp_path / 'newer.py').write_text(code)
    result = vermin(str(tmp_path))
    assert result.returncode != 0 and 'newer.py' in result.stdout


def build_wheel(tmp_path, env=None):
    """A wheel of a copy of the source tree (without the kernels built in
    place), built as a user would, and pip's output."""
    source = tmp_path / 'src'
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns('.git', '.venv*', '.mim', 'work_dirs',
                                      'data', 'build', 'dist', '*.egg-info',
                                      '__pycache__', '.pytest_cache',
                                      '_kcla_cpu_t*.so'))
    command = [
        sys.executable, '-m', 'pip', '--disable-pip-version-check', 'wheel',
        '--no-deps', '--no-build-isolation', '-w',
        str(tmp_path / 'dist'),
        str(source)
    ]
    environ = dict(os.environ, **(env or {}))
    result = subprocess.run(
        command, env=environ, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel, ) = (tmp_path / 'dist').glob('kcla_mm-*.whl')
    return wheel, result.stdout + result.stderr


def extension_files(wheel):
    major, minor = torch.__version__.split('.')[:2]
    with zipfile.ZipFile(wheel) as archive:
        return [
            name for name in archive.namelist()
            if name.startswith(f'kcla_mm/_kcla_cpu_t{major}_{minor}.')
        ]


@pytest.mark.slow
def test_wheel_installs_into_this_stack_and_replaces_nothing(tmp_path):
    """As a user of this stack would: the wheel's requirements are met by
    what is installed, so pip would add kcla_mm and touch nothing else
    (with exact pins it would have replaced torch, breaking mmcv's ops);
    the C++ compiler that CI's machines have built the KCLA kernels into it,
    for this torch."""
    wheel, _ = build_wheel(tmp_path)
    assert shutil.which('c++') or shutil.which('g++'), 'no C++ compiler'
    assert len(extension_files(wheel)) == 1
    with zipfile.ZipFile(wheel) as archive:  # package data
        assert {
            f'kcla_mm/datasets/splits/kvasir_seg_official_{split}.txt'
            for split in ('train', 'val')
        } <= set(archive.namelist())
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check']
    result = subprocess.run(
        pip + [
            'install', '--dry-run', '--no-index', '--quiet', '--report', '-',
            str(wheel)
        ],
        capture_output=True,
        text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert [i['metadata']['name'] for i in report['install']] == ['kcla_mm']


def check_mmcv(stack, pythonpath=None):
    env = dict(os.environ)
    if pythonpath:
        env['PYTHONPATH'] = str(pythonpath)
    return subprocess.run(
        [sys.executable,
         osp.join(ROOT, 'scripts/check_mmcv.py'), stack],
        capture_output=True,
        text=True,
        env=env)


def test_setup_check_passes_the_installed_mmcv():
    result = check_mmcv(running_stack())
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    'error, cause',
    [
        # What the loader raised for an mmcv built against torch 2.1.2 under
        # torch 2.13 (a wheel from pip's cache).
        ('ImportError("/x/mmcv/_ext.cpython-311-x86_64-linux-gnu.so: '
         'undefined symbol: _ZN2at4_ops10zeros_like4callE")',
         'compiled against another torch than the installed'),
        ('ModuleNotFoundError("No module named \'mmcv._ext\'")',
         'built without its ops'),
    ])
def test_setup_check_names_the_cause_of_broken_mmcv_ops(
        tmp_path, error, cause):
    # An mmcv whose extension loader fails as the real one does.
    utils = tmp_path / 'mmcv' / 'utils'
    utils.mkdir(parents=True)
    (tmp_path / 'mmcv' / '__init__.py').write_text('')
    (utils / '__init__.py').write_text('')
    (utils / 'ext_loader.py'
     ).write_text(f'def load_ext(name, funcs):\n    raise {error}\n')
    result = check_mmcv('torch21', pythonpath=tmp_path)
    assert result.returncode == 1
    assert cause in result.stderr
    assert ('pip cache remove mmcv; rm -rf .venv-torch21; bash '
            'scripts/setup_venv.sh torch21') in result.stderr


def test_wheel_builds_without_a_compiler(tmp_path):
    """No working C++ compiler: the install still succeeds, without the
    kernels, and says why (kcla_mm then runs its pure-PyTorch layer)."""
    wheel, output = build_wheel(
        tmp_path, env=dict(CXX='/nonexistent/c++', CC='/nonexistent/cc'))
    assert extension_files(wheel) == []
    assert 'the compiled KCLA kernels were not built' in output


@pytest.mark.slow
def test_wheel_builds_serial_kernels_without_openmp(tmp_path):
    """A compiler without -fopenmp (Apple's clang, say): the kernels are
    still built, without OpenMP (their at::parallel_for then runs on one
    thread), and the output says so."""
    compiler = shutil.which('c++') or shutil.which('g++')
    assert compiler, 'no C++ compiler'
    wrapper = tmp_path / 'c++-without-openmp'
    wrapper.write_text(
        '#!/bin/sh\n'
        'for arg in "$@"; do\n'
        '  if [ "$arg" = -fopenmp ]; then\n'
        '    echo "c++: error: unsupported option \'-fopenmp\'" >&2\n'
        '    exit 1\n'
        '  fi\n'
        'done\n'
        f'exec {compiler} "$@"\n')
    wrapper.chmod(0o755)
    wheel, output = build_wheel(tmp_path, env=dict(CXX=str(wrapper)))
    assert 'could not be built with OpenMP' in output
    (name, ) = extension_files(wheel)
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(name, tmp_path / 'unpacked')
    _, undefined = dynamic_symbols(tmp_path / 'unpacked' / name)
    assert 'GOMP_parallel' not in undefined


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason='a GPU is visible: there the lane runs (make test-gpu), and this '
    'test checks its refusal where none is')
def test_gpu_lane_refuses_to_pass_without_a_gpu():
    """Without a GPU every test of the lane would skip and pytest would
    exit 0: the lane of this interpreter's stack stops before pytest,
    saying why."""
    target = {'main': 'test-gpu', 'torch21': 'test-gpu-compat'}
    result = subprocess.run(
        ['make', '--no-print-directory', target[running_stack()]],
        capture_output=True,
        text=True,
        cwd=ROOT)
    assert result.returncode != 0, result.stdout[-2000:]
    assert 'sees no GPU, so every test of the GPU lane would skip' in \
        result.stderr, result.stderr[-2000:]
    assert '-m pytest' not in result.stdout
