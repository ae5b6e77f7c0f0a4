"""What ``import kcla_mm`` (a config's custom_imports) loads, and its cost."""
import json
import subprocess
import sys

from helpers import HAS_MMPRETRAIN

# What kcla_mm registers into: loading these is the price of registration
# (mmpretrain's registry only where the optional extra is installed).
UPSTREAM = ('mmdet.models', 'mmdet.registry', 'mmseg.datasets',
            'mmseg.evaluation', 'mmseg.models', 'mmseg.registry',
            'mmengine.logging') + (
                ('mmpretrain.registry', ) if HAS_MMPRETRAIN else ())
BACKBONES = ('KCLAResNet', 'LAResNet', 'MRLALightResNet', 'MRLALResNet',
             'ResNetCIFAR', 'KCLAResNetCIFAR', 'LAResNetCIFAR',
             'MRLALightResNetCIFAR', 'ResNetUNetPaper', 'KCLAResNetUNetPaper',
             'LAResNetUNetPaper', 'MRLALightResNetUNetPaper')

PROBE = f'''
import json, sys
for name in {UPSTREAM!r}:
    __import__(name)
before = set(sys.modules)
import kcla_mm
from mmdet.registry import MODELS as DET
from mmseg.registry import DATASETS, METRICS, MODELS as SEG
try:
    from mmpretrain.registry import MODELS as PRETRAIN
except ImportError:
    PRETRAIN = None
print(json.dumps(dict(
    new=sorted(set(sys.modules) - before),
    det=[n for n in {BACKBONES!r} if DET.get(n) is not None],
    seg=[n for n in {BACKBONES!r} + ('UNetHead', 'UNetPaperHead')
         if SEG.get(n) is not None],
    pretrain=None if PRETRAIN is None else
    [n for n in {BACKBONES!r} if PRETRAIN.get(n) is not None],
    datasets=[n for n in ('ISIC2017Dataset', 'ISIC2018Dataset',
                          'KvasirSEGDataset') if DATASETS.get(n) is not None],
    metrics=[n for n in ('ForegroundIoUMetric', )
             if METRICS.get(n) is not None])))
'''


def run_probe(code: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, '-c', code],
                          capture_output=True,
                          text=True,
                          check=True)


def test_import_registers_everything_and_loads_only_kcla_mm():
    out = json.loads(run_probe(PROBE).stdout.splitlines()[-1])
    assert out['det'] == list(BACKBONES)
    assert out['seg'] == list(BACKBONES) + ['UNetHead', 'UNetPaperHead']
    # mmpretrain's registry has the backbones exactly where it is installed.
    assert out['pretrain'] == (list(BACKBONES) if HAS_MMPRETRAIN else None)
    assert out['datasets'] == [
        'ISIC2017Dataset', 'ISIC2018Dataset', 'KvasirSEGDataset'
    ]
    assert out['metrics'] == ['ForegroundIoUMetric']
    # Beyond what registration needs, only kcla_mm's own registering
    # modules: no inferencers (mmdet.apis, mmseg.apis), model zoo, analysis.
    foreign = [m for m in out['new'] if not m.startswith('kcla_mm')]
    assert foreign == []
    lazy = [
        m for m in out['new']
        if m.startswith(('kcla_mm.apis', 'kcla_mm.model_zoo',
                         'kcla_mm.analysis'))
    ]
    assert lazy == []


def test_import_time_is_the_upstream_packages():
    """kcla_mm's own modules take a small share of ``import kcla_mm``
    (a ratio within one run; ``python -X importtime -c 'import kcla_mm'``
    shows the figures)."""
    log = run_probe('import kcla_mm', '-X', 'importtime').stderr
    own_us = total_us = 0
    for line in log.splitlines():
        if not line.startswith('import time:') or 'self [us]' in line:
            continue
        self_us, cumulative_us, name = line[len('import time:'):].split('|')
        if name.strip().startswith('kcla_mm'):
            own_us += int(self_us)
        if name.strip() == 'kcla_mm':
            total_us = int(cumulative_us)
    assert total_us > 0
    assert own_us < 0.1 * total_us, (own_us, total_us)


def test_backbones_all_is_the_registered_backbones():
    """``kcla_mm.models.backbones.__all__`` is the public surface: every
    backbone class kcla_mm registers in mmdet's or mmseg's MODELS, and
    nothing else (the mixins and the machinery stay internal)."""
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG

    import kcla_mm.models.backbones as backbones
    registered = {
        cls
        for registry in (DET, SEG)
        for cls in registry.module_dict.values()
        if cls.__module__.startswith('kcla_mm.models.backbones.')
    }
    public = {getattr(backbones, name) for name in backbones.__all__}
    unregistered = sorted(c.__name__ for c in public - registered)
    unlisted = sorted(c.__name__ for c in registered - public)
    assert not unregistered and not unlisted, (unregistered, unlisted)
