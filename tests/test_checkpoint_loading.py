"""Loading a checkpoint through kcla_mm's tools (test, train --resume and
load_from, infer, publish, the official converter, the analysis tools): a
file that is missing, a directory, empty, truncated, random bytes, JSON, an
image, holds a type weights_only loading refuses, or holds NaN/Inf tensors
is refused in one line naming the file and the cause, with no traceback and
no advice to turn weights_only off (issue 25)."""
import json
import os
import pickle
import random
import sys
import textwrap

import mmcv
import numpy as np
import pytest
import torch

from kcla_mm.torch_compat import WEIGHTS_ONLY_ALLOW_LIST
from kcla_mm.utils import checkpoint_loading as loading
from helpers import load_tool, run

DEMO_CONFIG = 'configs/kcla/demo/faster-rcnn_kcla-r18_fpn_synthetic-coco.py'
SEG_CONFIG = 'configs/kcla/unet_kcla-r18_isic2017-256x256.py'
# The tensors the corrupted checkpoints damage: a KCLA layer's weight, a
# BN buffer, an SGD momentum buffer.
NAN_KEY = 'backbone.layer1.0.kcla.query_conv.weight'
INF_KEY = 'backbone.bn1.running_var'
# torch's advice, in the spellings of torch 2.1 and 2.13.
ADVICE = ('weights_only=False', 'weights_only` set to `False',
          'add_safe_globals')


def small_config(repo_root) -> str:
    """The demo detector on 64x64 images, no loader workers."""
    return textwrap.dedent(f"""\
        _base_ = '{os.path.join(repo_root, DEMO_CONFIG)}'
        train_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True),
            dict(type='Resize', scale=(64, 64), keep_ratio=True),
            dict(type='PackDetInputs')
        ]
        test_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(64, 64), keep_ratio=True),
            dict(type='LoadAnnotations', with_bbox=True),
            dict(type='PackDetInputs',
                 meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                            'scale_factor'))
        ]
        train_dataloader = dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            dataset=dict(pipeline=train_pipeline))
        val_dataloader = dict(
            batch_size=1, num_workers=0, persistent_workers=False,
            dataset=dict(pipeline=test_pipeline))
        test_dataloader = val_dataloader
        train_cfg = dict(max_epochs=1)
        """)


def save_module_global(path):
    """A checkpoint pickling a class that the loading process cannot
    import: refused by weights_only (torch >= 2.6), not unpicklable for
    torch < 2.6's full unpickling."""
    import types
    module = types.ModuleType('kcla_no_such_module')

    class Thing:
        pass

    Thing.__module__ = module.__name__
    Thing.__qualname__ = 'Thing'
    module.Thing = Thing
    sys.modules[module.__name__] = module
    try:
        torch.save(dict(state_dict={'w': torch.ones(1)}, meta=Thing()), path)
    finally:
        del sys.modules[module.__name__]


@pytest.fixture(scope='module')
def bench(tmp_path_factory, repo_root):
    """One real training checkpoint of the shrunk demo detector (optimizer,
    schedulers, MessageHub), and files made from it and beside it."""
    root = tmp_path_factory.mktemp('checkpoint_loading')
    data = root / 'coco'
    run(sys.executable, 'tools/misc/make_synthetic_coco.py', data, '--train',
        '2', '--val', '1', '--size', '64', '--seed', '0')
    config = root / 'small.py'
    config.write_text(small_config(repo_root))
    work = root / 'work'
    run(sys.executable, 'tools/train.py', config, '--work-dir', work,
        '--cfg-options', f'data_root={data}')
    trained = work / 'epoch_1.pth'
    checkpoint = loading.load_checkpoint(str(trained))
    assert NAN_KEY in checkpoint['state_dict']
    assert INF_KEY in checkpoint['state_dict']

    files = dict(good=trained, config=config, data=data)

    def damaged(name, edit):
        ckpt = loading.load_checkpoint(str(trained))
        edit(ckpt)
        torch.save(ckpt, root / name)
        files[name] = root / name

    damaged(
        'nan_weight.pth',
        lambda c: c['state_dict'][NAN_KEY].view(-1).__setitem__(
            0, float('nan')))
    damaged('inf_bn.pth',
            lambda c: c['state_dict'][INF_KEY].__setitem__(1, float('inf')))
    damaged(
        'nan_momentum.pth', lambda c: c['optimizer']['state'][0][
            'momentum_buffer'].view(-1).__setitem__(0, float('nan')))
    raw = trained.read_bytes()
    files['truncated.pth'] = root / 'truncated.pth'
    files['truncated.pth'].write_bytes(raw[:len(raw) // 2])
    files['random.pth'] = root / 'random.pth'
    files['random.pth'].write_bytes(random.Random(0).randbytes(4096))
    files['empty.pth'] = root / 'empty.pth'
    files['empty.pth'].write_bytes(b'')
    files['notes.json'] = root / 'notes.json'
    files['notes.json'].write_text(json.dumps({'state_dict': [1, 2]}))
    files['image.png'] = root / 'image.png'
    mmcv.imwrite(np.zeros((8, 8, 3), np.uint8), str(files['image.png']))
    files['plain.pkl'] = root / 'plain.pkl'
    files['plain.pkl'].write_bytes(
        pickle.dumps({'state_dict': {
            'w': [1.0]
        }}, protocol=2))
    files['folder.pth'] = root / 'folder.pth'
    files['folder.pth'].mkdir()
    files['missing.pth'] = root / 'missing.pth'
    files['foreign_type.pth'] = root / 'foreign_type.pth'
    save_module_global(files['foreign_type.pth'])
    files['image'] = root / 'photo.jpg'
    mmcv.imwrite((np.random.default_rng(0).random(
        (64, 64, 3)) * 255).astype(np.uint8), str(files['image']))
    return files


# name -> what the one-line error must say besides the path (publish and
# the converter word the verdict themselves: "is not a PyTorch checkpoint
# that loads with ..." / "is not a loadable torch checkpoint").
BAD_FILES = {
    'nan_weight.pth': f'state_dict.{NAN_KEY} (1 NaN)',
    'inf_bn.pth': f'state_dict.{INF_KEY} (1 Inf)',
    'nan_momentum.pth': 'optimizer.state.0.momentum_buffer (1 NaN)',
    'truncated.pth': 'truncated or damaged zip archive',
    'random.pth': 'unknown binary data',
    'empty.pth': 'an empty file',
    'notes.json': 'JSON text',
    'image.png': 'a PNG image',
    'plain.pkl': 'a pickle that torch.save did not write',
    'folder.pth': 'a directory, not a checkpoint file',
    'missing.pth': 'no such file',
    # weights_only refuses the class by name (torch >= 2.6); torch < 2.6
    # unpickles in full, as mmengine does there, and cannot import it.
    'foreign_type.pth': 'kcla_no_such_module',
}
FOREIGN = ('truncated.pth', 'random.pth', 'empty.pth', 'notes.json',
           'image.png', 'plain.pkl')


def assert_one_line_error(output: str, path, message: str) -> None:
    """``output`` (stderr) refuses ``path`` in one ``error:`` line that says
    ``message``, with no traceback and no weights_only advice."""
    errors = [line for line in output.splitlines() if 'error: ' in line]
    assert len(errors) == 1, output[-3000:]
    assert errors[0].startswith(f'error: {path}'), errors[0]
    assert message in errors[0], errors[0]
    assert 'Traceback' not in output, output[-3000:]
    for advice in ADVICE:
        assert advice not in output, output[-3000:]


@pytest.mark.parametrize('name', sorted(BAD_FILES))
@pytest.mark.slow
def test_load_checkpoint_refuses_in_one_line(bench, name):
    path = str(bench[name])
    with pytest.raises(loading.CheckpointError) as info:
        loading.load_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f'{path}: ') and '\n' not in message
    assert BAD_FILES[name] in message
    if name in FOREIGN:
        assert f'{path}: not a PyTorch checkpoint (' in message
    if name == 'foreign_type.pth' and WEIGHTS_ONLY_ALLOW_LIST:
        assert ('it holds kcla_no_such_module.Thing, which '
                'torch.load(weights_only=True) refuses') in message
    assert info.value.path == path
    assert not any(advice in message for advice in ADVICE)
    # Nor does a traceback show torch's error (and its advice) as the cause.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__
    nonfinite = name.startswith(('nan', 'inf'))
    assert isinstance(info.value,
                      loading.NonFiniteCheckpointError) == nonfinite
    assert isinstance(info.value, loading.CheckpointFileError) != nonfinite


def test_weights_only_refusal_names_the_type_on_every_torch(bench):
    """An importable type the allow-list does not hold (argparse.Namespace)
    and a reference to os.system: weights_only refuses them by name."""
    import argparse
    path = bench['good'].parent / 'namespace.pth'
    torch.save(
        dict(state_dict={'w': torch.ones(1)}, meta=argparse.Namespace()), path)
    with pytest.raises(
            loading.CheckpointFileError,
            match='it holds argparse.Namespace, which '
            r'torch.load\(weights_only=True\) refuses') as info:
        loading.load_checkpoint(str(path), weights_only=True)
    assert not any(advice in str(info.value) for advice in ADVICE)
    path = bench['good'].parent / 'system.pth'
    torch.save(dict(meta=dict(hook=os.system)), path)
    with pytest.raises(
            loading.CheckpointFileError, match=r'it holds \w+\.system'):
        loading.load_checkpoint(str(path), weights_only=True)
    # A numpy scalar of a dtype that mmengine's logs do not use: torch
    # >= 2.6 names its dtype class in another sentence.
    path = bench['good'].parent / 'uint8.pth'
    torch.save(dict(meta=dict(count=np.uint8(3))), path)
    with pytest.raises(
            loading.CheckpointFileError,
            match=r'it holds numpy\.[\w.]+, which '
            r'torch.load\(weights_only=True\) refuses'):
        loading.load_checkpoint(str(path), weights_only=True)
    if WEIGHTS_ONLY_ALLOW_LIST:  # the default there
        with pytest.raises(
                loading.CheckpointFileError, match='argparse.Namespace'):
            loading.load_checkpoint(
                str(bench['good'].parent / 'namespace.pth'))


def test_good_checkpoint_loads_and_probe_reads_no_tensors(bench):
    checkpoint = loading.load_checkpoint(str(bench['good']))
    assert {'meta', 'state_dict', 'optimizer',
            'message_hub'} <= set(checkpoint)
    assert loading.find_nonfinite_tensors(checkpoint) == []
    loading.probe_checkpoint_file(str(bench['good']))
    # NaN and foreign types show only on loading; the file kind before.
    loading.probe_checkpoint_file(str(bench['nan_weight.pth']))
    with pytest.raises(loading.CheckpointFileError, match='truncated'):
        loading.probe_checkpoint_file(str(bench['truncated.pth']))


def test_nonfinite_message_names_the_first_tensors_and_counts_all(tmp_path):
    state = {
        f'layer{i}.weight': torch.full((2, ), float('nan'))
        for i in range(7)
    }
    state['ok'] = torch.ones(2)
    state['half'] = torch.tensor([float('-inf'), 1.0], dtype=torch.half)
    state['steps'] = torch.tensor([3])  # integers cannot be non-finite
    torch.save(dict(state_dict=state), tmp_path / 'many.pth')
    with pytest.raises(loading.NonFiniteCheckpointError) as info:
        loading.load_checkpoint(str(tmp_path / 'many.pth'))
    message = str(info.value)
    assert 'in 8 tensor(s): state_dict.layer0.weight (2 NaN)' in message
    assert 'and 3 more' in message
    assert info.value.keys[-1] == 'state_dict.half'
    assert 'state_dict.ok' not in info.value.keys


def test_mmengine_loading_is_checked_inside_the_context_only(bench):
    from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint
    mmengine_local = CheckpointLoader._schemes['']
    nan = str(bench['nan_weight.pth'])
    with loading.checked_checkpoint_loading():
        with pytest.raises(loading.NonFiniteCheckpointError, match=NAN_KEY):
            _load_checkpoint(nan, map_location='cpu')
        with pytest.raises(loading.CheckpointFileError, match='truncated'):
            _load_checkpoint(str(bench['truncated.pth']))
        with loading.checked_checkpoint_loading():  # nested: still checked
            with pytest.raises(loading.NonFiniteCheckpointError):
                _load_checkpoint(nan)
        with pytest.raises(loading.NonFiniteCheckpointError):
            _load_checkpoint(nan)
    assert CheckpointLoader._schemes[''] is mmengine_local
    # mmengine's own loader, as before: the NaN goes through unnoticed.
    assert torch.isnan(_load_checkpoint(nan)['state_dict'][NAN_KEY]).any()


def test_mmengine_loaders_of_other_schemes_are_checked(bench):
    from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint
    prefix = 'kcla-test-nan://'

    def load_from_kcla_test(filename, map_location):
        return dict(state_dict={'w': torch.tensor([float('nan')])})

    CheckpointLoader.register_scheme(prefix, load_from_kcla_test)
    try:
        with loading.checked_checkpoint_loading():
            with pytest.raises(
                    loading.NonFiniteCheckpointError,
                    match=f'{prefix}x: .*state_dict.w'):
                _load_checkpoint(f'{prefix}x')
        assert CheckpointLoader._schemes[prefix] is load_from_kcla_test
    finally:
        del CheckpointLoader._schemes[prefix]


@pytest.mark.parametrize('name',
                         ['nan_weight.pth', 'inf_bn.pth', 'truncated.pth'])
@pytest.mark.slow
def test_test_tool_refuses(bench, name, tmp_path):
    """tools/test.py used to exit 0 with empty results on NaN weights."""
    result = run(
        sys.executable,
        'tools/test.py',
        bench['config'],
        bench[name],
        '--work-dir',
        tmp_path,
        '--cfg-options',
        f'data_root={bench["data"]}',
        check=False)
    assert result.returncode == 1, result.stdout[-2000:]
    assert_one_line_error(result.stderr, bench[name], BAD_FILES[name])


def _backbone_only(state):
    return {
        k[len('backbone.'):]: v
        for k, v in state.items() if k.startswith('backbone.')
    }


def _one_shape_off(state):
    state = dict(state)
    key = next(k for k in state if k.endswith('conv1.weight'))
    state[key] = state[key][:1]
    return state


@pytest.mark.parametrize('variant, message', [
    (_backbone_only, "it does not hold the weights of this model "),
    (_one_shape_off, 'it does not hold the weights of this model '),
])
@pytest.mark.slow
def test_test_tool_refuses_a_checkpoint_of_another_model(
        bench, tmp_path, variant, message):
    """mmengine loads load_from with strict=False: a backbone's checkpoint
    (what kcla_official2mm.py writes without --with-head) loaded nothing
    into the detector, and test.py reported mAP 0 of an initialised model
    with exit status 0."""
    checkpoint = torch.load(bench['good'], weights_only=False)
    path = tmp_path / 'other.pth'
    torch.save(dict(state_dict=variant(checkpoint['state_dict'])), path)
    result = run(
        sys.executable,
        'tools/test.py',
        bench['config'],
        path,
        '--work-dir',
        tmp_path / 'work',
        '--cfg-options',
        f'data_root={bench["data"]}',
        check=False)
    assert result.returncode == 1, result.stdout[-2000:]
    errors = [line for line in result.stderr.splitlines() if 'error: ' in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(f'error: {path}: {message}'), errors[0]
    if variant is _backbone_only:
        assert "a backbone's checkpoint" in errors[0]
        assert 'missing: backbone.conv1.weight' in errors[0]
    else:
        assert '1 of other shapes: backbone.conv1.weight (1, 3, 7, 7)' in \
            errors[0]


def test_state_dict_mismatch_names_keys_and_shapes():
    from kcla_mm.engine import state_dict_mismatch
    model = {'a.w': torch.ones(2), 'a.b': torch.ones(2)}
    assert state_dict_mismatch(model, dict(model)) is None
    # DataParallel's prefix, as mmengine strips it.
    assert state_dict_mismatch(model, {
        f'module.{k}': v
        for k, v in model.items()
    }) is None
    message = state_dict_mismatch(model, {
        'a.w': torch.ones(3),
        'c': torch.ones(1)
    })
    assert message == (
        'it does not hold the weights of this model (2 tensors): 1 '
        'missing: a.b; 1 keys the model lacks: c; 1 of other shapes: a.w '
        '(3,) (the model: (2,))')


@pytest.mark.parametrize('config, options, message', [
    ('nosuch.py', [], 'No such file or directory'),
    (None, ['--out', 'results.json'], '--out results.json: must end in .pkl'),
    (SEG_CONFIG, ['--out', 'results.pkl'
                  ], '--out is for detection and classification configs'),
    (SEG_CONFIG, [
        '--show-dir', 'vis', '--cfg-options',
        'default_hooks.visualization=None'
    ], '--show-dir needs default_hooks.visualization in the config'),
])
@pytest.mark.slow
def test_test_tool_refuses_options_in_one_line(bench, config, options, message,
                                               tmp_path):
    """test.py's own checks of its options end in one error line (they
    were tracebacks), before any dataset is read."""
    result = run(
        sys.executable,
        'tools/test.py',
        config or bench['config'],
        bench['good'],
        '--work-dir',
        tmp_path,
        *options,
        check=False)
    assert result.returncode == 1, result.stdout[-2000:]
    errors = [line for line in result.stderr.splitlines() if 'error: ' in line]
    assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]
    assert 'Traceback' not in result.stderr


@pytest.mark.parametrize('how,name', [('resume', 'nan_momentum.pth'),
                                      ('resume', 'nan_weight.pth'),
                                      ('resume', 'random.pth'),
                                      ('load_from', 'inf_bn.pth')])
@pytest.mark.slow
def test_train_tool_refuses(bench, how, name, tmp_path):
    """--resume and load_from used to train on loss: nan."""
    extra = (['--resume', bench[name]] if how == 'resume' else [])
    options = [f'data_root={bench["data"]}', 'train_cfg.max_epochs=2']
    if how == 'load_from':
        options.append(f'load_from={bench[name]}')
    result = run(
        sys.executable,
        'tools/train.py',
        bench['config'],
        '--work-dir',
        tmp_path,
        *extra,
        '--cfg-options',
        *options,
        check=False)
    assert result.returncode == 1, result.stdout[-2000:]
    assert_one_line_error(result.stderr, bench[name], BAD_FILES[name])
    assert not (tmp_path / 'epoch_2.pth').exists()


@pytest.mark.parametrize('name', ['nan_weight.pth', 'image.png'])
@pytest.mark.slow
def test_infer_tool_refuses(bench, name, tmp_path):
    result = run(
        sys.executable,
        'tools/infer.py',
        bench['image'],
        bench['config'],
        '--weights',
        bench[name],
        '--out-dir',
        tmp_path / 'out',
        check=False)
    assert result.returncode == 1, result.stdout[-2000:]
    assert_one_line_error(result.stderr, bench[name], BAD_FILES[name])
    assert not (tmp_path / 'out' / 'vis').exists()


def test_inferencer_refuses_nan_weights(bench):
    from kcla_mm.apis import init_inferencer
    with pytest.raises(loading.NonFiniteCheckpointError, match=NAN_KEY):
        init_inferencer(
            str(bench['config']),
            weights=str(bench['nan_weight.pth']),
            device='cpu')


@pytest.mark.parametrize('name', sorted(BAD_FILES))
def test_publish_tool_refuses(bench, name, tmp_path, capsys):
    tool = load_tool('tools/model_converters/publish_model.py')
    code = tool.main([str(bench[name]), str(tmp_path / 'out' / 'x.pth')])
    assert code == 1
    assert_one_line_error(capsys.readouterr().err, bench[name],
                          BAD_FILES[name])
    assert not (tmp_path / 'out').exists() or not os.listdir(tmp_path / 'out')


@pytest.mark.parametrize('name', sorted(BAD_FILES))
def test_official_converter_refuses(bench, name, tmp_path, capsys):
    tool = load_tool('tools/model_converters/kcla_official2mm.py')
    path = bench[name]
    if name.startswith(('nan', 'inf')):
        # Official checkpoints hold no mmengine types: torch < 2.6 loads
        # them with weights_only=True too, and would refuse the MessageHub.
        damaged = loading.load_checkpoint(str(path), check_tensors=False)
        path = tmp_path / name
        torch.save({k: damaged[k] for k in ('state_dict', 'optimizer')}, path)
    code = tool.main([str(path), str(tmp_path / 'o.pth')])
    assert code == 1
    assert_one_line_error(capsys.readouterr().err, path, BAD_FILES[name])
    assert not (tmp_path / 'o.pth').exists()


@pytest.mark.parametrize(
    'name', ['nan_weight.pth', 'truncated.pth', 'foreign_type.pth'])
def test_analysis_tool_refuses(bench, name, tmp_path, capsys):
    tool = load_tool('tools/analysis/layer_weights.py')
    with pytest.raises(SystemExit) as info:
        tool.main([
            str(bench['config']),
            str(bench[name]),
            str(bench['image']), '--out',
            str(tmp_path / 'w.png')
        ])
    assert info.value.code == f'error: {bench[name]}: ' + str(
        load_error(bench[name]).cause)
    assert BAD_FILES[name] in info.value.code
    assert not (tmp_path / 'w.png').exists()


def load_error(path) -> loading.CheckpointError:
    try:
        loading.load_checkpoint(str(path))
    except loading.CheckpointError as exc:
        return exc
    raise AssertionError(f'{path} loaded')
