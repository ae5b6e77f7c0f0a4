"""An independent, deliberately naive re-implementation of the official
KCLA ImageNet model (github bgx666/KCLA, ``imagenet/kcla_resnet.py``),
written from the paper's equations and the official module layout so that
its ``state_dict`` has the official key names:

    conv1.*, bn1.*, layerN.layers.J.*, layerN.attention.J.*, fc.*

It keeps the official quirks that matter for parity: ``U / Z`` without eps
in the cross-stage adaptation, ``U / (Z + 1e-3)`` before the value conv,
head temperatures ``1 / logspace(0.7, 1/0.7)`` in fp32, and the modules that
the forward pass never uses (stage 1 block 0's adaptation, block 11's
``adjust_channel``), which the converter must drop.

Nothing here is imported by the package.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

STAGE_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}
# Official KCLA module names -> KCLALayer's.
OFFICIAL_TO_MM = {
    'Wq': 'query_conv',
    'Wk': 'key_conv',
    'Wv': 'value_conv',
    'head_att': 'head_mix',
    'bn_attention': 'norm',
    'adjust_channel': 'state_adapt',
    'u_Wk': 'state_key_conv',
    'u_bn': 'state_norm'
}


def _eca_k(channels):
    t = int(abs((math.log(channels, 2) + 1) / 2.))
    return t if t % 2 else t + 1


def _conv1d(k):
    return nn.Conv1d(1, 1, k, padding=(k - 1) // 2, bias=False)


def _norm_d(heads):
    """The official ``norm_d``: 1 / logspace(0.7, 1 / 0.7) over the heads,
    in fp32, as (1, heads, 1, 1, 1), frozen (the UNet oracle's too)."""
    seq = torch.exp(
        torch.linspace(
            torch.log(torch.tensor(0.7)), torch.log(torch.tensor(1 / 0.7)),
            heads))
    return nn.Parameter(1 / seq.view(1, heads, 1, 1, 1), requires_grad=False)


def _drop_path(out, drop_path, training):
    """The official drop path of a branch output (the UNet oracle's too):
    per sample, kept with probability 1 - drop_path and scaled by its
    inverse."""
    if training and drop_path > 0:
        keep = 1 - drop_path
        mask = torch.rand(out.shape[0], 1, 1, 1).add_(keep).floor_()
        out = out / keep * mask
    return out


def _downsample(inplanes, out, stride):
    """A residual block's projection shortcut, None where the shape stays
    (the UNet oracle's blocks too)."""
    if stride == 1 and inplanes == out:
        return None
    return nn.Sequential(
        nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
        nn.BatchNorm2d(out))


def _residual(y, x, downsample):
    """A residual block's output: relu(y + its input, through
    ``downsample`` where there is one)."""
    identity = x if downsample is None else downsample(x)
    return F.relu(y + identity)


def _run_stages(model, x, outs):
    """``model.layer1`` to ``layer4`` with the KCLA state carried from
    stage to stage; appends each stage's output to ``outs`` (the UNet
    oracle's encoder too)."""
    u = z = None
    for i in range(1, 5):
        x, u, z = getattr(model, f'layer{i}')(x, u, z)
        outs.append(x)
    return outs


class OfficialKCLA(nn.Module):

    def __init__(self, c, init_layer, stride=2, drop_path=0., head=64):
        super().__init__()
        self.head = head  # 64 in the ImageNet model, 16 in the CIFAR one
        self.heads = c // head
        self.init_layer = init_layer
        self.drop_path = drop_path
        k = _eca_k(c)
        if init_layer:
            # official: in = c // 2, grouped by heads, hard-coded stride 2
            self.adjust_channel = nn.Conv2d(
                c // 2, c, 1, stride=stride, groups=self.heads, bias=False)
            self.u_Wk = _conv1d(k)
            self.u_bn = nn.BatchNorm2d(c)
        self.bn_attention = nn.BatchNorm2d(c)
        self.Wq = _conv1d(k)
        self.Wk = _conv1d(k)
        self.Wv = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.head_att = nn.Linear(self.heads, self.heads, bias=False)
        self.norm_d = _norm_d(self.heads)

    def weight_of(self, key):
        """w = exp(min(||K|| / tau, 10)) per head, shape (b, heads, 1,1,1)."""
        return torch.exp(
            torch.clamp(
                torch.norm(key, dim=2, keepdim=True) / self.norm_d, max=10))

    def forward(self, x, u, z):
        b, c, h, w = x.shape
        g, d = self.heads, self.head
        if u is not None and self.init_layer:
            a = (u / z).reshape(b, -1, u.shape[-2], u.shape[-1])
            if a.shape[1] != c:
                a = self.adjust_channel(a)
            a = self.u_bn(a)
            k = self.u_Wk(a.mean((2, 3)).view(b, 1, c)).view(b, g, d, 1, 1)
            z = self.weight_of(k)
            u = a.view(b, g, d, h, w) * z
        pooled = x.mean((2, 3)).view(b, 1, c)
        q = self.Wq(pooled).view(b, g, d, 1, 1)
        k = self.Wk(pooled).view(b, g, d, 1, 1)
        w_t = self.weight_of(k)
        xs = x.view(b, g, d, h, w)
        if u is None:
            u, z = w_t * xs, w_t
        else:
            u, z = u + w_t * xs, z + w_t
        v = self.Wv((u / (z + 1e-3)).reshape(b, c, h, w))
        k_norm = torch.norm(k, dim=2, keepdim=True)
        q_cos = (q * k).sum(2, keepdim=True) / k_norm  # ||Q|| cos(theta)
        gate = torch.sigmoid(self.head_att(q_cos.view(b,
                                                      g))).view(b, g, 1, 1, 1)
        out = F.relu(
            self.bn_attention((gate * v.view(b, g, d, h, w)).view(b, c, h, w)))
        return x + _drop_path(out, self.drop_path, self.training), u, z


class OfficialBottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(
            planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = _downsample(inplanes, out, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return _residual(y, x, self.downsample)


class _KCLAStage(nn.Module):
    """A stage's ``layers`` (blocks), each followed by its ``attention``
    (KCLA layer) with the state carried (the UNet oracle's stages too)."""

    def forward(self, x, u, z):
        for layer, attention in zip(self.layers, self.attention):
            x, u, z = attention(layer(x), u, z)
        return x, u, z


class OfficialStage(_KCLAStage):

    def __init__(self, inplanes, planes, blocks, stride, drop_path):
        super().__init__()
        c = planes * 4
        self.layers = nn.Sequential(
            OfficialBottleneck(inplanes, planes, stride),
            *[OfficialBottleneck(c, planes) for _ in range(1, blocks)])
        self.attention = nn.Sequential(*[
            OfficialKCLA(c, init_layer=i in (0, 11), drop_path=drop_path)
            for i in range(blocks)
        ])


class OfficialKCLAResNet(nn.Module):

    def __init__(self, depth=50, num_classes=1000, drop_path=0.):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        inplanes = 64
        for i, blocks in enumerate(STAGE_BLOCKS[depth]):
            planes = 64 * 2**i
            self.add_module(
                f'layer{i + 1}',
                OfficialStage(inplanes, planes, blocks, 1 if i == 0 else 2,
                              drop_path))
            inplanes = planes * 4
        self.fc = nn.Linear(inplanes, num_classes)

    def stages(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        return _run_stages(self, x, [])

    def forward(self, x):
        return self.fc(self.stages(x)[-1].mean((2, 3)))


def randomise_(model, seed=0):
    """Give every parameter and BN statistic a non-trivial value, so that a
    wrong mapping or a wrong equation cannot hide behind an identity init
    (e.g. zero-initialised residual BNs)."""

    def vector(name, shape, gen):  # BN affine
        # Residual-branch BNs get small scales, as trained ResNets have;
        # otherwise 100 random blocks blow the features up and fp32
        # rounding, not the math, dominates comparisons.
        residual = '.bn3.' in name or 'bn_attention' in name
        if name.endswith('weight'):
            offset = 0.1 if residual else 0.75
        else:
            offset = -0.1
        return torch.rand(shape, generator=gen) * 0.25 + offset

    return randomise_with_(model, seed, vector)


def randomise_with_(model, seed, vector):
    """The oracles' randomisation (the UNet oracle's too), from a generator
    seeded with ``seed``: ``vector(name, shape, generator)`` for the 1-D
    parameters, randn / sqrt(fan_in) for the others, ``norm_d`` left as it
    is, then non-trivial BN running statistics."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('norm_d'):
                continue
            if p.dim() == 1:
                p.copy_(vector(name, p.shape, gen))
            else:
                fan_in = p[0].numel()
                p.copy_(
                    torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
        for name, buf in model.named_buffers():
            if name.endswith('running_mean'):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
            elif name.endswith('running_var'):
                buf.copy_(torch.rand(buf.shape, generator=gen) + 0.5)
    return model
