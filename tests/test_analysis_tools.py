"""tools/analysis: benchmark_backbone, profile_kcla, depth_scaling,
layer_weights, key_similarity."""
import csv
import os.path as osp
import re
import sys
import time

import mmcv
import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer

from kcla_mm.analysis.benchmark import (ModelProcess, can_measure_peak_rss,
                                        load_official, median_memory,
                                        round_ratio_quartiles, run_ratio_range,
                                        setting_shapes, time_section,
                                        time_section_in_subprocess)
from kcla_mm.analysis.complexity import (saved_activation_bytes,
                                         train_step_allocated_peak)
from kcla_mm.analysis.key_similarity import mean_off_diagonal
from kcla_mm.analysis.layer_contributions import (kcla_normalised_weights,
                                                  mrla_light_shares)
from kcla_mm.analysis.phase_profile import PHASES, timed_phases
from kcla_mm.analysis.timing import train_step
from kcla_mm.models import KCLAResNet, MRLALightResNet
from kcla_mm.models.layers.profiling import phase
from kcla_mm.torch_compat import has_mem_tracker
from helpers import ROOT, assert_usage_error, load_tool, output_of

KCLA_UNET = osp.join(ROOT, 'configs/kcla/unet_kcla-r18_isic2017-256x256.py')
LA_UNET = osp.join(ROOT, 'configs/baselines/unet_la-r18_isic2017-256x256.py')


@pytest.fixture
def image(tmp_path):
    rng = np.random.default_rng(0)
    path = str(tmp_path / 'image.jpg')
    mmcv.imwrite((rng.random((40, 56, 3)) * 255).astype(np.uint8), path)
    return path


BENCHMARK = 'tools/analysis/benchmark_backbone.py'
# Tiny sizes for the benchmark's tests: ResNet-18 at 64x64.
TINY = ('--depth', '18', '--size', '64', '--eval-batch', '1', '--train-batch',
        '2', '--repeats', '1', '--warmup', '0', '--memory-repeats', '1')
ROWS = ('eval forward', 'train step (fwd+bwd)', 'activation memory',
        'peak tensor memory', 'peak RSS growth')


def parse_cell(cell):
    """A cell of benchmark_backbone.py's tables: None for '-', a (low,
    high) pair for a range, else a ratio."""
    if cell == '-':
        return None
    if '-' in cell:
        low, high = cell.split('-')
        return float(low), float(high)
    return float(cell)


def benchmark_tables(log):
    """``{(setting, threads option): {row: (ResNet value, [cells])}}`` of
    benchmark_backbone.py's output; a cell as :func:`parse_cell` reads it."""
    tables = {}
    for block in re.split(r'\n== ', log)[1:]:
        heading, *lines = block.strip().splitlines()
        key = re.match(
            r'(\w+), ResNet-\d+, \d+ thread\(s\) \(--threads '
            r'(\d+)\)', heading).groups()
        rows = {}
        for line in lines[1:]:
            match = re.match(r'(.+?)  +([\d.]+ (?:ms|MiB)|-)  +(.*)$', line)
            if match is None:
                continue
            label, value, cells = match.groups()
            rows[label] = (value, [parse_cell(c) for c in cells.split()])
        tables[(key[0], int(key[1]))] = dict(columns=lines[0].split(), **rows)
    return tables


@pytest.fixture
def benchmark_tool():
    """benchmark_backbone.py in-process (its sections set torch's thread
    count; conftest.py puts it back after each test)."""
    return load_tool(BENCHMARK)


def test_benchmark_backbone_parses_lists_and_settings(benchmark_tool):
    args = benchmark_tool.parse_args([
        '--depth', '50', '101', '--threads', '1', '0', '--setting', 'imagenet',
        'detection', '--implementations', 'auto', 'fused'
    ])
    assert args.depth == [50, 101] and args.threads == [1, 0]
    assert args.settings == ['imagenet', 'detection']
    assert args.implementations == ['auto', 'fused']
    defaults = benchmark_tool.parse_args([])
    assert (defaults.depth, defaults.threads, defaults.settings,
            defaults.implementations) == ([50], [1], ['imagenet'], ['auto'])
    assert defaults.memory_repeats == 3
    # The former single-implementation option still works.
    assert benchmark_tool.parse_args(['--kcla-implementation',
                                      'fused']).implementations == ['fused']
    # The settings' sizes, and the explicit options overriding them.
    assert benchmark_tool.shapes(defaults, 'imagenet') == [(1, 3, 224, 224),
                                                           (8, 3, 224, 224)]
    assert benchmark_tool.shapes(defaults, 'detection') == [(1, 3, 800, 1216),
                                                            (2, 3, 512, 512)]
    small = benchmark_tool.parse_args(['--size', '64', '--train-batch', '2'])
    assert benchmark_tool.shapes(small, 'detection') == [(1, 3, 64, 64),
                                                         (2, 3, 64, 64)]


@pytest.mark.parametrize(
    'argv, message',
    [
        (['--setting', 'coco'
          ], "--setting/--settings: invalid choice: 'coco'"),
        (['--threads', '1', '-2'], '--threads -2: not an integer >= 0'),
        (['--threads', 'all'], '--threads all: not an integer >= 0'),
        (['--depth', '42'], '--depth: invalid choice: 42'),
        (['--implementations', 'fast'], "invalid choice: 'fast'"),
        (['--memory-repeats', '0'], '--memory-repeats 0: not an integer >= 1'),
        (['--runs', '0'], '--runs 0: not an integer >= 1'),
        (['--size', '-5'], '--size -5: not an integer >= 1'),
        (['--repeats', 'many'], '--repeats many: not an integer >= 1'),
        (['--official', 'no/such/kcla_resnet.py'
          ], '--official no/such/kcla_resnet.py: no such file'),
        (['--device', 'foo'], "--device foo: not 'cpu', 'cuda' or 'cuda:N'"),
        (['--device', 'meta'], "--device meta: not 'cpu', 'cuda' or 'cuda:N'"),
        # No CUDA here, or fewer than 100 devices: either way refused up front.
        (['--device', 'cuda:99'], '--device cuda:99: '),
        (['--implementations', 'auto', 'compiled', '--channels-last'
          ], '--implementations compiled: the compiled kernels take NCHW CPU '
         "tensors only, not --channels-last ('auto' runs 'fused' there)"),
        (['--implementations', 'compiled+keep-outputs', '--channels-last'
          ], '--implementations compiled+keep-outputs: the compiled kernels'),
    ])
def test_benchmark_backbone_rejects_bad_options(benchmark_tool, capsys, argv,
                                                message):
    with pytest.raises(SystemExit) as error:
        benchmark_tool.parse_args(argv)
    assert error.value.code == 2
    assert message in capsys.readouterr().err


def test_benchmark_backbone_refuses_compiled_without_the_kernels(
        benchmark_tool, capsys, monkeypatch):
    """With the kernels turned off, a 'compiled' column is refused before
    anything runs, naming the option and the switch."""
    monkeypatch.setenv('KCLA_MM_NO_EXTENSION', '1')
    assert benchmark_tool.parse_args(['--implementations', 'auto'])
    with pytest.raises(SystemExit):
        benchmark_tool.parse_args(['--implementations', 'compiled'])
    assert ('--implementations compiled: the compiled kernels are not built '
            'for this torch or are turned off (KCLA_MM_NO_EXTENSION)'
            in capsys.readouterr().err)


OFFICIAL_50 = """
def resnet18_kcla():  # the official file's: 4 Bottleneck blocks
    raise AssertionError('not to be built')

def resnet50_kcla():
    raise AssertionError('not to be built while parsing')
"""


@pytest.mark.parametrize('depths, message', [
    (['18'], '--official compares at --depth 50 and 101 only (the official '
     "file's model of another depth is not mmdet's ResNet of that depth), "
     'not at 18'),
    (['50', '101', '152'], 'not at 152'),
    (['50', '101'], 'has no resnet101_kcla() (it has: resnet18_kcla, '
     'resnet50_kcla)'),
])
def test_benchmark_backbone_checks_the_official_file_up_front(
        tmp_path, benchmark_tool, capsys, depths, message):
    """A depth the official file cannot give is refused while parsing,
    before the first section runs, and without running the file."""
    official = tmp_path / 'kcla_resnet.py'
    official.write_text(OFFICIAL_50)
    assert benchmark_tool.parse_args(
        ['--depth', '50', '--official',
         str(official)]).official
    with pytest.raises(SystemExit):
        benchmark_tool.parse_args(
            ['--depth', *depths, '--official',
             str(official)])
    assert message in capsys.readouterr().err
    (tmp_path / 'broken.py').write_text('def resnet50_kcla(:\n')
    with pytest.raises(SystemExit):
        benchmark_tool.parse_args(
            ['--depth', '50', '--official',
             str(tmp_path / 'broken.py')])
    assert 'broken.py: not a Python file' in capsys.readouterr().err


@pytest.mark.slow
def test_benchmark_backbone_keep_freed_memory_reruns_main_argv():
    """``main(argv)`` called from other code re-runs the tool with argv
    under glibc's settings, not the caller's command line (here ``python
    -c``, which cannot be re-run)."""
    code = ('import sys; sys.path.insert(0, "tests"); '
            'from helpers import load_tool; '
            f'load_tool({BENCHMARK!r}).main({[*TINY, "--modes", "eval"]!r} '
            '+ ["--keep-freed-memory"])')
    log = output_of(sys.executable, '-c', code)
    assert 'NCHW, malloc keeping freed memory' in log, log
    assert list(benchmark_tables(log)) == [('imagenet', 1)], log


def test_benchmark_backbone_quick_eval_table(benchmark_tool, capsys):
    """The quick suite's run of the tool: one eval row, one column."""
    benchmark_tool.main([*TINY, '--modes', 'eval', '--no-memory'])
    table = benchmark_tables(capsys.readouterr().out)[('imagenet', 1)]
    assert table['columns'] == ['ResNet-18', 'KCLA', 'auto']
    assert set(table) == {'columns', 'eval forward'}
    assert table['eval forward'][1][0] > 0


def test_benchmark_backbone_rows_of_the_rounds_ratios(benchmark_tool, capsys):
    """With two or more repeats each timing row has a row under it with the
    first and third quartiles of the per-round ratios."""
    benchmark_tool.main([
        *TINY, '--modes', 'eval', '--no-memory', '--repeats', '3',
        '--implementations', 'auto', 'fused'
    ])
    out = capsys.readouterr().out
    assert "the middle half of the rounds' ratios" in out
    table = benchmark_tables(out)[('imagenet', 1)]
    assert set(table) == {'columns', 'eval forward', 'eval: 25-75% of rounds'}
    value, ranges = table['eval: 25-75% of rounds']
    assert value == '-' and len(ranges) == 2
    for low, high in ranges:
        assert 0 < low <= high


def test_benchmark_backbone_runs_in_fresh_processes(benchmark_tool, capsys):
    """--runs 2: each section timed in two fresh processes, the row under
    each timing row the lowest and highest run's ratio, around the median
    of the runs' ratios that the timing row gives."""
    benchmark_tool.main([
        *TINY, '--modes', 'eval', '--no-memory', '--repeats', '2', '--runs',
        '2', '--implementations', 'auto', 'fused'
    ])
    out = capsys.readouterr().out
    assert 'in each of 2 runs (fresh processes)' in out
    assert "the lowest and highest run's ratio" in out
    table = benchmark_tables(out)[('imagenet', 1)]
    assert set(table) == {
        'columns', 'eval forward', 'eval: lowest-highest run'
    }
    medians = table['eval forward'][1]
    value, ranges = table['eval: lowest-highest run']
    assert value == '-' and len(ranges) == len(medians) == 2
    for median, (low, high) in zip(medians, ranges):
        # Two runs: the median is their mean, printed to three decimals.
        assert 0 < low <= high and low - 1e-3 <= median <= high + 1e-3


def test_run_ratio_range():
    # Run ratios 2 (medians 4 / 2), 1 (3 / 3) and 1.5 (3 / 2).
    runs = [
        {
            ('resnet', 'eval'): [2, 1, 3],
            ('kcla', 'eval'): [4, 4, 9]
        },
        {
            ('resnet', 'eval'): [3],
            ('kcla', 'eval'): [3]
        },
        {
            ('resnet', 'eval'): [2, 2],
            ('kcla', 'eval'): [2, 4]
        },
    ]
    assert run_ratio_range(runs, 'kcla', 'eval') == (1.5, (1.0, 2.0))
    with pytest.raises(ValueError, match='at least one run'):
        run_ratio_range([], 'kcla', 'eval')


def test_timing_run_failure_names_the_run():
    with pytest.raises(RuntimeError, match='timing run failed'):
        time_section_in_subprocess(
            depth=42,
            setting='imagenet',
            eval_shape=(1, 3, 32, 32),
            train_shape=(2, 3, 32, 32),
            threads=1)


def test_benchmark_backbone_process_per_model(benchmark_tool, capsys):
    """--process-per-model: the header says so, and the table is the same
    table."""
    benchmark_tool.main(
        [*TINY, '--modes', 'eval', '--no-memory', '--process-per-model'])
    out = capsys.readouterr().out
    assert 'each model in a process of its own' in out
    table = benchmark_tables(out)[('imagenet', 1)]
    assert table['columns'] == ['ResNet-18', 'KCLA', 'auto']
    assert table['eval forward'][1][0] > 0


def test_model_processes_time_every_model_and_mode():
    """One process per model, every (model, mode) timed ``repeats`` times
    after the warm-up rounds."""
    times = time_section(
        process_per_model=True,
        depth=18,
        setting='detection',
        eval_shape=(1, 3, 64, 64),
        train_shape=(2, 3, 64, 64),
        threads=1,
        warmup=1,
        repeats=2,
        implementations=('auto', 'fused'))
    assert set(times) == {(name, mode)
                          for name in ('resnet', 'kcla:auto', 'kcla:fused')
                          for mode in ('eval', 'train')}
    for seconds in times.values():
        assert len(seconds) == 2 and min(seconds) > 0


# An official file that prints while it builds and in every forward, lines
# that a reader of the process's stdout would take for replies.
PRINTING_OFFICIAL = """
import torch.nn as nn

class PrintingConv(nn.Conv2d):
    def forward(self, x):
        print('0.5')
        return super().forward(x)

def resnet50_kcla():
    print('ready')
    return nn.Sequential(PrintingConv(3, 8, 3), nn.BatchNorm2d(8))
"""


def test_model_process_replies_past_the_models_prints(tmp_path):
    """What the model prints goes to the process's stderr: the replies are
    the steps' seconds, not the printed lines."""
    official = tmp_path / 'kcla_resnet.py'
    official.write_text(PRINTING_OFFICIAL)
    process = ModelProcess(
        'official',
        depth=50,
        setting='imagenet',
        eval_shape=(1, 3, 16, 16),
        train_shape=(2, 3, 16, 16),
        threads=1,
        official=str(official))
    try:
        process.wait_ready()
        seconds = [process.step(mode) for mode in ('eval', 'train', 'eval')]
        with pytest.raises(ValueError, match="mode 'test': not one of"):
            process.step('test')
        # A process that has gone: the next step says so, with its status.
        process._process.kill()
        process._process.wait()
        with pytest.raises(
                RuntimeError,
                match=r'the timing process of official failed in '
                r'a step \(eval\)'):
            process.step('eval')
    finally:
        process.close()
    assert all(0 < s != 0.5 for s in seconds), seconds


def test_model_process_failure_names_the_model():
    with pytest.raises(RuntimeError) as error:
        time_section(
            process_per_model=True,
            depth=42,
            setting='imagenet',
            eval_shape=(1, 3, 32, 32),
            train_shape=(2, 3, 32, 32),
            threads=1)
    message = str(error.value)
    assert 'the timing process of resnet failed while building the model' \
        in message and 'invalid depth 42' in message, message


def test_round_ratio_quartiles():
    # Round ratios 1, 3, 2, 4: quartiles (inclusive) 1.75 and 3.25,
    # whatever the rounds' own times.
    assert round_ratio_quartiles([2, 6, 10, 40],
                                 [2, 2, 5, 10]) == pytest.approx((1.75, 3.25))
    assert round_ratio_quartiles([1.0], [2.0]) is None
    with pytest.raises(ValueError, match='3 times against 2 base times'):
        round_ratio_quartiles([1, 2, 3], [1, 2])


# The tests below run at tiny sizes, but the memory rows start a process per
# model and the sections multiply: 50-100 s each on the shared 2-core VM.
@pytest.mark.slow
def test_benchmark_backbone_prints_a_table_per_setting_and_thread_count(
        benchmark_tool, capsys):
    """Every (setting, threads) section with its timing rows and one
    column per implementation, ratios positive (no timing asserted)."""
    benchmark_tool.main([
        *TINY, '--threads', '1', '0', '--setting', 'imagenet', 'detection',
        '--implementations', 'auto', 'fused', '--no-memory'
    ])
    tables = benchmark_tables(capsys.readouterr().out)
    assert set(tables) == {('imagenet', 1), ('imagenet', 0), ('detection', 1),
                           ('detection', 0)}
    for table in tables.values():
        assert table['columns'] == [
            'ResNet-18', 'KCLA', 'auto', 'KCLA', 'fused'
        ]
        assert set(table) == {'columns', *ROWS[:2]}
        for row in ROWS[:2]:
            value, ratios = table[row]
            assert value.endswith(' ms') and float(value.split()[0]) > 0
            assert len(ratios) == 2 and all(r > 0 for r in ratios), table


@pytest.mark.slow
def test_benchmark_backbone_memory_rows(benchmark_tool, capsys):
    """Activation memory, the tensors' peak and the RSS growth beside each
    other, each model in a fresh process: the tensors' peak includes the
    saved activations."""
    benchmark_tool.main(
        [*TINY, '--implementations', 'auto', 'fused', '--memory-repeats', '2'])
    out = capsys.readouterr().out
    assert 'median of 2 fresh process(es) per model' in out
    table = benchmark_tables(out)[('imagenet', 1)]
    assert set(table) == {'columns', *ROWS}
    activation, tensor_peak, rss_peak = (
        float(table[row][0].split()[0]) for row in ROWS[2:])
    assert 0 < activation < tensor_peak and rss_peak > 0
    for row in ROWS[2:]:
        assert all(r > 0 for r in table[row][1]), table
    # 'fused' keeps more for backward than the compiled kernels or ResNet.
    assert table['activation memory'][1][1] > 1


def test_memory_medians_over_fresh_processes():
    samples = [
        dict(activation=100, peak_growth=300),
        dict(activation=100, peak_growth=900),
        dict(activation=100, peak_growth=350),
    ]
    assert median_memory(samples) == dict(activation=100, peak_growth=350)
    # An even count takes a value that was measured, not a mean.
    assert median_memory(samples[:2])['peak_growth'] == 300
    # A platform without the peak (None) gives None, not a partial median.
    assert median_memory([
        dict(activation=1, peak_growth=None),
        dict(activation=1, peak_growth=5)
    ]) == dict(
        activation=1, peak_growth=None)
    with pytest.raises(ValueError, match='at least one'):
        median_memory([])


PEAK_PROBE = """
import torch
from kcla_mm.analysis.benchmark import peak_rss, reset_peak_rss
before = reset_peak_rss()
x = torch.ones(64 * 2**20 // 4)  # 64 MiB, mapped and touched
del x
print('grown', peak_rss() - before)
"""


@pytest.mark.skipif(
    not osp.isfile('/proc/self/clear_refs'),
    reason='the peak RSS growth resets /proc/self/clear_refs (Linux)')
def test_peak_growth_counts_a_large_allocation():
    """The reset high-water mark sees memory that is allocated, touched
    and given back between two readings. In a fresh process, as the
    benchmark measures: in this one, freed heap that is still resident
    could serve the allocation without raising the RSS."""
    assert can_measure_peak_rss()
    log = output_of(sys.executable, '-c', PEAK_PROBE)
    grown = int(re.search(r'grown (-?\d+)', log)[1])
    assert 60 * 2**20 < grown < 200 * 2**20, grown


class HoldsATemporary(torch.nn.Module):
    """Allocates 64 MiB in its forward and frees it before the backward:
    what a high-water mark sees and a count of saved tensors does not."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        temporary = x.new_ones(64 * 2**20 // 4)
        return [x * self.weight + temporary.sum() * 0]


def test_tensor_peak_counts_a_temporary_freed_in_the_step():
    peak = train_step_allocated_peak(HoldsATemporary(), torch.ones(8))
    assert 64 * 2**20 <= peak < 65 * 2**20, peak
    with pytest.raises(ValueError, match='measures the CPU; inputs are on'):
        train_step_allocated_peak(HoldsATemporary(),
                                  torch.ones(8, device='meta'))


@pytest.mark.parametrize('implementation', ['auto', 'fused'])
def test_tensor_peak_holds_the_saved_activations(implementation):
    """At the end of the forward every saved activation is alive, and at
    the end of the backward every weight's gradient, so the step's
    high-water mark is at least either, for the compiled kernels' tensors
    (allocated in C++) as for PyTorch's; and it is the same in a second
    step: a count of bytes, not of the allocator's state."""
    torch.manual_seed(0)
    model = KCLAResNet(depth=18, kcla_implementation=implementation)
    model.train()
    # Large enough that the activations outweigh the gradients.
    x = torch.randn(2, 3, 320, 320)
    saved = saved_activation_bytes(model, x)
    gradients = sum(p.numel() * p.element_size() for p in model.parameters())
    peak = train_step_allocated_peak(model, x)
    assert peak > saved > 1.5 * gradients, (saved, gradients, peak)
    assert train_step_allocated_peak(model, x) == peak
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow
def test_benchmark_backbone_measures_both_memory_settings():
    """Both train settings of the memory targets, and 'recompute' keeping
    less than the fused path in each."""
    log = output_of(sys.executable, BENCHMARK, *TINY, '--modes', 'train',
                    '--setting', 'imagenet', 'detection', '--implementations',
                    'fused', 'recompute')
    tables = benchmark_tables(log)
    assert set(tables) == {('imagenet', 1), ('detection', 1)}
    for table in tables.values():
        fused, recompute = table['activation memory'][1]
        assert 1 < recompute < fused, table


OFFICIAL_STAND_IN = """
import torch.nn as nn

def resnet50_kcla():
    print('Constructing resnet50_kcla......')  # as the official file does
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))
"""


@pytest.mark.slow
def test_benchmark_backbone_adds_the_official_file(tmp_path, benchmark_tool,
                                                   capsys):
    """``--official FILE`` builds ``resnet<depth>_kcla()`` from the user's
    file (a stand-in here: the real one is the user's copy of github
    bgx666/KCLA's imagenet/kcla_resnet.py, not tests/official_reference.py)
    into the same run as a column; it cannot freeze stages, so in the
    detection setting it has only the eval ratio. A file without the
    depth's function is named with the option."""
    official = tmp_path / 'kcla_resnet.py'
    official.write_text(OFFICIAL_STAND_IN)
    benchmark_tool.main([
        *TINY[2:], '--depth', '50', '--setting', 'imagenet', 'detection',
        '--official',
        str(official)
    ])
    out = capsys.readouterr().out
    tables = benchmark_tables(out)
    imagenet, detection = tables[('imagenet', 1)], tables[('detection', 1)]
    assert imagenet['columns'][-1] == detection['columns'][-1] == 'official'
    for row in ROWS:
        assert imagenet[row][1][-1] > 0, imagenet
    assert detection['eval forward'][1][-1] > 0
    for row in ROWS[1:]:
        assert detection[row][1][-1] is None, detection
    assert 'official: no frozen stages or norm_eval' in out
    # The library's loader, called without the tool's checks, names the
    # missing function too.
    with pytest.raises(ValueError) as error:
        load_official(str(official), 101)
    assert f'--official {official} has no resnet101_kcla() for depth 101 ' \
        '(it has: resnet50_kcla)' in str(error.value)


# The phases each implementation's train step and eval forward label.
IMPLEMENTATION_PHASES = {
    'compiled': {
        'renormalise', 'pooled', 'update_branch', 'update_branch_backward',
        'backward', 'tape', 'output_recompute'
    },
    'fused': {'renormalise', 'pooled', 'state_update', 'branch', 'residual'},
    'recompute': {
        'renormalise', 'pooled', 'state_update', 'branch', 'residual',
        'backward', 'tape'
    },
}


@pytest.mark.parametrize('implementation', sorted(IMPLEMENTATION_PHASES))
def test_phase_profile_times_every_phase_once(implementation):
    """Every phase that the implementation labels is timed in a train step
    and an eval forward (the kernels are built by setup wherever the suite
    runs), and nested phases are not counted twice."""
    model = KCLAResNet(
        depth=18,
        base_channels=16,
        head_dim=16,
        kcla_implementation=implementation)
    x = torch.randn(2, 3, 64, 64)
    start = time.perf_counter()
    with timed_phases() as totals:
        model.train()
        sum(o.mean() for o in model(x)).backward()
        model.eval()
        with torch.no_grad():
            model(x[:1])
    wall = time.perf_counter() - start
    assert set(totals) == {
        PHASES[name]
        for name in IMPLEMENTATION_PHASES[implementation]
    }
    assert all(seconds > 0 for seconds in totals.values()), dict(totals)
    assert sum(totals.values()) < wall


def test_phase_labels_cost_a_flag_check_without_a_profiler():
    """No profiler running: the layers' labels are one shared no-op
    context, not record_function (microseconds per block)."""
    assert not torch.autograd._profiler_enabled()
    assert phase('branch') is phase('pooled')
    with torch.profiler.profile() as prof:
        with phase('branch'):
            torch.ones(1).add_(1)
    assert [e.name for e in prof.events()].count('kcla::branch') == 1


@pytest.mark.parametrize('argv, message', [
    (['--threads', '-1'], '--threads -1: not an integer >= 0'),
    (['--repeats', '0'], '--repeats 0: not an integer >= 1'),
    (['--warmup', '-2'], '--warmup -2: not an integer >= 0'),
    (['--size', 'big'], '--size big: not an integer >= 1'),
    (['--depth', '42'], '--depth: invalid choice: 42'),
])
def test_profile_kcla_rejects_bad_options(capsys, argv, message):
    assert_usage_error('tools/analysis/profile_kcla.py', argv, message, capsys)


def test_profile_kcla_threads_0_is_torch_default(capsys):
    """As in benchmark_backbone.py, 0 leaves torch's thread count as it is
    (torch.set_num_threads refuses 0)."""
    threads = torch.get_num_threads()
    load_tool('tools/analysis/profile_kcla.py').main([
        '--threads', '0', '--depth', '18', '--size', '32', '--repeats', '1',
        '--warmup', '0', '--modes', 'eval'
    ])
    assert f'cpu, {threads} thread(s)' in capsys.readouterr().out
    assert torch.get_num_threads() == threads


def test_profile_kcla_takes_the_benchmark_settings(capsys):
    """--setting picks benchmark_backbone.py's input shapes and backbone
    arguments; --eval-batch, --train-batch and --size override the
    shapes."""
    assert setting_shapes('detection') == [(1, 3, 800, 1216), (2, 3, 512, 512)]
    assert setting_shapes(
        'imagenet', train_batch=3, size=40)[1] == (3, 3, 40, 40)
    tool = load_tool('tools/analysis/profile_kcla.py')
    tool.main([
        '--setting', 'detection', '--depth', '18', '--size', '32', '--repeats',
        '1', '--warmup', '0', '--modes', 'eval'
    ])
    out = capsys.readouterr().out
    assert 'detection setting' in out
    assert 'eval (1x3x32x32, median of 1)' in out


def test_train_step_calls_between_after_the_forward_pass():
    """profile_kcla.py counts the backward pass's page faults from the
    call: the model's outputs exist then, its gradients not yet."""
    model = torch.nn.Conv2d(3, 4, 3)
    seen = []

    def between():
        seen.append((model.training, model.weight.grad))

    model.eval()
    model.weight.grad = torch.ones_like(model.weight)
    train_step(torch.randn(2, 3, 8, 8), between=between)(model)
    assert seen == [(True, None)]
    assert model.weight.grad is not None and model.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_profile_kcla_prints_the_phases_beside_resnet():
    log = output_of(sys.executable, 'tools/analysis/profile_kcla.py',
                    '--depth', 18, '--size', 64, '--train-batch', 2,
                    '--repeats', 1, '--warmup', 0)
    assert 'kcla_implementation=auto: compiled phases' in log, log
    for mode in ('eval', 'train'):
        assert re.search(
            rf'{mode} \([\dx]+, median of 1\): ResNet [\d.]+ ms, '
            r'KCLA [\d.]+ ms, ratio [\d.]+', log), log
    assert 'state update + branch, C++ backward' in log, log
    assert 'not in a phase' in log
    # one line per mode; a train step allocates fresh gradients, and its
    # line also counts the backward pass's faults, part of the step's
    faults = re.findall(
        r'minor page faults per step \(median\): ResNet (\d+) \(([\d.]+) ms '
        r'system CPU(?:, (\d+) in backward)?\), KCLA (\d+) \(([\d.]+) ms '
        r'system CPU(?:, (\d+) in backward)?\)', log)
    assert len(faults) == 2, log
    (_, _, eval_resnet_backward, _, _, eval_kcla_backward), train = faults
    assert eval_resnet_backward == eval_kcla_backward == '', log
    resnet, _, resnet_backward, kcla, _, kcla_backward = map(
        lambda v: int(float(v)), train)
    assert resnet > 0 and kcla > 0, log
    assert resnet_backward <= resnet and kcla_backward <= kcla, log


@pytest.mark.slow
def test_depth_scaling_writes_csv_and_plot(tmp_path, capsys):
    load_tool('tools/analysis/depth_scaling.py').main([
        '--depths', '26', '50', '--base-channels', '8', '--head-dim', '8',
        '--size', '32', '--repeats', '1', '--warmup', '0', '--out-dir',
        str(tmp_path)
    ])
    with open(tmp_path / 'depth_scaling.csv') as f:
        rows = list(csv.DictReader(f))
    methods = ('ResNet', 'KCLA', 'LA', 'MRLA-light')
    assert [(r['method'], r['depth'])
            for r in rows] == [(m, d) for d in ('26', '50') for m in methods]
    by = {(r['method'], r['depth']): r for r in rows}
    for key in ('params_m', 'gflops', 'eval_ms', 'train_ms'):
        assert all(float(r[key]) > 0 for r in rows), key
    out = capsys.readouterr().out
    if has_mem_tracker():
        assert all(float(r['train_peak_mib']) > 0 for r in rows)
        assert 'not measured' not in out
    else:
        # e.g. torch 2.1: said, and left out of the fit, not made up.
        assert all(r['train_peak_mib'] == 'nan' for r in rows)
        assert 'has no MemTracker' in out
        assert 'train memory not measured' in out
    # KCLA's inference state does not grow with depth; LA's cache does.
    assert by['KCLA', '26']['state_mib'] == by['KCLA', '50']['state_mib']
    assert float(by['LA', '50']['state_mib']) > float(by['LA',
                                                         '26']['state_mib'])
    assert float(by['ResNet', '26']['state_mib']) == 0
    assert osp.getsize(tmp_path / 'depth_scaling.png') > 10_000
    kcla_line = re.search(r'^KCLA +overhead over ResNet: .*$', out, re.M)
    assert kcla_line and 'state memory constant' in kcla_line.group(0)


def test_depth_scaling_refuses_depths_outside_the_plan():
    with pytest.raises(SystemExit):
        load_tool('tools/analysis/depth_scaling.py').parse_args(
            ['--depths', '27'])


def test_layer_weights_random_init_writes_plot(tmp_path, image, capsys):
    out = tmp_path / 'weights.png'
    load_tool('tools/analysis/layer_weights.py').main(
        [KCLA_UNET, 'none', image, '--out',
         str(out), '--size', '48'])
    assert osp.getsize(out) > 10_000
    printed = capsys.readouterr().out
    assert printed.startswith('KCLA: at the last block')
    assert 'MRLA-light: at the last block' in printed


def test_layer_weights_loads_a_training_checkpoint(tmp_path, image):
    """A detector/segmentor-style checkpoint (backbone.* keys, mmengine's
    logging types) loads with weights_only=True; a wrong one is refused."""
    backbone = KCLAResNet(depth=18, base_channels=32, head_dim=16)
    loss = HistoryBuffer()
    loss.update(1.0)
    ckpt = dict(
        meta=dict(iter=1),
        state_dict={
            f'backbone.{k}': v
            for k, v in backbone.state_dict().items()
        },
        message_hub=dict(log_scalars={'loss': loss}))
    torch.save(ckpt, tmp_path / 'iter_1.pth')
    lw = load_tool('tools/analysis/layer_weights.py')
    lw.main([
        KCLA_UNET,
        str(tmp_path / 'iter_1.pth'), image, '--out',
        str(tmp_path / 'a.png'), '--size', '48', '--heads', '0'
    ])
    assert osp.isfile(tmp_path / 'a.png')
    torch.save(MRLALightResNet(depth=18).state_dict(), tmp_path / 'wrong.pth')
    with pytest.raises(ValueError, match='does not match'):
        lw.main([KCLA_UNET, str(tmp_path / 'wrong.pth'), image])
    with pytest.raises(ValueError, match="type='LAResNet'"):
        lw.main([LA_UNET, 'none', image])


def test_backbone_weights_load_through_mmengine(tmp_path):
    """mmengine's strict loading: a wrapped model's ``module.`` prefix is
    stripped; a mismatch is one line naming the first keys of each kind."""
    from kcla_mm.analysis.model_loading import load_backbone_weights
    source = KCLAResNet(depth=18, base_channels=16, head_dim=8)
    torch.save({
        f'module.{k}': v
        for k, v in source.state_dict().items()
    }, tmp_path / 'wrapped.pth')
    target = KCLAResNet(depth=18, base_channels=16, head_dim=8)
    load_backbone_weights(target, str(tmp_path / 'wrapped.pth'))
    for (name, a), b in zip(source.state_dict().items(),
                            target.state_dict().values()):
        assert torch.equal(a, b), name
    wider = KCLAResNet(depth=18, base_channels=32, head_dim=8)
    with pytest.raises(ValueError) as info:
        load_backbone_weights(wider, str(tmp_path / 'wrapped.pth'), 'Wide')
    message = str(info.value)
    assert '\n' not in message
    assert message.startswith(f'checkpoint {tmp_path / "wrapped.pth"} does '
                              "not match the config's Wide: size mismatch "
                              'for conv1.weight')
    assert re.search(r'\d+ more of other shape$', message)


def test_key_similarity_random_init_writes_plot(tmp_path, image, capsys):
    out = tmp_path / 'keys.png'
    load_tool('tools/analysis/key_similarity.py').main(
        [LA_UNET, 'none', image, '--out',
         str(out), '--size', '48'])
    assert osp.getsize(out) > 10_000
    lines = capsys.readouterr().out.splitlines()
    # ResNet-18: 2 blocks per stage, so 2, 4, 6, 8 cached keys.
    assert [line.split(':')[0]
            for line in lines[:4]] == [f'stage {s}' for s in range(1, 5)]
    assert [int(line.split()[2]) for line in lines[:4]] == [2, 4, 6, 8]
    values = [float(line.split()[-1]) for line in lines[:4]]
    assert all(-1 <= v <= 1 for v in values)


def test_mean_off_diagonal():
    m = torch.tensor([[1., .5, .2], [.5, 1., .3], [.2, .3, 1.]])
    assert mean_off_diagonal(m) == pytest.approx((.5 + .2 + .3) / 3)


def test_kcla_weights_are_normalised_and_follow_the_state():
    model = KCLAResNet(depth=18, base_channels=16, head_dim=8)
    model.init_weights()
    rows = kcla_normalised_weights(model, torch.rand(2, 3, 48, 48))
    assert len(rows) == 8
    assert [r.shape[1] for r in rows] == list(range(1, 9))
    # heads per stage: widths 16, 32, 64, 128 over head_dim 8
    assert [r.shape[0] for r in rows] == [2, 2, 4, 4, 8, 8, 16, 16]
    for r in rows:
        torch.testing.assert_close(r.sum(1), torch.ones(r.shape[0]))
        assert (r > 0).all()


def test_mrla_light_shares_follow_the_decays():
    torch.manual_seed(0)
    model = MRLALightResNet(depth=18, base_channels=16, head_dim=8)
    model.init_weights()
    x = torch.rand(2, 3, 48, 48)
    rows = mrla_light_shares(model, x)
    for r in rows:
        torch.testing.assert_close(r.sum(1), torch.ones(r.shape[0]))
    # Zero decays cut every earlier block off: each block sees only itself.
    with torch.no_grad():
        for m in model.modules():
            if getattr(m, 'decay', None) is not None:
                m.decay.zero_()
    for t, r in enumerate(mrla_light_shares(model, x)):
        want = torch.zeros_like(r)
        want[:, t] = 1
        torch.testing.assert_close(r, want)


def test_flop_count_includes_the_attention_ops():
    """mmengine's counter alone skips LA's weighted sum (baddbmm) and
    softmax; with the added handles they are counted. Block t reads t
    cached outputs: the first term is a bmm (counted either way), the
    other t - 1 are baddbmm, so the difference is at least
    sum_t (t - 1) * C * H * W."""
    from mmengine.analysis import FlopAnalyzer

    from kcla_mm.analysis.complexity import count_flops
    from kcla_mm.models import LAResNet
    model = LAResNet(depth=18, base_channels=8, head_dim=8).eval()
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        plain = FlopAnalyzer(model, (x, ))
        plain.unsupported_ops_warnings(False)
        plain_total = plain.total()
    # Block t (1-based) of the 8 reads t outputs of its stage's shape:
    # stages of 2 blocks, widths 8..64 at 8x8..1x1 (C*H*W = 512, 256, ...).
    sizes = [512, 512, 256, 256, 128, 128, 64, 64]
    weighted_sum = sum((t - 1) * s for t, s in enumerate(sizes, 1))
    assert count_flops(model, x) - plain_total >= weighted_sum


@pytest.mark.parametrize(
    'config, backbone',
    [
        # mmseg's default_scope: KCLAResNetV1c is in mmseg's registry only.
        ('configs/kcla/deeplabv3plus_kcla-r50-d8_kvasir-seg-256x256.py',
         'KCLAResNetV1c-50'),
        # Its init_cfg names a Pretrained file that is not on the machine.
        ('configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py', 'KCLAResNet-50'),
    ])
def test_backbone_summary_builds_as_the_config_does(config, backbone):
    """backbone_summary.py builds from the config's own scope and does
    not load its init_cfg: both configs run as they are."""
    log = output_of(sys.executable, 'tools/analysis/backbone_summary.py',
                    config, '--shape', '1', '3', '64', '64')
    assert f'{backbone} from {config}' in log
    assert 'stage 4: (1, 2048,' in log
