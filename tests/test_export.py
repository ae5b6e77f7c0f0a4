"""Export to ONNX (checked in onnxruntime), TorchScript and torch.export
(issue 30): every model family, parity with PyTorch and with the official
model, and the errors of bad input."""
import importlib.util
import os
import os.path as osp
import sys

import pytest
import torch
import torch.nn as nn
from mmdet.registry import MODELS as MMDET_MODELS

from kcla_mm.models.layers import KCLALayer
from helpers import (ROOT, assert_usage_error, assert_written_with_open_mode,
                     load_tool, requires_mmpretrain, run)
from official_reference import OfficialKCLAResNet, randomise_

HAS_ONNX = all(
    importlib.util.find_spec(m) is not None for m in ('onnx', 'onnxruntime'))
requires_onnx = pytest.mark.skipif(
    not HAS_ONNX,
    reason='onnx and onnxruntime (the deploy extra: pip install '
    'kcla_mm[deploy]) are not installed')
# torch 2.1's torch.export runs dynamo, which cannot trace the layer
# dispatch (as for torch.compile, tests/test_torch_compile.py); torch >= 2.3
# folds it (torch.compiler.is_compiling / is_exporting).
HAS_TORCH_EXPORT = hasattr(torch, 'export') and hasattr(
    torch.compiler, 'is_compiling')

UNET = 'configs/kcla/unet_kcla-r18_isic2018-256x256.py'
UNET_LA = 'configs/baselines/unet_la-r18_isic2018-256x256.py'
UNET_MRLA = 'configs/baselines/unet_mrla-light-r18_isic2018-256x256.py'
WARMSTART = 'configs/kcla/faster-rcnn_kcla-r50-warmstart_fpn_1x_coco.py'
CIFAR = 'configs/kcla/kcla-r56_1xb128_cifar10.py'
DEEPLAB = 'configs/kcla/deeplabv3plus_kcla-r50-d8_kvasir-seg-256x256.py'
PAPER_UNET = 'configs/kcla/unet-kcla-paper_isic2018-256x256.py'


def config(path):
    return osp.join(ROOT, path)


def export_and_verify(path,
                      out,
                      shape,
                      checkpoint=None,
                      backbone=False,
                      dynamic=True,
                      batch=1):
    """Exports, verifies in onnxruntime and returns (exportable,
    parity records)."""
    from kcla_mm.deployment import build_exportable, export_onnx, verify_onnx
    exportable = build_exportable(config(path), checkpoint, backbone)
    export_onnx(exportable, str(out), shape, batch, dynamic)
    records = verify_onnx(exportable, str(out), shape, batch, dynamic)
    # Dynamic: a second batch and size, and a third size where the model
    # takes it.
    shapes = {r.input_shape for r in records}
    assert len(shapes) in ((2, 3) if dynamic else (1, ))
    assert len(records) == len(exportable.output_names) * len(shapes)
    assert all(r.relative <= 1e-4 for r in records)
    return exportable, records


def kcla_layers(module):
    return [m for m in module.modules() if isinstance(m, KCLALayer)]


def assert_attention_ops(path, module):
    """The graph holds every KCLA layer's gate (Sigmoid) and layer weight
    (Exp, also one per state re-normalisation): the kernels did not turn
    into constants."""
    from kcla_mm.deployment import graph_op_counts
    layers = kcla_layers(module)
    assert layers
    counts = graph_op_counts(str(path))
    renorms = sum(layer.renorm for layer in layers)
    assert counts.get('Sigmoid', 0) >= len(layers)
    assert counts.get('Exp', 0) >= len(layers) + renorms
    assert counts.get('ReduceL2', 0) + counts.get('Pow', 0) > 0


@requires_onnx
@pytest.mark.parametrize('path', [UNET, UNET_LA, UNET_MRLA])
def test_backbone_of_a_config_exports_its_out_indices(path, tmp_path):
    exportable, _ = export_and_verify(
        path, tmp_path / 'b.onnx', (64, 64), backbone=True)
    assert exportable.kind == 'backbone'
    assert exportable.output_names == ('feat0', 'feat1', 'feat2', 'feat3')
    import onnx
    graph = onnx.load(str(tmp_path / 'b.onnx')).graph
    assert [o.name for o in graph.output] == list(exportable.output_names)
    if path == UNET:
        assert_attention_ops(tmp_path / 'b.onnx', exportable.module)


@requires_onnx
def test_paper_unet_exports_for_every_size(tmp_path):
    """The paper's decoder pads or crops each upsampled map to its skip's
    size. An export at 64x64 with --dynamic used to crop one pixel off
    where a stage's size is odd (an exported graph divides integers by
    truncating; 1e-3 of the output scale off at 104x136) and to fail at
    sizes that need a crop (50x70): verification now runs at a size of
    odd stages, and the graph matches at others."""
    from kcla_mm.deployment import compare, onnxruntime_runner
    out = tmp_path / 'paper.onnx'
    exportable, records = export_and_verify(PAPER_UNET, out, (64, 64))
    assert {r.input_shape
            for r in records} == {(1, 3, 64, 64), (2, 3, 96, 128),
                                  (1, 3, 104, 136)}
    compare(exportable.module, onnxruntime_runner(str(out)),
            exportable.output_names, [(1, 3, 50, 70), (2, 3, 72, 88)])


@requires_onnx
def test_segmentor_exports_its_tensor_logits(tmp_path):
    exportable, records = export_and_verify(UNET, tmp_path / 's.onnx',
                                            (64, 64))
    assert exportable.kind == 'segmentor'
    assert exportable.output_names == ('seg_logits', )
    assert {r.input_shape
            for r in records} == {(1, 3, 64, 64), (2, 3, 96, 128),
                                  (1, 3, 104, 136)}
    assert_attention_ops(tmp_path / 's.onnx', exportable.module)


class Divisible16(nn.Module):
    """A model that, as mmseg's UNet backbone, refuses sizes not divisible
    by 16."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        if x.shape[2] % 16 or x.shape[3] % 16:
            raise ValueError('the input size must be divisible by 16')
        return (self.conv(x), )


@requires_onnx
def test_verification_leaves_out_the_size_the_model_refuses(tmp_path):
    from kcla_mm.deployment import Exportable, export_onnx, verify_onnx
    exportable = Exportable(Divisible16().eval(), 'backbone', ('out', ),
                            'a test model')
    out = str(tmp_path / 'd.onnx')
    export_onnx(exportable, out, (32, 32), dynamic=True)
    records = verify_onnx(exportable, out, (32, 32), dynamic=True)
    assert [r.input_shape for r in records] == [(1, 3, 32, 32), (2, 3, 64, 96)]


@requires_onnx
@pytest.mark.slow
def test_deeplabv3plus_exports(tmp_path):
    export_and_verify(DEEPLAB, tmp_path / 'd.onnx', (64, 64), dynamic=False)


@requires_onnx
def test_warm_start_detector_exports_backbone_and_neck(tmp_path):
    """The zero-start branch (branch_scale 0) exports as initialised and
    after training moved the scale off zero."""
    exportable, _ = export_and_verify(WARMSTART, tmp_path / 'd.onnx', (64, 96))
    assert exportable.kind == 'detector'
    assert exportable.output_names == tuple(f'neck{i}' for i in range(5))
    layers = kcla_layers(exportable.module)
    assert all(layer.branch_scale is not None for layer in layers)
    assert_attention_ops(tmp_path / 'd.onnx', exportable.module)
    # As after training: a non-zero branch changes the output.
    from kcla_mm.deployment import export_onnx, verify_onnx
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in layers:
            layer.branch_scale.copy_(
                torch.rand(layer.branch_scale.shape, generator=gen))
    export_onnx(exportable, str(tmp_path / 'd2.onnx'), (64, 96), 1, True)
    records = verify_onnx(exportable, str(tmp_path / 'd2.onnx'), (64, 96), 1,
                          True)
    assert max(r.relative for r in records) <= 1e-4


@requires_onnx
@requires_mmpretrain
def test_classifier_exports_its_logits(tmp_path):
    exportable, _ = export_and_verify(CIFAR, tmp_path / 'c.onnx', (32, 32))
    assert exportable.kind == 'classifier'
    assert exportable.output_names == ('logits', )
    assert_attention_ops(tmp_path / 'c.onnx', exportable.module)


def test_traced_layers_run_the_reference_equations():
    """'auto' and 'recompute' step aside while traced; 'fused' asked for
    stays (FLOP counts trace it), 'compiled' asked for refuses
    (test_kcla_dispatch)."""
    from kcla_mm.models import KCLAResNet
    torch.manual_seed(0)
    model = KCLAResNet(depth=18, base_channels=16, head_dim=8)
    x = torch.rand(1, 3, 32, 32)
    for implementation, want in [('auto', 'reference'),
                                 ('recompute', 'reference'),
                                 ('fused', 'fused')]:
        for train in (False, True):
            model.train(train)
            for layer in kcla_layers(model):
                layer.implementation = implementation
            torch.jit.trace(model, (x, ), check_trace=False)
            assert {m.last_implementation
                    for m in kcla_layers(model)} == {want}


@requires_onnx
@pytest.mark.parametrize('implementation', ['compiled', 'fused'])
def test_compiled_and_fused_layers_export_and_keep_their_implementation(
        implementation, tmp_path):
    from kcla_mm.deployment import build_exportable, export_onnx, verify_onnx
    exportable = build_exportable(config(UNET), None, True)
    layers = kcla_layers(exportable.module)
    for layer in layers:
        layer.implementation = implementation
    export_onnx(exportable, str(tmp_path / 'b.onnx'), (64, 64), dynamic=True)
    assert all(layer.implementation == implementation for layer in layers)
    assert all(layer.last_implementation == 'reference' for layer in layers)
    verify_onnx(exportable, str(tmp_path / 'b.onnx'), (64, 64), dynamic=True)
    assert_attention_ops(tmp_path / 'b.onnx', exportable.module)


@requires_onnx
def test_a_constant_output_fails_verification():
    from kcla_mm.deployment import ExportError, compare
    model = nn.Conv2d(3, 4, 3)
    frozen = model(torch.zeros(1, 3, 8, 8)).detach()
    with pytest.raises(ExportError, match='output out .*constant'):
        compare(
            lambda x: (model(x), ),
            lambda x: [frozen], ['out'], [(1, 3, 8, 8)],
            tolerance=1e9)
    with pytest.raises(ExportError, match='max abs difference'):
        compare(lambda x: (model(x), ), lambda x: [model(x) + 1], ['out'],
                [(1, 3, 8, 8)])


def save_official_backbone(tmp_path):
    """An official R50 (random, BN statistics included) converted with
    kcla_official2mm.py; returns the official model and the checkpoint."""
    from test_checkpoints import save_official
    official = randomise_(OfficialKCLAResNet(50)).eval()
    save_official(official, tmp_path / 'official.pth')
    run(sys.executable, 'tools/model_converters/kcla_official2mm.py',
        tmp_path / 'official.pth', tmp_path / 'kcla.pth')
    return official, tmp_path / 'kcla.pth'


@requires_onnx
def test_converted_official_r50_at_224_matches_the_official_model(tmp_path):
    """The independent reference: the official model's own eval output."""
    from kcla_mm.deployment import (build_exportable, export_onnx,
                                    onnxruntime_runner)
    official, ckpt = save_official_backbone(tmp_path)
    cfg = tmp_path / 'kcla_r50.py'
    cfg.write_text("default_scope = 'mmdet'\n"
                   "custom_imports = dict(imports=['kcla_mm'])\n"
                   "model = dict(backbone=dict(type='KCLAResNet', "
                   'depth=50))\n')
    exportable = build_exportable(str(cfg), str(ckpt), True)
    out = tmp_path / 'r50.onnx'
    export_onnx(exportable, str(out), (224, 224))
    x = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    got = onnxruntime_runner(str(out))(x)
    with torch.no_grad():
        want = official.stages(x)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        diff = (torch.from_numpy(g) - w).abs().max()
        assert diff <= 1e-4 * w.abs().max()


@requires_onnx
@requires_mmpretrain
def test_converted_official_classifier_gives_the_official_logits(tmp_path):
    from test_checkpoints import save_official

    from kcla_mm.deployment import (build_exportable, export_onnx,
                                    onnxruntime_runner)
    official = randomise_(OfficialKCLAResNet(50)).eval()
    save_official(official, tmp_path / 'official.pth')
    run(sys.executable, 'tools/model_converters/kcla_official2mm.py',
        '--with-head', tmp_path / 'official.pth', tmp_path / 'cls.pth')
    exportable = build_exportable(
        config('configs/kcla/kcla-r50_8xb32_in1k.py'),
        str(tmp_path / 'cls.pth'))
    out = tmp_path / 'cls.onnx'
    export_onnx(exportable, str(out), (96, 64), dynamic=True)
    x = torch.rand(2, 3, 128, 96, generator=torch.Generator().manual_seed(0))
    got = torch.from_numpy(onnxruntime_runner(str(out))(x)[0])
    with torch.no_grad():
        want = official(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


# The tool, and bad input.


@requires_onnx
def test_tool_exports_and_verifies_without_a_checkpoint(tmp_path, capsys):
    tool = load_tool('tools/deployment/pytorch2onnx.py')
    out = tmp_path / 'u.onnx'
    assert tool.main([
        config(UNET), '--out',
        str(out), '--shape', '64', '64', '--batch', '2', '--dynamic',
        '--verify'
    ]) == 0
    printed = capsys.readouterr().out
    assert 'No checkpoint given: exporting the initialised model' in printed
    assert ('Verified in onnxruntime at 3 input shape(s): within 0.0001 of '
            'the output scale\n') in printed
    assert 'seg_logits at 3x3x96x128' in printed
    assert os.listdir(tmp_path) == ['u.onnx']


def failing_tool(tmp_path, capsys, *argv):
    tool = load_tool('tools/deployment/pytorch2onnx.py')
    assert tool.main([str(a) for a in argv]) == 1
    return capsys.readouterr().err


def write_config(tmp_path, text):
    path = tmp_path / 'cfg.py'
    path.write_text("default_scope = 'mmdet'\n"
                    "custom_imports = dict(imports=['kcla_mm'])\n" + text)
    return path


@requires_onnx
def test_unknown_model_kind_is_named(tmp_path, capsys):
    cfg = write_config(tmp_path, "model = dict(type='KCLAResNet', depth=18)")
    err = failing_tool(tmp_path, capsys, cfg, '--out', tmp_path / 'x.onnx',
                       '--shape', 32, 32)
    assert "model type 'KCLAResNet'" in err and 'not a kind' in err
    cfg = write_config(tmp_path, "model = dict(type='NoSuchDetector')")
    err = failing_tool(tmp_path, capsys, cfg, '--out', tmp_path / 'x.onnx',
                       '--shape', 32, 32)
    assert "cannot build model type 'NoSuchDetector'" in err
    assert sorted(os.listdir(tmp_path)) == ['cfg.py']


@requires_onnx
@pytest.mark.parametrize(
    'text, message',
    [('model = dict(type=', 'cannot be read: SyntaxError'),
     ("_base_ = 'no_such_base.py'\nmodel = dict()", 'cannot be read: '),
     ("model = dict(type='KCLAResNet', depth=18, bogus_arg=1)",
      "cannot build model type 'KCLAResNet' in scope 'mmdet' (TypeError: "),
     ("model = dict(type='EncoderDecoder')", "cannot build model type "
      "'EncoderDecoder'")])
def test_a_config_that_cannot_give_a_model_is_named(tmp_path, capsys, text,
                                                    message):
    """One line naming the config, not a traceback."""
    cfg = write_config(tmp_path, text)
    err = failing_tool(tmp_path, capsys, cfg, '--out', tmp_path / 'x.onnx',
                       '--shape', 32, 32)
    assert err.startswith(f'error: config {cfg}')
    assert message in err
    assert sorted(os.listdir(tmp_path)) == ['cfg.py']


@pytest.mark.parametrize('argv, message', [
    (['--batch', '-1'], '--batch -1: not an integer >= 1'),
    (['--shape', '-1', '64'], '--shape -1: not an integer >= 1'),
])
def test_a_size_below_one_is_refused_by_the_tool(tmp_path, capsys, argv,
                                                 message):
    tool = load_tool('tools/deployment/pytorch2onnx.py')
    with pytest.raises(SystemExit) as error:
        tool.parse_args([
            config(UNET), '--out',
            str(tmp_path / 'x.onnx'), '--shape', '32', '32', *argv
        ])
    assert error.value.code == 2
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


class VecdotBackbone(nn.Module):
    """A backbone with an op that the TorchScript ONNX exporter has no
    symbolic for."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return (torch.linalg.vecdot(y, y, dim=1)[:, None], )


@requires_onnx
def test_op_without_symbolic_is_named_and_leaves_no_file(tmp_path, capsys):
    MMDET_MODELS.register_module(
        'ExportTestVecdot', module=VecdotBackbone, force=True)
    cfg = write_config(tmp_path,
                       "model = dict(backbone=dict(type='ExportTestVecdot'))")
    err = failing_tool(tmp_path, capsys, cfg, '--backbone', '--out',
                       tmp_path / 'x.onnx', '--shape', 16, 16)
    assert 'cannot be exported to ONNX' in err
    assert 'linalg_vecdot' in err
    assert sorted(os.listdir(tmp_path)) == ['cfg.py']


@requires_onnx
def test_checkpoint_that_does_not_match_is_named(tmp_path, capsys):
    cfg = write_config(
        tmp_path, "model = dict(backbone=dict(type='KCLAResNet', depth=18,"
        ' base_channels=16, head_dim=8))')
    torch.manual_seed(0)
    from kcla_mm.models import KCLAResNet
    state = KCLAResNet(depth=18, base_channels=32, head_dim=8).state_dict()
    torch.save({'state_dict': state}, tmp_path / 'wide.pth')
    err = failing_tool(tmp_path, capsys, cfg, tmp_path / 'wide.pth',
                       '--backbone', '--out', tmp_path / 'x.onnx', '--shape',
                       32, 32)
    assert f'checkpoint {tmp_path / "wide.pth"} does not match' in err
    assert ('of another shape: conv1.weight (32, 3, 7, 7) in the checkpoint,'
            ' (16, 3, 7, 7) in the model, ') in err
    assert 'missing' not in err and 'unexpected' not in err
    del state['conv1.weight']
    torch.save({'state_dict': state}, tmp_path / 'missing.pth')
    err = failing_tool(tmp_path, capsys, cfg, tmp_path / 'missing.pth',
                       '--backbone', '--out', tmp_path / 'x.onnx', '--shape',
                       32, 32)
    assert ': missing: conv1.weight; of another shape: ' in err
    # A whole model's weights under an unknown prefix: every key is
    # missing and unexpected; the message counts them and names three.
    small = KCLAResNet(depth=18, base_channels=16, head_dim=8).state_dict()
    torch.save({'state_dict': {
        f'encoder.{k}': v
        for k, v in small.items()
    }}, tmp_path / 'prefixed.pth')
    err = failing_tool(tmp_path, capsys, cfg, tmp_path / 'prefixed.pth',
                       '--backbone', '--out', tmp_path / 'x.onnx', '--shape',
                       32, 32)
    first = list(small)[:3]
    assert (f'missing: {", ".join(first)}, ... ({len(small)} in all); '
            f'unexpected: {", ".join("encoder." + k for k in first)}, ... '
            f'({len(small)} in all)') in err
    assert 'encoder.layer4' not in err
    # A key that is not a name is named, not a crash.
    torch.save({'state_dict': {
        **small, 0: torch.zeros(1)
    }}, tmp_path / 'indexed.pth')
    err = failing_tool(tmp_path, capsys, cfg, tmp_path / 'indexed.pth',
                       '--backbone', '--out', tmp_path / 'x.onnx', '--shape',
                       32, 32)
    assert ('indexed.pth: state_dict keys that are not parameter names: '
            '[0]') in err
    err = failing_tool(tmp_path, capsys, cfg, tmp_path / 'absent.pth',
                       '--backbone', '--out', tmp_path / 'x.onnx', '--shape',
                       32, 32)
    assert f'checkpoint {tmp_path / "absent.pth"} does not exist' in err
    assert not (tmp_path / 'x.onnx').exists()


@requires_onnx
def test_output_that_cannot_be_written_is_named(tmp_path, capsys):
    cfg = write_config(
        tmp_path, "model = dict(backbone=dict(type='KCLAResNet', depth=18,"
        ' base_channels=16, head_dim=8))')
    args = ('--backbone', '--shape', 32, 32)
    out = tmp_path / 'no' / 'x.onnx'
    err = failing_tool(tmp_path, capsys, cfg, '--out', out, *args)
    assert f'output {out}: folder {tmp_path / "no"} does not exist' in err
    (tmp_path / 'dir.onnx').mkdir()
    err = failing_tool(tmp_path, capsys, cfg, '--out', tmp_path / 'dir.onnx',
                       *args)
    assert 'is a folder' in err
    (tmp_path / 'file').write_text('')
    err = failing_tool(tmp_path, capsys, cfg, '--out',
                       tmp_path / 'file' / 'x.onnx', *args)
    assert 'does not exist' in err
    assert sorted(os.listdir(tmp_path)) == ['cfg.py', 'dir.onnx', 'file']


@requires_onnx
@pytest.mark.parametrize('umask', [0o022, 0o027], ids=['022', '027'])
def test_exported_file_has_the_mode_of_a_plain_open(tmp_path, capsys, umask):
    cfg = write_config(
        tmp_path, "model = dict(backbone=dict(type='KCLAResNet', depth=18,"
        ' base_channels=16, head_dim=8))')
    tool = load_tool('tools/deployment/pytorch2onnx.py')

    def export():
        assert tool.main([
            str(cfg), '--backbone', '--out',
            str(tmp_path / 'b.onnx'), '--shape', '32', '32'
        ]) == 0
        return tmp_path / 'b.onnx'

    assert_written_with_open_mode(export, umask, tmp_path)


@requires_onnx
def test_a_failure_while_writing_leaves_no_partial_file(tmp_path, monkeypatch):
    from kcla_mm.deployment import ExportError, build_exportable, export_onnx
    exportable = build_exportable(config(UNET), None, True)
    (tmp_path / 'x.onnx').write_bytes(b'old')

    def half_written(model, args, f, **kwargs):
        with open(f, 'wb') as file:
            file.write(b'partial')
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(torch.onnx, 'export', half_written)
    with pytest.raises(ExportError, match='No space left on device'):
        export_onnx(exportable, str(tmp_path / 'x.onnx'), (32, 32))
    assert os.listdir(tmp_path) == ['x.onnx']
    assert (tmp_path / 'x.onnx').read_bytes() == b'old'


@requires_onnx
def test_a_graph_that_fails_its_check_does_not_replace_the_output(tmp_path):
    """The tool's --verify runs on the written file before it takes the
    output's name: a failed verification leaves what was there."""
    from kcla_mm.deployment import ExportError, build_exportable, export_onnx
    exportable = build_exportable(config(UNET), None, True)
    (tmp_path / 'x.onnx').write_bytes(b'old')
    checked = []

    def refuse(path):
        checked.append(os.path.getsize(path))
        raise ExportError('output 0 differs')

    with pytest.raises(ExportError, match='output 0 differs'):
        export_onnx(
            exportable, str(tmp_path / 'x.onnx'), (32, 32), check=refuse)
    assert checked and checked[0] > 0
    assert os.listdir(tmp_path) == ['x.onnx']
    assert (tmp_path / 'x.onnx').read_bytes() == b'old'


# TorchScript and torch.export.


def small_backbone_exportable():
    from kcla_mm.deployment import build_exportable
    return build_exportable(config(UNET), None, True)


def test_torchscript_trace_of_the_backbone_matches_eager():
    from kcla_mm.deployment import compare, trace_torchscript
    exportable = small_backbone_exportable()
    traced = trace_torchscript(exportable, (64, 64))
    records = compare(exportable.module, traced, exportable.output_names,
                      [(1, 3, 64, 64), (2, 3, 96, 128)])
    assert max(r.relative for r in records) <= 1e-4
    assert 'aten::sigmoid' in str(traced.inlined_graph)


@requires_mmpretrain
def test_torchscript_trace_of_the_classifier_matches_eager():
    from kcla_mm.deployment import build_exportable, compare, trace_torchscript
    exportable = build_exportable(config(CIFAR))
    traced = trace_torchscript(exportable, (32, 32))
    records = compare(exportable.module, traced, ('logits', ),
                      [(1, 3, 32, 32), (3, 3, 32, 32)])
    assert max(r.relative for r in records) <= 1e-4


@pytest.mark.skipif(
    not HAS_TORCH_EXPORT,
    reason=f'torch.export of KCLA layers needs torch >= 2.3; torch '
    f"{torch.__version__}'s dynamo cannot trace the layer dispatch")
@pytest.mark.parametrize('family', [
    'backbone',
    pytest.param('classifier', marks=requires_mmpretrain),
])
def test_torch_export_matches_eager(family):
    from kcla_mm.deployment import build_exportable, compare, export_program
    if family == 'backbone':
        exportable, shape = small_backbone_exportable(), (64, 64)
    else:
        exportable, shape = build_exportable(config(CIFAR)), (32, 32)
    program = export_program(exportable, shape)
    module = program.module()
    records = compare(exportable.module, module, exportable.output_names,
                      [(1, 3, *shape)])
    assert max(r.relative for r in records) <= 1e-4


@requires_onnx
def test_onnx_benchmark_prints_the_ratio(capsys):
    tool = load_tool('tools/analysis/benchmark_onnx.py')
    tool.main([
        '--depth', '18', '--shapes', '32x32', '--threads', '1', '--iters', '1',
        '--warmup', '0'
    ])
    out = capsys.readouterr().out
    assert 'eval 1x3x32x32, 1 thread: ResNet-18' in out
    assert 'KCLA-ResNet-18' in out and 'ratio' in out


@pytest.mark.parametrize('argv, message', [
    (['--iters', '0'], '--iters 0: not an integer >= 1'),
    (['--warmup', '-1'], '--warmup -1: not an integer >= 0'),
    (['--threads', '1', '-2'], '--threads -2: not an integer >= 0'),
])
def test_onnx_benchmark_refuses_bad_counts(capsys, argv, message):
    """--iters 0 ended in a StatisticsError after the exports."""
    assert_usage_error('tools/analysis/benchmark_onnx.py', argv, message,
                       capsys)
