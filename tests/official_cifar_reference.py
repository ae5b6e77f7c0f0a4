"""An independent, deliberately naive re-implementation of the official
KCLA CIFAR model (github bgx666/KCLA, ``cifar/models/cifar/KCLA.py``,
``ResNet(depth, num_classes, block_name='Bottleneck', drop_path)``), with
its ``state_dict`` key names:

    conv1.*, bn1.*, stages.I.J.{conv1,bn1,...,downsample.*}, stages.I.J.kcla.*,
    fc.*

Its quirks, kept: the KCLA layer (head_dim 16) sits inside the block, after
the block's final ReLU; every stage's first block builds the state
adaptation (``init_cell``) with input width ``planes * 2`` and stride 2,
also stage 1's, whose forward never uses it (no incoming state); the
official file names a ``BasicBlock`` it never defines, so only Bottleneck
models exist. The KCLA layer is :class:`official_reference.OfficialKCLA`
(the same equations as the ImageNet model's) with ``head=16``.

Nothing here is imported by the package.
"""
import torch.nn as nn
import torch.nn.functional as F

from official_reference import OfficialBottleneck, OfficialKCLA


class OfficialCIFARBottleneck(OfficialBottleneck):
    """The official block: the Bottleneck's modules and its ``kcla``."""

    def __init__(self,
                 inplanes,
                 planes,
                 stride=1,
                 init_cell=False,
                 drop_path=0.):
        super().__init__(inplanes, planes, stride)
        self.kcla = OfficialKCLA(
            planes * 4,
            init_layer=init_cell,
            stride=2,
            drop_path=drop_path,
            head=16)

    def forward(self, x, u, z):
        return self.kcla(super().forward(x), u, z)


class OfficialKCLACIFAR(nn.Module):

    def __init__(self, depth=56, num_classes=100, drop_path=0.):
        super().__init__()
        assert (depth - 2) % 9 == 0, 'Bottleneck depths are 9n+2'
        n = (depth - 2) // 9
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        inplanes, stages = 16, []
        for i, planes in enumerate((16, 32, 64)):
            blocks = [
                OfficialCIFARBottleneck(inplanes, planes, 1 if i == 0 else 2,
                                        True, drop_path)
            ]
            inplanes = planes * 4
            blocks += [
                OfficialCIFARBottleneck(inplanes, planes, drop_path=drop_path)
                for _ in range(1, n)
            ]
            stages.append(nn.ModuleList(blocks))
        self.stages = nn.ModuleList(stages)
        self.fc = nn.Linear(inplanes, num_classes)

    def features(self, x):
        """The output of every stage."""
        x = F.relu(self.bn1(self.conv1(x)))
        u = z = None
        outs = []
        for stage in self.stages:
            for block in stage:
                x, u, z = block(x, u, z)
            outs.append(x)
        return outs

    def forward(self, x):
        # AvgPool2d(8) on the 8x8 map of a 32x32 input: the global mean.
        return self.fc(F.avg_pool2d(self.features(x)[-1], 8).flatten(1))
