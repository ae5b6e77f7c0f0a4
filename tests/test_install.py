"""The installed stack: pinned versions, compiled mmcv ops, idempotent
setup."""
import os.path as osp
import subprocess
import sys

import torch


def test_pinned_versions():
    import mmcv
    import mmdet
    import mmengine
    import mmseg
    assert torch.__version__.startswith('2.13.0')
    assert (mmengine.__version__, mmcv.__version__, mmdet.__version__,
            mmseg.__version__) == ('0.10.7', '2.1.0', '3.3.0', '1.2.2')


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


def test_rerunning_setup_changes_nothing(repo_root):
    def freeze():
        return subprocess.run(
            [sys.executable, '-m', 'pip', 'freeze'], capture_output=True,
            text=True, check=True).stdout

    before = freeze()
    result = subprocess.run(
        ['bash', osp.join(repo_root, 'scripts/setup_venv.sh')],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert 'nothing to do' in result.stdout
    assert freeze() == before
