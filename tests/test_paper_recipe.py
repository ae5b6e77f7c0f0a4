"""The paper's segmentation recipe (official segmentation/ code):
normalisation, rotation and resize transforms, BCE + Dice loss, the pooled
pixel metric and the cycling cosine schedule, each against a hand
computation of what the official code computes."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import PARAM_SCHEDULERS
from mmengine.structures import PixelData
from mmseg.registry import METRICS, MODELS, TRANSFORMS
from mmseg.structures import SegDataSample

import kcla_mm  # noqa: F401  registers the transforms, loss and metric

SCHEDULE = 'configs/_base_/schedules/paper-unet_adamw_300e.py'

# --------------------------------------------------------------------------
# MeanStdMinMaxNormalize


def test_normalize_matches_hand_computation():
    img = np.array([[[10, 20, 30], [40, 50, 60]]], np.uint8)  # 1x2x3
    norm = TRANSFORMS.build(
        dict(type='MeanStdMinMaxNormalize', mean=157.561, std=26.706))
    out = norm(dict(img=img.copy()))['img']
    # (x - m) / s, then over the whole image (both pixels, all channels):
    # 255 * (y - min) / (max - min); min at x=10, max at x=60
    y = (img.astype(np.float64) - 157.561) / 26.706
    lo, hi = (10 - 157.561) / 26.706, (60 - 157.561) / 26.706
    assert out.dtype == np.float32 and out.shape == img.shape
    np.testing.assert_allclose(out, (y - lo) / (hi - lo) * 255, rtol=1e-6)
    # the affine step cancels: 255 * (x - 10) / 50
    np.testing.assert_allclose(
        out, (img - 10.) / 50. * 255, rtol=1e-6, atol=1e-4)
    assert out.min() == 0 and out.max() == pytest.approx(255)


def test_normalize_constant_image_is_zero_not_nan():
    norm = TRANSFORMS.build(
        dict(type='MeanStdMinMaxNormalize', mean=96.582, std=24.0903))
    out = norm(dict(img=np.full((4, 4, 3), 7, np.uint8)))['img']
    assert np.array_equal(out, np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match='std must be > 0'):
        TRANSFORMS.build(dict(type='MeanStdMinMaxNormalize', mean=0, std=0))


# --------------------------------------------------------------------------
# RandomRotateNearest


def test_rotation_by_90_is_a_counter_clockwise_quarter_turn():
    rng = np.random.default_rng(0)
    img = rng.uniform(0, 255, (5, 5, 3)).astype(np.float32)
    mask = rng.integers(0, 2, (5, 5)).astype(np.uint8)
    rot = TRANSFORMS.build(
        dict(type='RandomRotateNearest', prob=1.0, degree=(90, 90)))
    out = rot(dict(img=img.copy(), gt_seg_map=mask.copy()))
    # torchvision's TF.rotate: positive angles turn counter-clockwise
    assert np.array_equal(out['img'], np.rot90(img, 1))
    assert np.array_equal(out['gt_seg_map'], np.rot90(mask, 1))


def test_rotation_pads_with_zero_and_keeps_labels_binary():
    img = np.full((9, 9, 3), 200, np.float32)
    mask = np.ones((9, 9), np.uint8)
    rot = TRANSFORMS.build(
        dict(type='RandomRotateNearest', prob=1.0, degree=(45, 45)))
    out = rot(dict(img=img.copy(), gt_seg_map=mask.copy()))
    # corners come in as 0 in both (official fill 0: background, not 255)
    assert out['img'][0, 0].tolist() == [0, 0, 0]
    assert out['gt_seg_map'][0, 0] == 0 and out['gt_seg_map'][4, 4] == 1
    assert set(np.unique(out['img'])) == {0, 200}  # nearest: no new values
    assert set(np.unique(out['gt_seg_map'])) == {0, 1}


def test_rotation_probability_and_angle_per_call():
    img = np.arange(49, dtype=np.float32).reshape(7, 7, 1).repeat(3, 2)
    never = TRANSFORMS.build(dict(type='RandomRotateNearest', prob=0.0))
    assert np.array_equal(never(dict(img=img.copy()))['img'], img)
    always = TRANSFORMS.build(dict(type='RandomRotateNearest', prob=1.0))
    np.random.seed(0)
    outs = [always(dict(img=img.copy()))['img'] for _ in range(4)]
    # a new angle each time (the official draws one per run)
    assert len({o.tobytes() for o in outs}) == 4
    with pytest.raises(ValueError, match='prob'):
        TRANSFORMS.build(dict(type='RandomRotateNearest', prob=2))


# --------------------------------------------------------------------------
# ResizeThresholdMask


def test_resize_thresholds_the_bilinear_mask():
    img = np.zeros((1, 2, 3), np.float32)
    img[0, 1] = 255
    mask = np.array([[0, 1]], np.uint8)
    resize = TRANSFORMS.build(
        dict(type='ResizeThresholdMask', scale=(4, 1), set_ori_shape=True))
    out = resize(dict(img=img, gt_seg_map=mask, ori_shape=(1, 2)))
    # half-pixel centres: source x = -0.25, 0.25, 0.75, 1.25 -> bilinear
    # values 0, 0.25, 0.75, 1 -> >= 0.5: 0 0 1 1
    np.testing.assert_allclose(out['img'][0, :, 0], [0, 63.75, 191.25, 255])
    assert out['gt_seg_map'].tolist() == [[0, 0, 1, 1]]
    assert out['gt_seg_map'].dtype == np.uint8
    assert out['img_shape'] == (1, 4) and out['ori_shape'] == (1, 4)
    assert out['scale_factor'] == (2.0, 1.0)
    kept = TRANSFORMS.build(dict(type='ResizeThresholdMask', scale=(4, 1)))
    assert kept(dict(img=img, ori_shape=(1, 2)))['ori_shape'] == (1, 2)


def test_resize_keeps_ignored_pixels():
    mask = np.array([[0, 255], [1, 1]], np.uint8)
    resize = TRANSFORMS.build(dict(type='ResizeThresholdMask', scale=(4, 4)))
    out = resize(dict(img=np.zeros((2, 2, 3), np.float32), gt_seg_map=mask))
    assert out['gt_seg_map'][0, 3] == 255 and out['gt_seg_map'][3, 0] == 1
    assert set(np.unique(out['gt_seg_map'])) == {0, 1, 255}


# --------------------------------------------------------------------------
# BCEDiceLoss


def official_bce_dice(prob, target):
    """The official BceDiceLoss(wb=1, wd=1), written out: nn.BCELoss (mean
    over every pixel of the batch) + 1 - mean over images of
    (2 sum(p t) + 1) / (sum(p) + sum(t) + 1)."""
    n = prob.shape[0]
    p, t = prob.reshape(n, -1), target.reshape(n, -1).float()
    bce = torch.nn.BCELoss()(p, t)
    dice = (2 * (p * t).sum(1) + 1) / (p.sum(1) + t.sum(1) + 1)
    return bce + 1 - dice.sum() / n


def test_bce_dice_by_hand():
    loss = MODELS.build(dict(type='BCEDiceLoss'))
    logits = torch.zeros(2, 1, 1, 2)  # p = 0.5 everywhere
    target = torch.tensor([[[1, 0]], [[1, 1]]])
    # bce = ln 2; dice = (2*0.5+1)/(1+1+1) = 2/3 and (2*1+1)/(1+2+1) = 3/4
    expected = math.log(2) + 1 - (2 / 3 + 3 / 4) / 2
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-6)
    assert loss.loss_name == 'loss_bce_dice'


def test_bce_dice_matches_the_official_formula_and_grads():
    torch.manual_seed(0)
    logits = torch.randn(3, 1, 8, 8, dtype=torch.float64) * 3
    target = (torch.rand(3, 8, 8) > 0.6).long()
    target[2] = 0  # an image without foreground
    logits.requires_grad_(True)
    ours = MODELS.build(dict(type='BCEDiceLoss'))(logits, target)
    ours.backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref = official_bce_dice(logits.sigmoid().float(), target)
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(grad, logits.grad, rtol=1e-3, atol=1e-5)


def test_bce_dice_weights_and_ignore_index():
    torch.manual_seed(1)
    logits = torch.randn(2, 1, 4, 4)
    target = (torch.rand(2, 4, 4) > 0.5).long()
    both = MODELS.build(dict(type='BCEDiceLoss'))(logits, target)
    bce = MODELS.build(dict(type='BCEDiceLoss', dice_weight=0))(logits, target)
    assert bce.item() == pytest.approx(
        F.binary_cross_entropy_with_logits(logits[:, 0],
                                           target.float()).item(),
        rel=1e-5)
    dice = MODELS.build(dict(type='BCEDiceLoss', bce_weight=0))(logits, target)
    assert both.item() == pytest.approx(bce.item() + dice.item(), rel=1e-6)
    # ignored pixels count in neither term
    ignored = target.clone()
    ignored[:, 0] = 255
    got = MODELS.build(dict(type='BCEDiceLoss'))(logits, ignored)
    n = 2
    p = logits[:, 0, 1:].sigmoid().reshape(n, -1)
    t = target[:, 1:].reshape(n, -1).float()
    ref = (
        F.binary_cross_entropy(p, t) + 1 - ((2 * (p * t).sum(1) + 1) /
                                            (p.sum(1) + t.sum(1) + 1)).mean())
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)
    with pytest.raises(ValueError, match='one output channel'):
        MODELS.build(dict(type='BCEDiceLoss'))(torch.zeros(1, 2, 2, 2),
                                               target[:1, :2, :2])


def test_mmseg_dice_loss_on_one_channel_is_not_the_official_dice():
    """Why BCEDiceLoss exists: mmseg 1.2's DiceLoss one-hot encodes the
    label and keeps channel 0, the background, for a one-channel output."""
    logits = torch.full((1, 1, 1, 2), 4.0)  # p ~ 0.98 everywhere
    target = torch.tensor([[[1, 1]]])  # all foreground: near-perfect
    official = MODELS.build(dict(type='BCEDiceLoss', bce_weight=0))
    mmseg = MODELS.build(
        dict(type='DiceLoss', use_sigmoid=True, naive_dice=True, eps=1))
    assert official(logits, target).item() < 0.01
    assert mmseg(logits, target).item() > 0.5


# --------------------------------------------------------------------------
# PooledPixelMetric


def sample(pred, gt, prob=None):
    s = SegDataSample()
    s.gt_sem_seg = PixelData(data=torch.tensor(gt)[None])
    s.pred_sem_seg = PixelData(data=torch.tensor(pred)[None])
    if prob is not None:
        s.seg_logits = PixelData(data=torch.tensor(prob)[None])
    return s.to_dict()


def evaluate(samples, **kwargs):
    metric = METRICS.build(dict(type='PooledPixelMetric', **kwargs))
    metric.dataset_meta = dict(classes=('background', 'lesion'))
    metric.process({}, samples)
    return metric.evaluate(len(samples))


def test_metric_pools_one_confusion_matrix_over_the_split():
    # image 1: TP 2, FP 1, FN 0, TN 1; image 2: TP 0, FP 0, FN 2, TN 2
    a = sample([[1, 1], [1, 0]], [[1, 1], [0, 0]])
    b = sample([[0, 0], [0, 0]], [[1, 0], [1, 0]])
    got = evaluate([a, b])
    tp, fp, fn, tn = 2, 1, 2, 3
    assert {
        k: got[f'official/{k}']
        for k in ('TP', 'FP', 'FN', 'TN')
    } == dict(
        TP=tp, FP=fp, FN=fn, TN=tn)
    assert got['official/fg_IoU'] == pytest.approx(100 * 2 / 5, abs=1e-4)
    assert got['official/DSC'] == pytest.approx(100 * 4 / 7, abs=1e-4)
    assert got['official/accuracy'] == pytest.approx(100 * 5 / 8, abs=1e-4)
    assert got['official/sensitivity'] == pytest.approx(50, abs=1e-4)
    assert got['official/specificity'] == pytest.approx(75, abs=1e-4)
    # not the per-image mean (image 1: 2/3, image 2: 0 -> 33.3)
    assert got['official/fg_IoU'] != pytest.approx(100 / 3, abs=1)


def test_metric_thresholds_probabilities_at_or_above_one_half():
    # mmseg's pred_sem_seg uses > threshold; the official code >= 0.5
    prob = np.array([[0.5, 0.49]], np.float32)
    got = evaluate(
        [sample(np.array([[0, 0]]), np.array([[1, 0]]), prob=prob[None][0])])
    assert got['official/TP'] == 1 and got['official/TN'] == 1
    assert got['official/fg_IoU'] == 100


def test_metric_empty_foreground_reports_zero_not_nan():
    got = evaluate([sample(np.zeros((2, 2), np.int64), np.zeros((2, 2)))])
    assert got['official/fg_IoU'] == 0 and got['official/DSC'] == 0
    assert got['official/sensitivity'] == 0
    assert got['official/accuracy'] == 100
    assert got['official/specificity'] == 100
    full = evaluate([sample(np.ones((2, 2), np.int64), np.ones((2, 2)))])
    assert full['official/fg_IoU'] == 100 and full['official/specificity'] == 0


def test_metric_ignores_ignore_index_and_checks_shapes():
    got = evaluate([sample([[1, 1]], [[1, 255]])])
    assert (got['official/TP'], got['official/FP']) == (1, 0)
    with pytest.raises(ValueError, match='differ in size'):
        evaluate([sample([[1, 1, 0]], [[1, 0]])])


# --------------------------------------------------------------------------
# the schedule


def test_schedule_is_torch_cosine_annealing_stepped_per_epoch():
    cfg = Config.fromfile(SCHEDULE)
    assert cfg.train_cfg.type == 'EpochBasedTrainLoop'
    assert cfg.train_cfg.max_epochs == 300
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.lr,
            optimizer.weight_decay) == ('AdamW', 1e-3, 1e-2)
    (sched, ) = cfg.param_scheduler
    assert sched.by_epoch

    def optimizer_of():
        param = torch.nn.Parameter(torch.zeros(1))
        return torch.optim.AdamW([param],
                                 lr=optimizer.lr,
                                 weight_decay=optimizer.weight_decay)

    ours_opt, ref_opt = optimizer_of(), optimizer_of()
    ours = PARAM_SCHEDULERS.build(dict(sched, optimizer=ours_opt))
    # the official get_scheduler()
    ref = torch.optim.lr_scheduler.CosineAnnealingLR(
        ref_opt, T_max=50, eta_min=1e-5, last_epoch=-1)
    lrs, ref_lrs = [], []
    for _ in range(300):  # mmengine's ParamSchedulerHook: after each epoch
        lrs.append(ours_opt.param_groups[0]['lr'])
        ref_lrs.append(ref_opt.param_groups[0]['lr'])
        ours_opt.step()
        ref_opt.step()
        ours.step()
        ref.step()
    np.testing.assert_allclose(lrs, ref_lrs, rtol=1e-9, atol=1e-15)
    # it cycles: down to eta_min at epochs 50, 150, 250, back up at 100, 200
    for epoch in (50, 150, 250):
        assert lrs[epoch] == pytest.approx(1e-5, rel=1e-6)
    for epoch in (0, 100, 200):
        assert lrs[epoch] == pytest.approx(1e-3, rel=1e-6)
