"""An independent, deliberately naive re-implementation of the official
UNet-KCLA segmentation network (github bgx666/KCLA,
``segmentation/models/UNet_kcla.py`` with ``models/kcla/kcla_forU.py``,
``UNet_kcla(n_channels=3, n_classes=1)``), written from its equations and
module layout so that its ``state_dict`` has the official key names::

    encoder.conv1.*, encoder.bn1.*, encoder.bn2.*,
    encoder.layerN.layers.J.*, encoder.layerN.attention.J.*,
    upK.conv.double_conv.I.*, outc.conv.*

``keep_state=True`` (the default) is the network with the KCLA state carried
through every block, as the paper's equations have it (and kcla_mm);
``keep_state=False`` forgets it after each stage's first block, as the
official file does. It keeps the official details that matter for parity:
``U / Z`` without eps, the key conv reused by the cross-stage step, the
adapter's bias, temperatures multiplied by ``norm_d``, the gate without a
map over the heads, no ReLU after the branch's BN, the first decoder step
cropping the doubled last stage back to its size; and the modules the
forward pass never uses (``encoder.bn2``, stage 1 block 0's
``adjust_channel``), which the converter must drop. ``forward`` returns
the logits (the official model returns their sigmoid).

Nothing here is imported by the package.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

# What the official segmentation file shares with the ImageNet one (the ECA
# convs, norm_d, drop path, shortcut, the stages' state passing) and the
# randomisation's scheme come from the ImageNet oracle (both oracles are
# independent of kcla_mm).
from official_reference import (_conv1d, _downsample, _drop_path, _eca_k,
                                _KCLAStage, _norm_d, _residual, _run_stages,
                                randomise_with_)

HEAD_DIM = 16


class OfficialUNetKCLA(nn.Module):
    """One layer, at ``encoder.layerN.attention.J``."""

    def __init__(self, c, state_c, init_layer, stride, keep_state):
        super().__init__()
        self.heads = c // HEAD_DIM
        self.init_layer = init_layer
        self.keep_state = keep_state
        self.drop_path = 0.2
        if init_layer:
            # Built in every stage's first layer, stage 1 included.
            self.adjust_channel = nn.Sequential(
                nn.Conv2d(state_c, c, 1, stride=stride, groups=self.heads),
                nn.BatchNorm2d(c))
        self.bn_attention = nn.BatchNorm2d(c)
        k = _eca_k(c)
        self.Wq = _conv1d(k)
        self.Wk = _conv1d(k)
        self.Wv = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.norm_d = _norm_d(self.heads)

    def weight(self, pooled):
        """exp(min(||Wk(pooled)_h|| * norm_d_h, 10)), (b, heads, 1, 1, 1)."""
        b = pooled.shape[0]
        k = self.Wk(pooled.view(b, 1, -1)).view(b, self.heads, -1, 1, 1)
        return torch.exp(
            torch.clamp(
                torch.norm(k, dim=2, keepdim=True) * self.norm_d, max=10))

    def forward(self, x, u, z):
        b, c, h, w = x.shape
        g = self.heads
        if u is not None and self.init_layer:
            a = self.adjust_channel((u / z).reshape(b, -1, *u.shape[-2:]))
            z = self.weight(a.mean((2, 3)))
            u = a.view(b, g, -1, h, w) * z
        elif not self.keep_state:
            u = z = None
        pooled = x.mean((2, 3))
        q = self.Wq(pooled.view(b, 1, c)).view(b, g, -1)
        k = self.Wk(pooled.view(b, 1, c)).view(b, g, -1)
        w_t = self.weight(pooled)
        xs = x.view(b, g, -1, h, w)
        if u is None:
            u, z = w_t * xs, w_t
        else:
            u, z = u + w_t * xs, z + w_t
        v = self.Wv((u / z).reshape(b, c, h, w)).view(b, g, -1, h, w)
        gate = torch.sigmoid((q * k).sum(2) / k.norm(dim=2))
        out = self.bn_attention(
            (v * gate.view(b, g, 1, 1, 1)).view(b, c, h, w))
        return x + _drop_path(out, self.drop_path, self.training), u, z


class OfficialBasicBlock(nn.Module):

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(
            inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _downsample(inplanes, planes, stride)

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return _residual(y, x, self.downsample)


class OfficialStage(_KCLAStage):

    def __init__(self, inplanes, planes, stride, keep_state):
        super().__init__()
        self.layers = nn.Sequential(
            OfficialBasicBlock(inplanes, planes, stride),
            OfficialBasicBlock(planes, planes, 1))
        self.attention = nn.Sequential(*[
            OfficialUNetKCLA(planes, inplanes, j == 0, stride, keep_state)
            for j in range(2)
        ])


class OfficialEncoder(nn.Module):
    PLANES = (32, 64, 128, 128)
    STRIDES = (2, 2, 2, 1)

    def __init__(self, keep_state):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 7, stride=1, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.bn2 = nn.BatchNorm2d(512)  # built, never used
        inplanes = 16
        for i, (planes, stride) in enumerate(zip(self.PLANES, self.STRIDES)):
            self.add_module(
                f'layer{i + 1}',
                OfficialStage(inplanes, planes, stride, keep_state))
            inplanes = planes

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        return _run_stages(self, x, [x])


class OfficialDoubleConv(nn.Module):

    def __init__(self, cin, cout):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3,
                      padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout),
            nn.ReLU())


class OfficialUp(nn.Module):

    def __init__(self, cin, cout):
        super().__init__()
        self.conv = OfficialDoubleConv(cin, cout)

    def forward(self, x, skip):
        x = F.interpolate(
            x, scale_factor=2, mode='bilinear', align_corners=True)
        # Centre x on the skip: pad, or crop where x is larger.
        dy, dx = skip.shape[2] - x.shape[2], skip.shape[3] - x.shape[3]
        top, left = dy // 2, dx // 2
        if dy < 0 or dx < 0:
            x = x[:, :, -top:x.shape[2] - (-dy + top),
                  -left:x.shape[3] - (-dx + left)]
        else:
            x = F.pad(x, [left, dx - left, top, dy - top])
        return self.conv.double_conv(torch.cat([skip, x], 1))


class OfficialUNetKCLANet(nn.Module):

    def __init__(self, keep_state=True):
        super().__init__()
        self.encoder = OfficialEncoder(keep_state)
        self.up1 = OfficialUp(256, 64)
        self.up2 = OfficialUp(128, 32)
        self.up3 = OfficialUp(64, 16)
        self.up4 = OfficialUp(32, 16)
        self.outc = nn.Module()
        self.outc.conv = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        x1, x2, x3, x4, x5 = self.encoder(x)
        x = self.up4(self.up3(self.up2(self.up1(x5, x4), x3), x2), x1)
        return self.outc.conv(x)


def randomise_(model, seed=0):
    """Non-trivial values for every parameter and BN statistic, so that a
    wrong mapping cannot hide behind an identity init."""

    def vector(name, shape, gen):  # BN scale; BN shift, conv bias
        offset = 0.75 if name.endswith('.weight') else -0.25
        return torch.rand(shape, generator=gen) * 0.5 + offset

    return randomise_with_(model, seed, vector)
