import os
import os.path as osp
import re
import shutil
import sys
import warnings
from setuptools import find_packages, setup

try:  # setuptools >= 64 (PEP 660 editable installs)
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # older setuptools install in develop mode
    editable_wheel = None

ROOT = osp.dirname(osp.abspath(__file__))
PACKAGE = 'kcla_mm'
# What `mim search` / `mim download` and mmengine's inferencers read from an
# installed package's `.mim` folder (mmdet ships the same three).
MIM_ITEMS = ('configs', 'tools', 'model-index.yml')


def read_version() -> str:
    namespace: dict = {}
    with open(osp.join(ROOT, 'kcla_mm/version.py'), encoding='utf-8') as f:
        exec(f.read(), namespace)
    return namespace['__version__']


def parse_requirements(name: str) -> list:
    """The requirement lines of ``requirements/<name>``, without comments."""
    with open(osp.join(ROOT, 'requirements', name), encoding='utf-8') as f:
        lines = (line.split('#', 1)[0].strip() for line in f)
        return [line for line in lines if line]


def add_mim_extension() -> None:
    """Puts configs/, tools/ and model-index.yml into ``kcla_mm/.mim``.

    As mmdet's setup.py: symbolic links for an editable install (``pip
    install -e .`` builds ``editable_wheel`` with PEP 660, older pips ran
    ``develop``), so that edits to configs show up without reinstalling;
    real copies for ``sdist``/``bdist_wheel``/``build``, so that they land
    in the archive (package_data and MANIFEST.in pick them up). The folder
    is generated: .gitignore lists it.
    """
    if 'develop' in sys.argv or 'editable_wheel' in sys.argv:
        mode = 'symlink' if os.name != 'nt' else 'copy'
    elif any(
            cmd in sys.argv
            for cmd in ('sdist', 'bdist_wheel', 'build', 'build_py')):
        mode = 'copy'
    else:
        return
    mim_path = osp.join(ROOT, PACKAGE, '.mim')
    os.makedirs(mim_path, exist_ok=True)
    for item in MIM_ITEMS:
        src = osp.join(ROOT, item)
        dst = osp.join(mim_path, item)
        if not osp.exists(src):
            # Building a wheel from an sdist: its .mim already holds copies.
            if osp.exists(dst) and not osp.islink(dst):
                continue
            raise FileNotFoundError(f'{src} is missing: cannot build '
                                    f'{PACKAGE}/.mim/{item}')
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, mim_path), dst)
        elif osp.isdir(src):
            shutil.copytree(
                src,
                dst,
                ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copyfile(src, dst)


#: File names of the OpenMP runtimes torch links: GNU libgomp (pip wheels
#: bundle it as torch/lib/libgomp.so.1 or, renamed by auditwheel,
#: libgomp-<hash>.so.1), Intel's libiomp5 and LLVM's libomp (conda builds).
OPENMP_RUNTIME = re.compile(
    r'^lib(?:gomp|iomp5|omp)(?:-[0-9a-f]+)?\.so(?:\.[0-9]+)*$')


def torch_openmp_runtime():
    """The file of the OpenMP runtime that the running torch's CPU ops use,
    or None where torch does not parallelise with OpenMP or it cannot be
    found (only Linux's /proc/self/maps is read)."""
    import torch
    if 'parallel backend: OpenMP' not in torch.__config__.parallel_info():
        return None
    try:
        with open('/proc/self/maps', encoding='utf-8') as f:
            paths = {
                fields[5]
                for fields in (line.split(None, 5) for line in f)
                if len(fields) == 6 and fields[5].startswith('/')
            }
    except OSError:
        return None
    runtimes = sorted(p.strip() for p in paths
                      if OPENMP_RUNTIME.match(osp.basename(p.strip())))
    # One is mapped after importing torch, normally; should MKL have brought
    # a second, the one inside torch's own folders is the one it links.
    torch_dir = osp.dirname(osp.dirname(osp.abspath(torch.__file__)))
    own = [p for p in runtimes if p.startswith(torch_dir + os.sep)]
    return (own or runtimes or [None])[0]


#: The compile flags of the kernels without OpenMP threads: `omp simd`
#: reductions still vectorise without -ffast-math, no runtime is involved,
#: and every at::parallel_for runs serially.
SERIAL_COMPILE_ARGS = ['-O3', '-fopenmp-simd']


def openmp_build_args():
    """(extra_compile_args, extra_link_args) that make the kernels'
    at::parallel_for run on torch's intra-op threads, as torch's own CPU
    ops do; ``SERIAL_COMPILE_ARGS`` and a warning where they cannot.

    With torch's OpenMP backend, at::parallel_for is inlined from
    ATen/ParallelOpenMP.h as `#pragma omp parallel` under `#ifdef _OPENMP`:
    compiled without -fopenmp it runs the whole range on one thread. The
    module is compiled with -fopenmp but linked to the runtime file torch
    itself loaded, not the compiler's libgomp (what `-fopenmp` at link time
    would add): its symbol versions are checked against the runtime that
    will run them, and the DT_NEEDED entry is that file's SONAME, which the
    dynamic loader finds already loaded by libtorch_cpu (kcla_mm imports
    torch first), so no second OpenMP runtime, with its own thread pool
    and thread count, is loaded. No rpath: the absolute path of the build's
    torch has no place in a wheel.
    """
    runtime = torch_openmp_runtime()
    if runtime is None:
        warnings.warn(
            'kcla_mm: no OpenMP runtime of torch found (torch without its '
            'OpenMP backend, or not Linux): the compiled KCLA kernels are '
            'built without OpenMP and run on one thread')
        return SERIAL_COMPILE_ARGS, []
    return ['-O3', '-fopenmp'], [runtime]


def extension_modules() -> list:
    """The C++ kernels of the compiled KCLA layer (kcla_mm/csrc), where torch
    is importable at build time (setup installs with --no-build-isolation);
    without them kcla_mm runs its pure-PyTorch layer.
    ``KCLA_MM_NO_EXTENSION=1`` skips them."""
    if os.environ.get('KCLA_MM_NO_EXTENSION', '0') not in ('', '0'):
        return []
    try:
        import torch
        from torch.utils.cpp_extension import CppExtension
    except ImportError:
        return []
    # Named after the torch it is built against (kcla_mm loads the one for
    # the running torch): an editable install builds it into the source
    # tree, which CI's two stacks (torch 2.13 and 2.1.2) share.
    major, minor = torch.__version__.split('.')[:2]
    compile_args, link_args = openmp_build_args()
    return [
        CppExtension(
            f'{PACKAGE}._kcla_cpu_t{major}_{minor}',
            [f'{PACKAGE}/csrc/kcla_branch.cpp'],
            extra_compile_args=compile_args,
            extra_link_args=link_args)
    ]


cmdclass = {}
ext_modules = extension_modules()
if ext_modules:
    from torch.utils.cpp_extension import BuildExtension

    class OptionalBuildExtension(BuildExtension):
        """Builds the kernels where it can: a machine without a working
        C++ compiler gets kcla_mm without them (and its pure-PyTorch
        layer), with a warning that says why, not a failed install."""

        def build_extensions(self):
            try:
                super().build_extensions()
                return
            except Exception as exc:  # noqa: B902  compiler errors vary
                error = exc
            if any('-fopenmp' in ext.extra_compile_args
                   for ext in self.extensions):
                # A compiler without -fopenmp (or a runtime it cannot link
                # to): the kernels without threads, rather than none.
                warnings.warn(
                    f'kcla_mm: the compiled KCLA kernels could not be built '
                    f'with OpenMP ({error!r}); building them without it: '
                    'they run on one thread.')
                for ext in self.extensions:
                    ext.extra_compile_args = [
                        arg for arg in ext.extra_compile_args
                        if arg not in ('-O3', '-fopenmp')
                    ] + SERIAL_COMPILE_ARGS
                    ext.extra_link_args = []
                self.force = True  # objects compiled with -fopenmp
                try:
                    super().build_extensions()
                    return
                except Exception as exc:  # noqa: B902
                    error = exc
            warnings.warn(
                f'kcla_mm: the compiled KCLA kernels were not built '
                f'({error!r}); kcla_mm runs its pure-PyTorch layer. '
                'Install a C++ compiler and reinstall to build them.')

    cmdclass['build_ext'] = OptionalBuildExtension

if editable_wheel is not None:

    class EditableWheelWithMim(editable_wheel):
        """``editable_wheel`` whose metadata leads openmim to the source tree.

        openmim 0.3.9 (``mim search`` / ``mim download``) and mmengine's
        ``get_installed_path`` locate a package as
        ``<distribution location>/<top_level.txt's first name>``. A PEP 660
        editable install puts the distribution in site-packages while the
        package stays in the source tree, so they look for
        ``site-packages/kcla_mm/.mim`` and find nothing (the ecosystem's open
        bug, e.g. open-mmlab/mmpretrain#1885). Writing the package's absolute
        path as that name (``os.path.join`` then returns it unchanged) points
        them at ``<repo>/kcla_mm/.mim``; imports are untouched (they go through
        setuptools' editable finder), and regular wheels keep ``kcla_mm``.
        """

        def _ensure_dist_info(self):
            super()._ensure_dist_info()
            top_level = osp.join(self.dist_info_dir, 'top_level.txt')
            with open(top_level, 'w', encoding='utf-8') as f:
                f.write(osp.join(ROOT, PACKAGE) + '\n')

    cmdclass['editable_wheel'] = EditableWheelWithMim

add_mim_extension()

setup(
    name='kcla_mm',
    version=read_version(),
    description='Key-Correlated Layer Attention (KCLA) backbones for '
    'MMDetection and MMSegmentation',
    long_description=open(osp.join(ROOT, 'README.md'),
                          encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['kcla_mm', 'kcla_mm.*']),
    # The generated .mim folder (configs, tools, model index) ships inside
    # the package, as mmdet's does; so do the official Kvasir-SEG split
    # lists (datasets/splits/, read by prepare_kvasir.py).
    include_package_data=True,
    package_data={PACKAGE: ['.mim/**/*', 'datasets/splits/*.txt']},
    exclude_package_data={PACKAGE: ['.mim/**/__pycache__/*']},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    python_requires='>=3.8',
    # Ranges, not pins: kcla_mm installs into its users' OpenMMLab stack.
    # The exact stacks CI tests are requirements/lock-*.txt.
    install_requires=parse_requirements('runtime.txt'),
    extras_require={
        'tests': ['pytest', 'vermin'],
        # Classification (ImageNet / CIFAR pretraining) with MMPretrain.
        'pretrain': parse_requirements('pretrain.txt'),
        # ONNX export and its check in onnxruntime (tools/deployment).
        'deploy': parse_requirements('deploy.txt'),
    },
    license='Apache-2.0',
    zip_safe=False,
)
