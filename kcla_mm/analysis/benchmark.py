# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""KCLAResNet against mmdet's ResNet of the same depth: latency, the
activation memory of a train step and its peak memory growth (of the
tensors, and on the CPU of the process's resident set).

The models are measured in one run, alternating iteration by iteration
(:func:`kcla_mm.analysis.timing.alternating_runs`) so that machine noise
hits them alike: in one process, or each in a process of its own
(:class:`ModelProcess`). Speed is a measurement, not a test: nothing here
asserts.

Memory is measured per model in a fresh process
(:func:`train_step_memory_in_subprocess`, this module run with ``-m``), and
so may be whole timing runs (:func:`time_section_in_subprocess`).
"""
import ast
import gc
import importlib.util
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmdet.models.backbones import ResNet

from ..models import KCLAResNet
from .complexity import saved_activation_bytes, train_step_allocated_peak
from .timing import (Step, alternating_runs, eval_step, model_runners,
                     timed_step, train_step)

MODES = ('eval', 'train')

#: The benchmark settings: input sizes (N, C, H, W) of an eval forward and
#: of a train step, and the backbone arguments of the train step (the same
#: for every model). 'imagenet': the classification recipe's crops, every
#: BN learning and updating its statistics. 'detection': an 800x1216 image
#: (the 1333x800 resize of a 3:2 COCO image such as 640x427, 1199x800,
#: padded to 32) in eval and 512x512 crops at batch 2 in training, with the
#: backbone arguments of mmdet's Faster R-CNN configs (stem and stage 1
#: frozen, BN statistics frozen).
SETTINGS = {
    'imagenet':
    dict(
        eval_shape=(1, 3, 224, 224),
        train_shape=(8, 3, 224, 224),
        backbone=dict(norm_eval=False, frozen_stages=-1)),
    'detection':
    dict(
        eval_shape=(1, 3, 800, 1216),
        train_shape=(2, 3, 512, 512),
        backbone=dict(norm_eval=True, frozen_stages=1)),
}

#: The ResNet depths the benchmark tools take (mmdet's).
DEPTHS = tuple(sorted(ResNet.arch_settings))

#: The backbone arguments of each setting (the memory targets' train
#: settings).
TRAIN_SETTINGS = {name: s['backbone'] for name, s in SETTINGS.items()}


def setting_shapes(setting: str,
                   eval_batch: Optional[int] = None,
                   train_batch: Optional[int] = None,
                   size: Optional[int] = None) -> List[Tuple[int, ...]]:
    """[eval shape, train shape] of ``setting`` (:data:`SETTINGS`), with the
    batches and the square input size given where given."""
    shapes = []
    for key, batch in (('eval_shape', eval_batch), ('train_shape',
                                                    train_batch)):
        n, c, h, w = SETTINGS[setting][key]
        if batch is not None:
            n = batch
        if size is not None:
            h = w = size
        shapes.append((n, c, h, w))
    return shapes


#: The depths the official model is compared at: ``imagenet/kcla_resnet.py``
#: of github bgx666/KCLA builds ResNet-50 and -101; its ``resnet18_kcla`` is
#: four Bottleneck blocks, not ResNet-18's eight basic ones.
OFFICIAL_DEPTHS = (50, 101)


def official_constructor_name(depth: int) -> str:
    """The function of the official file that builds ``depth`` (one of
    :data:`OFFICIAL_DEPTHS`): ``resnet50_kcla``, ``resnet101_kcla``."""
    return f'resnet{depth}_kcla'


def official_file_problem(path: str, depths: Sequence[int]) -> Optional[str]:
    """Why ``path`` cannot give the official model at every one of
    ``depths`` (the message names ``--official``), or None. Reads the
    file's top-level functions without running it, so that a bad option
    is refused before the first measurement."""
    if not osp.isfile(path):
        return f'--official {path}: no such file'
    unmatched = sorted(set(depths) - set(OFFICIAL_DEPTHS))
    if unmatched:
        return (f'--official compares at --depth 50 and 101 only (the '
                f"official file's model of another depth is not mmdet's "
                f'ResNet of that depth), not at '
                f'{", ".join(map(str, unmatched))}')
    try:
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, UnicodeDecodeError) as error:
        return f'--official {path}: not a Python file ({error})'
    defined = {
        node.name
        for node in tree.body if isinstance(node, ast.FunctionDef)
    }
    missing = [
        official_constructor_name(d) for d in depths
        if official_constructor_name(d) not in defined
    ]
    if missing:
        found = sorted(n for n in defined if n.endswith('_kcla'))
        return (f'--official {path} has no {"(), ".join(missing)}() (it '
                f'has: {", ".join(found) or "none"})')
    return None


def load_official(path: str, depth: int) -> nn.Module:
    """The official ImageNet KCLA-ResNet of ``depth`` from the user's copy
    of its file (github bgx666/KCLA ``imagenet/kcla_resnet.py``, which
    needs only torch), with its fc replaced by the identity: the
    comparison is of backbones (the average pool stays, a few
    microseconds)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'--official {path}: no such file')
    spec = importlib.util.spec_from_file_location('official_kcla_resnet', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = official_constructor_name(depth)
    if not hasattr(module, name):
        found = sorted(n for n in vars(module) if n.endswith('_kcla'))
        raise ValueError(f'--official {path} has no {name}() for depth '
                         f'{depth} (it has: {", ".join(found) or "none"})')
    model = getattr(module, name)()
    if isinstance(getattr(model, 'fc', None), nn.Module):
        model.fc = nn.Identity()
    return model


def model_names(implementations: Sequence[str],
                official: bool = False) -> List[str]:
    """The names :func:`build_model` takes: ``'resnet'``, ``'kcla:<impl>'``
    per implementation (``<impl>`` may end in ``+keep-outputs``:
    ``kcla_recompute_outputs=False``) and ``'official'``."""
    names = ['resnet'] + [f'kcla:{impl}' for impl in implementations]
    return names + ['official'] if official else names


def official_has_setting(setting: str) -> bool:
    """Whether the official model can run a train step of ``setting``: it
    has no frozen stages and no ``norm_eval``, so only the ImageNet one.
    Its eval forward is the same in every setting."""
    return SETTINGS[setting]['backbone'] == SETTINGS['imagenet']['backbone']


def build_model(name: str,
                depth: int,
                setting: str = 'imagenet',
                official: Optional[str] = None) -> nn.Module:
    """One model of :func:`model_names`, initialised (on the CPU), with the
    backbone arguments of ``setting``; ``'official'`` is loaded from the
    file ``official`` (:func:`load_official`)."""
    common = dict(depth=depth, **SETTINGS[setting]['backbone'])
    if name == 'resnet':
        model = ResNet(**common)
    elif name.startswith('kcla:'):
        impl, plus, option = name[len('kcla:'):].partition('+')
        if plus and option != 'keep-outputs':
            raise ValueError(f'unknown model {name!r}')
        model = KCLAResNet(
            **common,
            kcla_implementation=impl,
            kcla_recompute_outputs=not plus)
    elif name == 'official':
        return load_official(official, depth)  # it inits itself
    else:
        raise ValueError(f'unknown model {name!r}')
    model.init_weights()
    return model


def memory_format_of(channels_last: bool) -> torch.memory_format:
    """The models' and inputs' memory format: channels_last or NCHW."""
    return torch.channels_last if channels_last else torch.contiguous_format


def seeded_model(name: str, depth: int, setting: str, official: Optional[str],
                 device: str, memory_format: torch.memory_format) -> nn.Module:
    """The one model of a fresh measuring process (:func:`measure_one`,
    :func:`serve_steps`): :func:`build_model` after ``torch.manual_seed(0)``,
    on ``device`` in ``memory_format``."""
    torch.manual_seed(0)
    model = build_model(name, depth, setting, official)
    model.to(device, memory_format=memory_format)
    return model


def build_models(
        depth: int,
        device: str = 'cpu',
        memory_format: torch.memory_format = torch.contiguous_format,
        kcla_implementation: str = 'auto',
        setting: str = 'imagenet',
        official: Optional[str] = None,
        implementations: Optional[Sequence[str]] = None
) -> Dict[str, nn.Module]:
    """``{'resnet': ResNet, 'kcla': KCLAResNet}`` of ``depth``, initialised
    with seed 0 and moved to ``device`` in ``memory_format``; KCLAResNet's
    ``kcla_implementation`` as given.

    ``setting`` is one of :data:`SETTINGS`, the same for all. With
    ``implementations``, one KCLAResNet per implementation, named
    ``'kcla:<impl>'``, instead of ``'kcla'``. With ``official`` (a path,
    see :func:`load_official`) the official model is added as
    ``'official'``.
    """
    torch.manual_seed(0)
    if implementations is None:
        names = {'resnet': 'resnet', 'kcla': f'kcla:{kcla_implementation}'}
    else:
        names = {n: n for n in model_names(implementations)}
    if official is not None:
        names['official'] = 'official'
    models = {}
    for key, name in names.items():
        models[key] = build_model(name, depth, setting, official)
        models[key].to(device, memory_format=memory_format)
    return models


def random_steps(eval_shape: Sequence[int], train_shape: Sequence[int],
                 device: str,
                 memory_format: torch.memory_format) -> Dict[str, Step]:
    """``{'eval': ..., 'train': ...}``: an eval forward and a train step
    (:mod:`kcla_mm.analysis.timing`) on random inputs of the given shapes,
    on ``device`` in ``memory_format``."""
    x_eval, x_train = (
        torch.randn(*shape,
                    device=device).contiguous(memory_format=memory_format)
        for shape in (eval_shape, train_shape))
    return {'eval': eval_step(x_eval), 'train': train_step(x_train)}


def time_modes(
    runners: Dict[str, Callable[[str], float]],
    modes: Sequence[str] = MODES,
    warmup: int = 3,
    repeats: int = 15,
    train_models: Optional[Sequence[str]] = None
) -> Dict[Tuple[str, str], List[float]]:
    """Seconds per iteration of each (model name, mode).

    One mode at a time, so that eval rounds do not run between train
    steps; within a mode the models alternate.

    Args:
        runners (dict[str, Callable[[str], float]]): By model name, a
            function that runs one step of that model in the mode it is
            given (``'eval'`` or ``'train'``) and returns its seconds: in
            this process (:func:`kcla_mm.analysis.timing.timed_step`) or in
            the model's own (:meth:`ModelProcess.step`).
        modes (Sequence[str]): ``'eval'`` and/or ``'train'``.
        warmup (int): Untimed rounds per mode. Defaults to 3.
        repeats (int): Timed rounds per mode. Defaults to 15.
        train_models (Sequence[str], optional): The models that take part
            in the train rounds; all by default.

    Returns:
        dict[tuple[str, str], list[float]]: ``repeats`` times for each
        (model name, mode).
    """
    results: Dict[Tuple[str, str], List[float]] = {}
    for mode in MODES:
        if mode not in modes:
            continue
        timed = {
            name: runner
            for name, runner in runners.items()
            if mode == 'eval' or train_models is None or name in train_models
        }
        results.update(alternating_runs(timed, [mode], warmup, repeats))
    return results


def time_section(
        depth: int,
        setting: str,
        eval_shape: Sequence[int],
        train_shape: Sequence[int],
        threads: int,
        modes: Sequence[str] = MODES,
        warmup: int = 3,
        repeats: int = 15,
        device: str = 'cpu',
        channels_last: bool = False,
        official: Optional[str] = None,
        implementations: Sequence[str] = ('auto', ),
        process_per_model: bool = False) -> Dict[Tuple[str, str], List[float]]:
    """One run of benchmark_backbone.py's timings: the models of
    :func:`build_models` (``'resnet'``, ``'kcla:<impl>'`` per
    implementation, ``'official'`` with ``official``) at ``threads``
    intra-op threads, timed by :func:`time_modes` on random inputs of the
    given shapes; the official model takes part in train steps only where
    :func:`official_has_setting`. All in this process, or with
    ``process_per_model`` each model in a fresh process of its own
    (:func:`model_processes`)."""
    names = model_names(implementations, official is not None)
    timing = dict(
        modes=modes,
        warmup=warmup,
        repeats=repeats,
        train_models=[
            n for n in names
            if n != 'official' or official_has_setting(setting)
        ])
    if process_per_model:
        with model_processes(
                names,
                depth=depth,
                setting=setting,
                eval_shape=eval_shape,
                train_shape=train_shape,
                threads=threads,
                device=device,
                channels_last=channels_last,
                official=official) as processes:
            return time_modes({
                n: p.step
                for n, p in processes.items()
            }, **timing)
    torch.set_num_threads(threads)
    memory_format = memory_format_of(channels_last)
    models = build_models(
        depth,
        device,
        memory_format,
        setting=setting,
        official=official,
        implementations=implementations)
    steps = random_steps(eval_shape, train_shape, device, memory_format)
    return time_modes(model_runners(models, steps, device), **timing)


def _run_module(spec: Dict, what: str) -> str:
    """The last line printed by this module run with ``-m`` and ``spec``
    in a fresh Python process (the same interpreter and environment)."""
    result = subprocess.run([sys.executable, '-m', __name__,
                             json.dumps(spec)],
                            capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise RuntimeError(f'{what} failed:\n{result.stderr[-3000:]}')
    # The official constructors print; the result is the last line.
    return result.stdout.strip().splitlines()[-1]


def time_section_in_subprocess(**kwargs) -> Dict[Tuple[str, str], List[float]]:
    """:func:`time_section` (same arguments) in a fresh Python process: one
    of several independent runs, each with its own memory layout, its own
    oneDNN primitives and its own stretch of machine noise."""
    # JSON's keys are strings: (name, mode) travels as 'name|mode'.
    times = json.loads(
        _run_module(dict(kwargs, measure='timing'), 'timing run'))
    return {tuple(key.split('|')): value for key, value in times.items()}


# Models that alternate in one process (time_section) share glibc's heap:
# what one step frees, the other's next step reuses or finds trimmed away,
# so which model pays the page faults of growing the heap again depends on
# the pair, not only on the model (docs/benchmarks.md, "Models sharing a
# process"). A ModelProcess holds one model, as a user's process does, and
# the rounds still alternate between the processes; but each process also
# brings its own memory layout, which on the project's VM moved the eval
# ratio between runs far more than sharing a process did, so the tools
# keep one process by default.
class ModelProcess:
    """One model of :func:`build_model` in a fresh Python process (this
    module with ``-m``, running :func:`serve_steps`), with its inputs,
    running one step when asked: ``step('eval')`` or ``step('train')``
    returns the seconds the step took in that process
    (:func:`kcla_mm.analysis.timing.timed_step`).

    Args:
        name (str): The model (:func:`model_names`).
        **spec: The other arguments of :func:`serve_steps` (``depth``,
            ``setting``, ``eval_shape``, ``train_shape``, ``threads``, ...),
            by keyword; one it does not take fails the process, named by
            :meth:`wait_ready`.
    """

    def __init__(self, name: str, **spec):
        self.name = name
        # A file, not a pipe, for the worker's messages: nobody reads them
        # until it fails, and a full pipe would stall it.
        self._stderr = tempfile.TemporaryFile(mode='w+')
        self._process = subprocess.Popen([
            sys.executable, '-m', __name__,
            json.dumps(dict(spec, measure='steps', name=name))
        ],
                                         stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE,
                                         stderr=self._stderr,
                                         text=True,
                                         bufsize=1)

    def _reply(self, what: str) -> str:
        line = self._process.stdout.readline()
        if not line:
            self._process.wait()
            self._stderr.seek(0)
            raise RuntimeError(
                f'the timing process of {self.name} failed {what} (exit '
                f'status {self._process.returncode}):\n'
                f'{self._stderr.read()[-3000:]}')
        return line.strip()

    def wait_ready(self) -> None:
        """Returns once the model is built (raises if building failed)."""
        reply = self._reply('while building the model')
        if reply != 'ready':
            raise RuntimeError(f'the timing process of {self.name} said '
                               f'{reply!r} instead of ready')

    def step(self, mode: str) -> float:
        """Seconds of one ``mode`` step (``'eval'`` or ``'train'``)."""
        if mode not in MODES:
            raise ValueError(f'mode {mode!r}: not one of {MODES}')
        try:
            self._process.stdin.write(mode + '\n')
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # it has exited: _reply says why, from its stderr
        return float(self._reply(f'in a step ({mode})'))

    def close(self) -> None:
        """Ends the process (asks it to quit, kills it if it does not)."""
        if self._process.poll() is None:
            try:
                self._process.stdin.write('quit\n')
                self._process.stdin.flush()
                self._process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        self._stderr.close()


def serve_steps(name: str,
                depth: int,
                setting: str,
                eval_shape: Sequence[int],
                train_shape: Sequence[int],
                threads: int,
                device: str = 'cpu',
                channels_last: bool = False,
                official: Optional[str] = None) -> None:
    """The far side of :class:`ModelProcess`: builds the model and its
    inputs, says ``ready`` and answers each ``eval``/``train`` line on
    stdin with the seconds of that step, until ``quit`` or end of input.
    Whatever else the process prints (the official constructors do) goes
    to stderr, so that stdout carries the replies only."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), 'w', buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    torch.set_num_threads(threads)
    memory_format = memory_format_of(channels_last)
    model = seeded_model(name, depth, setting, official, device, memory_format)
    steps = random_steps(eval_shape, train_shape, device, memory_format)
    replies.write('ready\n')
    for line in sys.stdin:
        mode = line.strip()
        if mode == 'quit':
            break
        replies.write(f'{timed_step(steps[mode], model, device)!r}\n')


@contextmanager
def model_processes(names: Sequence[str],
                    **spec) -> Iterator[Dict[str, ModelProcess]]:
    """A :class:`ModelProcess` per model of ``names`` (``spec``: the other
    arguments of ModelProcess), built side by side and ready; all are
    ended on leaving the block, also on an error."""
    processes: Dict[str, ModelProcess] = {}
    try:
        for name in names:
            processes[name] = ModelProcess(name, **spec)
        for process in processes.values():
            process.wait_ready()
        yield processes
    finally:
        for process in processes.values():
            process.close()


def time_runs(runs: int,
              process_per_model: bool = False,
              **kwargs) -> List[Dict[Tuple[str, str], List[float]]]:
    """``runs`` runs of :func:`time_section` (same keyword arguments): one
    in this process, or each of two or more in a fresh process
    (:func:`time_section_in_subprocess`); with ``process_per_model``, each
    run with every model in a fresh process of its own."""
    if process_per_model:
        return [
            time_section(process_per_model=True, **kwargs) for _ in range(runs)
        ]
    if runs == 1:
        return [time_section(**kwargs)]
    return [time_section_in_subprocess(**kwargs) for _ in range(runs)]


def run_ratio_range(runs: Sequence[Dict[Tuple[str, str], List[float]]],
                    name: str, mode: str) -> Tuple[float, Tuple[float, float]]:
    """Over several runs of :func:`time_section`: the median of each run's
    ratio of medians (``name``'s median time over ResNet's in that run) and
    the (lowest, highest) run's ratio."""
    ratios = [
        statistics.median(run[(name, mode)]) /
        statistics.median(run[('resnet', mode)]) for run in runs
    ]
    if not ratios:
        raise ValueError('run_ratio_range needs at least one run')
    return statistics.median(ratios), (min(ratios), max(ratios))


def round_ratio_quartiles(
        times: Sequence[float],
        base_times: Sequence[float]) -> Optional[Tuple[float, float]]:
    """The first and third quartiles of ``times[i] / base_times[i]``, the
    ratio within each round of :func:`time_modes` (the models alternate, so
    a round's two steps ran seconds apart), or None for fewer than two
    rounds. How far the ratio moves inside one run, beside the ratio of the
    medians that the tables give."""
    if len(times) != len(base_times):
        raise ValueError(f'round_ratio_quartiles: {len(times)} times against '
                         f'{len(base_times)} base times; one of each a round')
    if len(times) < 2:
        return None
    ratios = [t / b for t, b in zip(times, base_times)]
    first, _, third = statistics.quantiles(ratios, n=4, method='inclusive')
    return first, third


# Peak memory growth of a train step on the CPU: the process's resident set
# high-water mark (VmHWM) minus its resident set (VmRSS) just before the
# step. Writing 5 to /proc/self/clear_refs (Linux 4.0+) resets VmHWM to the
# current VmRSS; the kernel raises VmHWM before every unmap of pages (munmap,
# brk shrink, madvise(MADV_DONTNEED): the ways glibc gives freed memory
# back), so it holds the true peak of the step however malloc returns
# memory in between. ru_maxrss (getrusage) is the same counter but cannot be
# reset: model construction can peak above the step's start, hiding part of
# the step. The step runs in a fresh process, once, because a process that
# has run steps before keeps freed blocks in glibc's heap and reuses them
# without growing the resident set: a second step in the same process shows
# less growth than the step needs, and by how much depends on what ran
# before (the other models, the timing rounds). What the figure includes:
# the saved activations, the temporary buffers of forward and backward at
# their high point, the gradients of the weights (set_to_none before each
# step, so allocated by this one) and the one-time lazy set-up of the first
# step (oneDNN primitives, thread pools, the autograd engine: some tens of
# MiB, alike for every model, most visible at tiny sizes).
def _status_kib(field: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> int:
    """Resets this process's RSS high-water mark (VmHWM) to its resident
    set and returns that, in bytes (Linux; OSError elsewhere)."""
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
    return _status_kib('VmRSS') * 1024


def peak_rss() -> int:
    """This process's RSS high-water mark (VmHWM) in bytes."""
    return _status_kib('VmHWM') * 1024


def can_measure_peak_rss() -> bool:
    """Whether this process can reset its RSS high-water mark."""
    try:
        reset_peak_rss()
        peak_rss()
        return True
    except (OSError, KeyError):
        return False


def measure_one(name: str,
                depth: int,
                setting: str,
                train_shape: Sequence[int],
                threads: int,
                device: str = 'cpu',
                channels_last: bool = False,
                official: Optional[str] = None) -> Dict[str, Optional[int]]:
    """Memory of one train step of one model in this process (meant to be
    fresh, see the comment above): ``{'activation': saved-tensor bytes,
    weights excluded, 'peak_allocated': the high-water mark of the bytes
    held by tensors above their level before the step, 'peak_growth': the
    resident set's high-water mark above its level before the step, or
    None where it cannot be measured}``.

    On CUDA ``'peak_allocated'`` is ``torch.cuda.max_memory_allocated`` of
    a second step and ``'peak_growth'`` None (the process's resident set is
    not the GPU's memory). On the CPU the resident set is read in the first
    step, before anything else has run in the process, and the tensors'
    high-water mark in a second step
    (:func:`kcla_mm.analysis.complexity.train_step_allocated_peak`), whose
    profiler would add its own records to the resident set."""
    if threads > 0:
        torch.set_num_threads(threads)
    memory_format = memory_format_of(channels_last)
    model = seeded_model(name, depth, setting, official, device, memory_format)
    model.train()
    x = torch.randn(
        *train_shape, device=device).contiguous(memory_format=memory_format)
    gc.collect()
    cuda = device.startswith('cuda')
    peak = can_measure_peak_rss() and not cuda
    if cuda:
        # The first step allocates what the process then keeps (cuBLAS's
        # workspace, up to 32 MiB, taken only by a model that runs a
        # matmul): the second is measured, as the CPU's tensor peak is.
        train_step(x)(model)
        model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    elif peak:
        before = reset_peak_rss()
    activation = saved_activation_bytes(model, x)
    growth = None
    if cuda:
        torch.cuda.synchronize()
        allocated = torch.cuda.max_memory_allocated() - before
    else:
        if peak:
            growth = peak_rss() - before
        allocated = train_step_allocated_peak(model, x)
    return dict(
        activation=activation, peak_allocated=allocated, peak_growth=growth)


def train_step_memory_in_subprocess(
        name: str,
        depth: int,
        setting: str,
        train_shape: Sequence[int],
        threads: int,
        device: str = 'cpu',
        channels_last: bool = False,
        official: Optional[str] = None) -> Dict[str, Optional[int]]:
    """:func:`measure_one` in a fresh Python process (this module with
    ``-m``, the same interpreter and environment)."""
    spec = dict(
        name=name,
        depth=depth,
        setting=setting,
        train_shape=list(train_shape),
        threads=threads,
        device=device,
        channels_last=channels_last,
        official=official)
    return json.loads(_run_module(spec, f'memory of {name}'))


def median_memory(
        samples: Sequence[Dict[str,
                               Optional[int]]]) -> Dict[str, Optional[int]]:
    """Per key, the median of one model's :func:`measure_one` results from
    several fresh processes (the lower middle one of an even count, so a
    byte count stays one that was measured); None where any is None. The
    activation bytes and the tensors' peak are the same in every process;
    the peak growth, an RSS high-water mark, moves by some percent between
    processes."""
    if not samples:
        raise ValueError('median_memory needs at least one measurement')
    medians: Dict[str, Optional[int]] = {}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        medians[key] = (None
                        if None in values else statistics.median_low(values))
    return medians


if __name__ == '__main__':
    import logging

    from mmengine.logging import MMLogger

    # init_weights() logs one INFO record per parameter.
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    spec = json.loads(sys.argv[1])
    measure = spec.pop('measure', 'memory')
    if measure == 'steps':
        serve_steps(**spec)
    elif measure == 'timing':
        times = time_section(**spec)
        print(
            json.dumps({
                '|'.join(key): value
                for key, value in times.items()
            }))
    else:
        print(json.dumps(measure_one(**spec)))
