"""Releasing and using models: publish_model.py, the model index, `mim
search` / `mim download` from a loopback HTTP server, inference by name
through mmdet's and mmseg's inferencers, and get_flops.py (CPU,
subprocesses, 127.0.0.1 only)."""
import functools
import glob
import hashlib
import http.server
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import yaml

from helpers import (HAS_MMPRETRAIN, assert_written_with_open_mode, load_tool,
                     run)

DEMO_CONFIG = 'configs/kcla/demo/faster-rcnn_kcla-r18_fpn_synthetic-coco.py'
SEG_CONFIG = 'configs/kcla/unet_kcla-r18_isic2017-256x256.py'
# A throwaway package that looks installed (dist-info + .mim) on a temporary
# PYTHONPATH: mim reads its model index exactly as it reads kcla_mm's.
TEST_PACKAGE = 'kcla_release_demo'
MODEL_NAME = 'faster-rcnn_kcla-r18_fpn_release-test'
MIM = osp.join(osp.dirname(sys.executable), 'mim')


def clean_env(**extra):
    """The environment of a subprocess: no leftover switch that would turn
    weights_only off, no proxy for the loopback server."""
    env = dict(os.environ)
    env.pop('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', None)
    env.update(NO_PROXY='127.0.0.1,localhost', no_proxy='127.0.0.1,localhost')
    env.update(extra)
    return env


def sha256(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope='module')
def release(tmp_path_factory, repo_root):
    """A short synthetic training run of the demo model, published."""
    root = tmp_path_factory.mktemp('release')
    data = root / 'coco'
    run(sys.executable, 'tools/misc/make_synthetic_coco.py', str(data),
        '--train', '4', '--val', '2', '--size', '96', '--seed', '0')
    # The demo config, keeping every detection (an almost untrained model
    # scores below mmdet's 0.05), so that predictions are never empty.
    config = root / f'{MODEL_NAME}.py'
    config.write_text(
        textwrap.dedent(f"""\
        _base_ = '{osp.join(repo_root, DEMO_CONFIG)}'
        model = dict(test_cfg=dict(rcnn=dict(score_thr=0.0)))
        """))
    work = root / 'work'
    opts = [
        f'data_root={data}', 'train_cfg.max_epochs=1',
        'train_dataloader.batch_size=2'
    ]
    for loader in ('train', 'val', 'test'):
        opts += [
            f'{loader}_dataloader.num_workers=0',
            f'{loader}_dataloader.persistent_workers=False'
        ]
    run(sys.executable, 'tools/train.py', str(config), '--work-dir', str(work),
        '--cfg-options', *opts)
    trained = work / 'epoch_1.pth'
    assert trained.is_file()
    log = run(
        sys.executable,
        'tools/model_converters/publish_model.py',
        str(trained),
        str(root / 'published' / f'{MODEL_NAME}.pth'),
        env=clean_env()).stdout
    published = re.search(r'^published (.+)$', log, re.M).group(1)
    image = sorted((data / 'val2017').iterdir())[0]
    return dict(
        root=root,
        config=str(config),
        trained=str(trained),
        published=published,
        log=log,
        image=str(image))


# mmdet's own DetInferencer in a fresh interpreter: nothing imports kcla_mm
# but the config's custom_imports.
DET_PREDICT = textwrap.dedent("""\
    import json, sys
    from mmdet.apis import DetInferencer
    config, image, out, *weights = sys.argv[1:]
    assert 'kcla_mm' not in sys.modules
    predictions = {}
    for w in weights:
        inferencer = DetInferencer(model=config, weights=w, device='cpu',
                                   show_progress=False)
        predictions[w] = inferencer(image)['predictions'][0]
    assert 'kcla_mm' in sys.modules, 'custom_imports did not import kcla_mm'
    json.dump(predictions, open(out, 'w'))
    """)


def det_predictions(repo_root, tmp_path, config, image, *weights):
    out = tmp_path / 'predictions.json'
    run(sys.executable,
        '-c',
        DET_PREDICT,
        config,
        image,
        str(out),
        *weights,
        env=clean_env())
    return json.load(open(out))


@pytest.mark.slow
def test_publish_name_hash_and_keys(release):
    published = release['published']
    name = osp.basename(published)
    assert re.fullmatch(rf'{re.escape(MODEL_NAME)}-[0-9a-f]{{8}}\.pth', name)
    digest = sha256(published)
    # The hash of the published file (not of the input, as mmseg's tool).
    assert name[-len('12345678.pth'):-len('.pth')] == digest[:8]
    assert f'sha256: {digest}' in release['log']
    assert not digest.startswith(sha256(release['trained'])[:8])
    # Nothing else left in the output folder (no temporary file).
    assert os.listdir(osp.dirname(published)) == [name]

    from kcla_mm.torch_compat import load_checkpoint_file
    from kcla_mm.utils.checkpoint_safety import allow_mmengine_checkpoint_types
    allow_mmengine_checkpoint_types()
    trained = load_checkpoint_file(release['trained'])
    released = torch.load(published, weights_only=True)
    assert set(released) == {'meta', 'state_dict'}
    assert {'optimizer', 'message_hub', 'param_schedulers'} <= set(trained)
    for key in ('optimizer', 'message_hub', 'param_schedulers'):
        assert key in release['log'].split('dropped:')[1].splitlines()[0]
    assert released['meta'] == trained['meta']
    assert released['meta']['dataset_meta']['classes'] == ('circle',
                                                           'rectangle',
                                                           'triangle')
    assert released['state_dict'].keys() == trained['state_dict'].keys()
    for key, value in trained['state_dict'].items():
        assert torch.equal(released['state_dict'][key], value), key


def test_published_checkpoint_loads_with_plain_weights_only(release):
    # weights_only=True spelled out: torch < 2.6 does not default to it.
    load = ('import sys, torch; '
            'c = torch.load(sys.argv[1], weights_only=True); print(sorted(c))')
    result = subprocess.run([sys.executable, '-c', load, release['published']],
                            capture_output=True,
                            text=True,
                            env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert "['meta', 'state_dict']" in result.stdout
    # The training checkpoint does not (mmengine's logging types): the
    # stripping is what makes the published file loadable.
    result = subprocess.run([sys.executable, '-c', load, release['trained']],
                            capture_output=True,
                            text=True,
                            env=clean_env())
    assert result.returncode != 0 and 'weights_only' in result.stderr


def test_release_name_strips_the_suffix_not_characters():
    from kcla_mm.model_zoo import release_name
    digest = 'abcdef0123456789'
    # str.rstrip('.pth') would give 'de' and 'ht'.
    assert release_name('w/depth.pth', digest) == 'w/depth-abcdef01.pth'
    assert release_name('w/htpth', digest) == 'w/htpth-abcdef01.pth'
    assert release_name('w/model', digest) == 'w/model-abcdef01.pth'


def test_publish_refuses_what_is_not_a_checkpoint(tmp_path, repo_root, capsys):
    tool = load_tool('tools/model_converters/publish_model.py')
    text = tmp_path / 'notes.pth'
    text.write_text('not a checkpoint\n')
    listing = tmp_path / 'list.pth'
    torch.save([1, 2, 3], listing)
    weights = tmp_path / 'weights.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}}, weights)
    cases = [
        (text, 'is not a PyTorch checkpoint', []),
        (listing, "not an mmengine checkpoint: expected a dict with a "
         "'state_dict' key, found list", []),
        (tmp_path / 'missing.pth', 'no such file', []),
        (weights, "has no 'ema_state_dict'", ['--keep-ema']),
    ]
    for path, message, extra in cases:
        code = tool.main([str(path), str(tmp_path / 'out' / 'x.pth'), *extra])
        stderr = capsys.readouterr().err
        assert code == 1, (path, stderr)
        assert f'error: {path}' in stderr and message in stderr, stderr
    assert not osp.exists(tmp_path / 'out') or not os.listdir(tmp_path / 'out')


def test_publish_keeps_ema_weights_only_on_request(tmp_path):
    from kcla_mm.model_zoo import publish_checkpoint
    source = tmp_path / 'ema.pth'
    torch.save(
        dict(
            meta=dict(epoch=3),
            state_dict={'w': torch.ones(2)},
            ema_state_dict={
                'module.w': torch.zeros(2),
                'steps': torch.tensor(5)
            },
            optimizer=dict(state={})), source)
    plain = publish_checkpoint(str(source), str(tmp_path / 'plain'))
    with_ema = publish_checkpoint(
        str(source), str(tmp_path / 'ema'), keep_ema=True)
    assert set(torch.load(plain['path'])) == {'meta', 'state_dict'}
    assert plain['dropped'] == ['ema_state_dict', 'optimizer']
    loaded = torch.load(with_ema['path'])
    assert set(loaded) == {'meta', 'state_dict', 'ema_state_dict'}
    assert torch.equal(loaded['ema_state_dict']['module.w'], torch.zeros(2))
    assert with_ema['dropped'] == ['optimizer']


def test_publish_refuses_meta_that_weights_only_would_refuse(tmp_path):
    from kcla_mm.model_zoo import CheckpointPublishError
    from kcla_mm.model_zoo.publish import strip_checkpoint
    checkpoint = dict(
        meta=dict(info=dict(when=torch.nn.Identity())),
        state_dict={'w': torch.ones(1)})
    with pytest.raises(
            CheckpointPublishError,
            match=r"x\['meta'\]\.info\.when is a torch\.nn"):
        strip_checkpoint(checkpoint, source='x')
    # Such a file does not even load for publishing: weights_only stays on
    # where torch has the allow-list; elsewhere it loads as mmengine loads
    # it, and the same check of its meta refuses it.
    from kcla_mm.model_zoo import publish_checkpoint
    from kcla_mm.torch_compat import WEIGHTS_ONLY_ALLOW_LIST
    source = tmp_path / 'odd.pth'
    torch.save(checkpoint, source)
    message = ('odd.pth is not a PyTorch checkpoint that loads with '
               'weights_only=True' if WEIGHTS_ONLY_ALLOW_LIST else
               r"odd.pth\['meta'\]\.info\.when is a torch\.nn")
    with pytest.raises(CheckpointPublishError, match=message):
        publish_checkpoint(str(source), str(tmp_path / 'out'))
    assert not (tmp_path / 'out').exists()


def small_training_checkpoint(path):
    torch.save(
        dict(
            meta=dict(epoch=1),
            state_dict={'w': torch.arange(6.)},
            optimizer=dict(state={})), path)


def publish_with_tool(tool, capsys, in_file, out_file):
    assert tool.main([str(in_file), str(out_file)]) == 0
    log = capsys.readouterr().out
    return re.search(r'^published (.+)$', log, re.M).group(1)


def test_publishing_twice_gives_the_same_name_and_bytes(tmp_path, capsys):
    """torch.save names the records inside the archive after the file it
    writes: the published bytes (and so the name) must not depend on the
    temporary file's random name."""
    tool = load_tool('tools/model_converters/publish_model.py')
    small_training_checkpoint(tmp_path / 'epoch_1.pth')
    first, second = [
        publish_with_tool(tool, capsys, tmp_path / 'epoch_1.pth',
                          tmp_path / folder / 'model.pth')
        for folder in ('first', 'second')
    ]
    assert osp.basename(first) == osp.basename(second)
    with open(first, 'rb') as a, open(second, 'rb') as b:
        assert a.read() == b.read()


@pytest.mark.parametrize('umask', [0o022, 0o027], ids=['022', '027'])
def test_published_file_has_the_mode_of_a_plain_open(tmp_path, capsys, umask):
    tool = load_tool('tools/model_converters/publish_model.py')
    small_training_checkpoint(tmp_path / 'epoch_1.pth')
    assert_written_with_open_mode(
        lambda: publish_with_tool(tool, capsys, tmp_path / 'epoch_1.pth',
                                  tmp_path / 'out' / 'model.pth'), umask,
        tmp_path)


def test_initial_checkpoint_creates_the_output_folder(tmp_path, capsys):
    config = tmp_path / 'small.py'
    config.write_text("default_scope = 'mmdet'\n"
                      "custom_imports = dict(imports=['kcla_mm'])\n"
                      "model = dict(type='KCLAResNet', depth=18, "
                      'base_channels=16, head_dim=8)\n')
    out = tmp_path / 'checkpoints' / 'initial' / 'small.pth'
    tool = load_tool('tools/misc/save_initial_checkpoint.py')
    tool.main([str(config), str(out)])
    assert f'to {out}' in capsys.readouterr().out
    ckpt = torch.load(out, weights_only=True)
    from kcla_mm.models import KCLAResNet
    KCLAResNet(
        depth=18, base_channels=16,
        head_dim=8).load_state_dict(ckpt['state_dict'])


def test_initial_checkpoint_names_pretrained_weights_it_cannot_read(
        tmp_path, capsys):
    """A config that starts from pretrained weights not on this machine is
    refused in one line with the option that leaves them out (it was a
    FileNotFoundError traceback)."""
    config = tmp_path / 'pretrained.py'
    config.write_text(
        "default_scope = 'mmdet'\n"
        "custom_imports = dict(imports=['kcla_mm'])\n"
        "model = dict(type='KCLAResNet', depth=18, base_channels=16, "
        "head_dim=8, init_cfg=dict(type='Pretrained', "
        "checkpoint='no/such/weights.pth'))\n")
    out = tmp_path / 'initial.pth'
    tool = load_tool('tools/misc/save_initial_checkpoint.py')
    with pytest.raises(SystemExit) as error:
        tool.main([str(config), str(out)])
    assert str(error.value) == (
        f'error: {config}: its model initialises from weights that cannot '
        'be read here (no/such/weights.pth can not be found.); to save it '
        'without them: --cfg-options model.init_cfg=None')
    assert not out.exists()
    tool.main([str(config), str(out), '--cfg-options', 'model.init_cfg=None'])
    assert out.exists()


@pytest.fixture(scope='module')
def predictions(release, tmp_path_factory, repo_root):
    """mmdet's DetInferencer with the config file and the training and the
    published checkpoints."""
    found = det_predictions(repo_root, tmp_path_factory.mktemp('predict'),
                            release['config'], release['image'],
                            release['trained'], release['published'])
    return dict(
        trained=found[release['trained']],
        published=found[release['published']])


def test_identical_predictions_before_and_after_publishing(predictions):
    # mmdet's DetInferencer, a kcla_mm config path, custom_imports only;
    # the training checkpoint loads through the allow-list that importing
    # kcla_mm registers, the published one without it.
    assert len(predictions['trained']['scores']) > 0
    assert predictions['trained'] == predictions['published']


@pytest.fixture(scope='module')
def model_server(release):
    """Serves the published checkpoint from 127.0.0.1 and records the
    requested paths."""
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):

        def log_message(self, *args):
            requested.append(self.path)

    handler = functools.partial(
        Handler, directory=osp.dirname(release['published']))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = (f'http://127.0.0.1:{server.server_address[1]}/'
           f"{osp.basename(release['published'])}")
    yield dict(url=url, requested=requested)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope='module')
def test_package(release, model_server):
    """An installed-looking package whose model index names the published
    model, its config under .mim/ and its Weights on the loopback server."""
    site = release['root'] / 'site'
    package = site / TEST_PACKAGE
    mim_dir = package / '.mim'
    (mim_dir / 'configs' / 'demo').mkdir(parents=True)
    (package / '__init__.py').write_text('')
    shutil.copy(release['config'],
                mim_dir / 'configs' / 'demo' / f'{MODEL_NAME}.py')
    dist_info = site / f'{TEST_PACKAGE}-0.0.1.dist-info'
    dist_info.mkdir()
    (dist_info / 'METADATA').write_text(
        f'Metadata-Version: 2.1\nName: {TEST_PACKAGE}\nVersion: 0.0.1\n')
    (dist_info / 'top_level.txt').write_text(f'{TEST_PACKAGE}\n')
    (mim_dir /
     'model-index.yml').write_text('Import:\n  - configs/demo/metafile.yml\n')
    metafile = dict(
        Collections=[
            dict(
                Name='KCLA',
                Paper=dict(
                    Title='Enhancing Layer Interaction Using Key-Correlated '
                    'Layer Attention',
                    URL='https://arxiv.org/abs/2606.28405'))
        ],
        Models=[
            dict(
                Name=MODEL_NAME,
                **{'In Collection': 'KCLA'},
                Config=f'configs/demo/{MODEL_NAME}.py',
                Metadata={'Training Data': 'Synthetic COCO shapes'},
                Weights=model_server['url'])
        ])
    (mim_dir / 'configs' / 'demo' / 'metafile.yml').write_text(
        yaml.safe_dump(metafile, sort_keys=False))
    return dict(site=str(site), env=clean_env(PYTHONPATH=str(site)))


@pytest.mark.slow
def test_mim_search_and_download_from_loopback(release, model_server,
                                               test_package, predictions,
                                               tmp_path, repo_root):
    env = test_package['env']
    search = run(
        MIM, 'search', TEST_PACKAGE, '--display-width', '300', env=env).stdout
    assert f'config id: {MODEL_NAME}' in search
    assert model_server['url'] in search

    dest = tmp_path / 'downloaded'
    log = run(
        MIM,
        'download',
        TEST_PACKAGE,
        '--config',
        MODEL_NAME,
        '--dest',
        str(dest),
        env=env)
    weights = dest / osp.basename(release['published'])
    assert weights.is_file()
    assert sha256(weights) == sha256(release['published'])
    # Fetched over HTTP from the test's server, not copied.
    assert f"/{osp.basename(release['published'])}" in model_server[
        'requested']
    config = dest / f'{MODEL_NAME}.py'
    assert config.is_file(), log.stdout
    dumped = config.read_text()
    assert "type='KCLAResNet'" in dumped and "'kcla_mm'" in dumped

    # Inference with the downloaded files, mmdet's own DetInferencer in a
    # fresh interpreter: the same predictions as the published file.
    found = det_predictions(repo_root, tmp_path, str(config), release['image'],
                            str(weights))
    assert found[str(weights)] == predictions['published']


BY_NAME = textwrap.dedent("""\
    import json, sys
    from kcla_mm.apis import KCLADetInferencer
    name, package, image, out = sys.argv[1:]
    inferencer = KCLADetInferencer(model=name, package=package,
                                   device='cpu', show_progress=False)
    json.dump(inferencer(image)['predictions'][0], open(out, 'w'))
    """)


@pytest.mark.slow
def test_inference_by_name_fetches_the_index_weights(release, model_server,
                                                     test_package, predictions,
                                                     tmp_path, repo_root):
    out = tmp_path / 'by_name.json'
    env = dict(test_package['env'], TORCH_HOME=str(tmp_path / 'torch_home'))
    count = model_server['requested'].count(
        f"/{osp.basename(release['published'])}")
    run(sys.executable,
        '-c',
        BY_NAME,
        MODEL_NAME,
        TEST_PACKAGE,
        release['image'],
        str(out),
        env=env)
    # The weights came from the index's URL (mmengine's http loader).
    assert model_server['requested'].count(
        f"/{osp.basename(release['published'])}") == count + 1
    assert json.load(open(out)) == predictions['published']

    # The CLI, by name, writes the drawn image and the predictions.
    out_dir = tmp_path / 'cli'
    log = run(
        sys.executable,
        'tools/infer.py',
        release['image'],
        MODEL_NAME,
        '--package',
        TEST_PACKAGE,
        '--out-dir',
        str(out_dir),
        '--pred-score-thr',
        '0',
        env=env).stdout
    image_name = osp.basename(release['image'])
    assert (out_dir / 'vis' / image_name).stat().st_size > 1000
    written = json.load(
        open(out_dir / 'preds' / (osp.splitext(image_name)[0] + '.json')))
    assert written['scores'] == pytest.approx(
        predictions['published']['scores'])
    assert 'drawn to' in log

    infer = load_tool('tools/infer.py')
    with pytest.raises(
            ValueError,
            match='no-such-model is neither a config '
            'file nor a model name.*known models: .*'
            'faster-rcnn_kcla-r50_fpn_1x_coco'):
        infer.main([release['image'], 'no-such-model'])
    # A name without released weights would draw an untrained model.
    with pytest.raises(
            SystemExit,
            match='error: faster-rcnn_kcla-r50_fpn_1x_coco has no released '
            'weights in the kcla_mm model index: give --weights'):
        infer.main([release['image'], 'faster-rcnn_kcla-r50_fpn_1x_coco'])


SEG_PREDICT = textwrap.dedent("""\
    import sys
    import numpy as np
    from mmseg.apis import MMSegInferencer
    config, weights, image, out_dir = sys.argv[1:]
    assert 'kcla_mm' not in sys.modules
    inferencer = MMSegInferencer(model=config, weights=weights,
                                 device='cpu')
    assert 'kcla_mm' in sys.modules, 'custom_imports did not import kcla_mm'
    mask = inferencer(image, out_dir=out_dir)['predictions']
    print('mask', np.asarray(mask).shape, sorted(np.unique(mask).tolist()))
    """)


@pytest.mark.slow
def test_segmentation_release_and_inference(release, tmp_path, repo_root):
    initial = tmp_path / 'unet.pth'
    run(sys.executable, 'tools/misc/save_initial_checkpoint.py', SEG_CONFIG,
        str(initial))
    from kcla_mm.model_zoo import publish_checkpoint
    published = publish_checkpoint(str(initial),
                                   str(tmp_path / 'unet_kcla'))['path']
    assert re.fullmatch(r'unet_kcla-[0-9a-f]{8}\.pth', osp.basename(published))
    out_dir = tmp_path / 'seg'
    log = run(
        sys.executable,
        '-c',
        SEG_PREDICT,
        SEG_CONFIG,
        published,
        release['image'],
        str(out_dir),
        env=clean_env()).stdout
    # One class index per pixel of the 96x96 input.
    match = re.search(r'mask \((\d+), (\d+)\) \[([\d, ]+)\]', log)
    assert match and match.group(1, 2) == ('96', '96'), log
    assert set(map(int, match.group(3).split(','))) <= {0, 1}
    image_name = osp.basename(release['image'])
    assert (out_dir / 'vis' / image_name).is_file()

    cli_dir = tmp_path / 'seg_cli'
    log = run(sys.executable, 'tools/infer.py', release['image'], SEG_CONFIG,
              '--weights', published, '--out-dir', str(cli_dir)).stdout
    assert (cli_dir / 'vis' / image_name).is_file()
    # infer.py names the mask after its image (mmseg's inferencer numbers
    # them).
    import numpy as np
    from PIL import Image
    mask = np.asarray(
        Image.open(cli_dir / 'pred' /
                   (osp.splitext(image_name)[0] + '_pred.png')))
    assert mask.shape == (96, 96) and set(np.unique(mask)) <= {0, 1}
    assert '1 segmentation mask(s)' in log


def repository_configs(repo_root):
    """Every runnable config of the repository (not the _base_ parts)."""
    found = glob.glob(
        osp.join(repo_root, 'configs', '**', '*.py'), recursive=True)
    return sorted(
        osp.relpath(path, repo_root) for path in found
        if '_base_' not in osp.relpath(path, repo_root).split(os.sep))


def test_model_index_lists_every_config_and_only_measured_figures(repo_root):
    from kcla_mm.model_zoo import index_dir, load_model_index

    # Found through the installed package's .mim (created by setup.py).
    assert osp.realpath(index_dir()) in (osp.realpath(
        osp.join(repo_root, 'kcla_mm', '.mim')), osp.realpath(repo_root))
    models = {m.name: m for m in load_model_index().values()}
    configs = {
        osp.relpath(osp.realpath(m.config), osp.realpath(repo_root))
        for m in models.values()
    }
    assert configs == set(repository_configs(repo_root)), (
        'add the missing configs to a metafile.yml imported by '
        'model-index.yml (and their README rows)')
    for name, info in models.items():
        assert name == osp.splitext(osp.basename(info.config))[0]
        # Nothing is trained on COCO/ISIC/Kvasir yet: no weights to offer.
        assert info.weights is None, name
    metafile = yaml.safe_load(
        open(osp.join(repo_root, 'configs', 'kcla', 'metafile.yml')))
    with_results = [m['Name'] for m in metafile['Models'] if 'Results' in m]
    # The only measured results: `make demo` and `make demo-pretrain` on
    # the synthetic shapes sets.
    assert with_results == [
        'faster-rcnn_kcla-r18_fpn_synthetic-coco',
        'kcla-r18_1xb32_synthetic-imagenet'
    ]
    assert metafile['Collections'][0]['Paper'] == {
        'URL':
        'https://arxiv.org/abs/2606.28405',
        'Title':
        'Enhancing Layer Interaction Using Key-Correlated Layer '
        'Attention'
    }


@pytest.mark.slow
def test_metafile_parameter_counts_are_the_models(repo_root):
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope

    from kcla_mm.model_zoo import load_model_index
    configs = {m.name: m.config for m in load_model_index().values()}
    entries = [
        entry for folder in ('kcla', 'baselines') for entry in yaml.safe_load(
            open(osp.join(repo_root, 'configs', folder, 'metafile.yml')))
        ['Models']
    ]
    classifiers = [
        e['Name'] for e in entries
        if e['Metadata']['Task'] == 'Image Classification'
    ]
    # 4 KCLA classifiers, their 4 plain baselines and the pretraining demo.
    assert len(classifiers) == 9
    checked = []
    for entry in entries:
        if entry['Name'] in classifiers and not HAS_MMPRETRAIN:
            # mmpretrain:: bases do not parse without the pretrain extra;
            # the torch 2.1.2 stack checks these entries.
            continue
        cfg = Config.fromfile(configs[entry['Name'].lower()])
        init_default_scope(cfg.default_scope)
        model = MODELS.build(cfg.model)
        count = sum(p.numel() for p in model.parameters())
        assert count == entry['Metadata']['Parameters'], entry['Name']
        checked.append(entry['Name'])
    unchecked = sorted(set(e['Name'] for e in entries) - set(checked))
    assert unchecked == ([] if HAS_MMPRETRAIN else sorted(classifiers))


def test_mim_search_lists_kcla_mm_models(repo_root):
    # The real package, as installed in this environment (editable).
    search = run(MIM, 'search', 'kcla_mm', env=clean_env()).stdout
    from kcla_mm.model_zoo import load_model_index
    names = {m.name for m in load_model_index().values()}
    listed = set(re.findall(r'config id: (\S+)', search))
    assert listed == names


@pytest.mark.slow
def test_get_flops_counts_the_kcla_layers(repo_root):
    log = run(sys.executable, 'tools/analysis/get_flops.py',
              'configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py',
              '--backbone-only', '--shape', '224', '224').stdout
    assert 'Params: 23.801M (23,801,133)' in log
    by_op = dict((op, int(n.replace(',', ''))) for op, n in re.findall(
        r'(\w+) ([\d,]+)',
        log.split('Flops by operator:')[1].splitlines()[0]))
    # The KCLA state update U <- U + w X (baddbmm) is counted as one
    # multiply-add per state element, in every block with a state: stage 1
    # from its second block on (block 0 starts the state), stages 2-4 in
    # all blocks (the first one adapts the previous stage's state).
    widths, sizes, blocks = (256, 512, 1024, 2048), (56, 28, 14, 7), (3, 4, 6,
                                                                      3)
    updates = sum(c * s * s * (n - (i == 0))
                  for i, (c, s, n) in enumerate(zip(widths, sizes, blocks)))
    assert by_op.get('baddbmm', 0) + by_op.get('addcmul_', 0) == updates
    assert by_op['bmm'] > 0
    # The official model measures 4.162 GMACs at 224x224 with its 1000-class
    # fc (2,048,000 MACs) and without BN: our conv MACs plus the fc agree.
    assert abs(by_op['conv'] + 2_048_000 - 4.162e9) < 0.5e6 + 0.0005e9

    log = run(sys.executable, 'tools/analysis/get_flops.py', SEG_CONFIG,
              '--shape', '128', '128').stdout
    assert 'Input shape: (1, 3, 128, 128)' in log
    params = int(
        re.search(r'Params: \S+ \(([\d,]+)\)', log).group(1).replace(',', ''))
    assert params > 0 and re.search(r'Flops: \S+ \([\d,]+;', log)


def test_inferencers_resolve_names_before_the_parent_constructors():
    """kcla_mm names become (Config, weights) for mmdet's and mmseg's
    public constructors; no private method of theirs is overridden, and
    other strings go to their own lookup unchanged."""
    import warnings

    from kcla_mm.apis import inferencers
    from kcla_mm.model_zoo import load_model_index
    for cls in (inferencers.KCLADetInferencer, inferencers.KCLASegInferencer):
        assert not [
            name for name in vars(cls)
            if name.startswith('_') and not name.startswith(('__', '_abc'))
        ], cls
    info = next(iter(load_model_index().values()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        cfg, weights = inferencers._from_index(info.name.upper(), None,
                                               'kcla_mm')
    assert osp.realpath(cfg.filename) == osp.realpath(info.config)
    assert weights == info.weights
    assert bool(caught) == (info.weights is None)
    assert inferencers._from_index(info.name, 'mine.pth',
                                   'kcla_mm')[1] == 'mine.pth'
    assert inferencers._from_index('retinanet_r50_fpn_1x_coco', None,
                                   'kcla_mm') == ('retinanet_r50_fpn_1x_coco',
                                                  None)
