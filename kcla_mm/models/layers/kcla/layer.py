# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Key-Correlated Layer Attention (KCLA), arXiv 2606.28405.

:meth:`KCLALayer.forward_reference` is the layer as the paper writes it, one
line per equation; it follows the official ImageNet model (github
bgx666/KCLA, ``imagenet/kcla_resnet.py``) equation for equation and is the
oracle of every fast path. The fast paths sit beside it in this package
(:mod:`.fused`, :mod:`.recompute`, :mod:`.compiled`), each tested against
it; :mod:`.dispatch` picks the one that runs a call. Two choices differ
from the official code without changing its fp32 result:

* only the modules that the forward pass uses are built, so DDP does not need
  ``find_unused_parameters``;
* the recurrent state is kept in fp32 whatever the activations' dtype,
  because the official sum of ``exp(.)`` (up to e^10 per layer) overflows
  fp16 after a few layers; so are the pooled statistics (summed in fp32:
  an fp16 sum over a stage-1 map of a 1333 x 800 image overflows as soon
  as a channel averages about 1), Q, K, their norms and the gate, in every
  implementation.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from torch import Tensor

from ..attention_branch import (add_branch, build_state_adapter,
                                check_branch_args, eca_conv1d, init_cfg_list,
                                pooled_conv, pooled_linear, scale_branch,
                                spatial_mean, zero_branch_scale)
from .block_tail import fused_block_and_kcla
from .compiled import compiled_forward, require_extension
from .dispatch import IMPLEMENTATIONS, select_implementation
from .fused import fused_forward
from .params import KCLAParams
from .recompute import recomputed_forward
from .recomputed_input import block_with_recomputed_input
from .state import STATE_EPS, KCLAState
from .train_tail import block_with_fused_tail

#: The fast implementations' forward functions, by name.
IMPLEMENTATION_FORWARDS = {
    'compiled': compiled_forward,
    'fused': fused_forward,
    'recompute': recomputed_forward,
}


def head_temperatures(num_heads: int,
                      temperature_range: Sequence[float]) -> Tensor:
    """Per-head temperatures tau_h: reciprocals of a log-uniform sequence.

    Computed in fp32 exactly as the official code does, so that the values
    (and hence the layer weights) are bit-identical to it.
    """
    start, stop = temperature_range
    log_values = torch.linspace(
        torch.log(torch.tensor(float(start))),
        torch.log(torch.tensor(float(stop))), num_heads)
    return 1 / torch.exp(log_values)


class KCLALayer(BaseModule):
    """Key-Correlated Layer Attention after one residual block.

    Given the block output X^t and the state (U^{t-1}, Z^{t-1}), per head h
    of ``head_dim`` channels::

        Q = conv1d_q(GAP(X^t));  K = conv1d_k(GAP(X^t))
        w_h = exp(min(||K_h|| / tau_h, clamp))
        U^t = U^{t-1} + w X^t;  Z^t = Z^{t-1} + w
        gate_h = sigmoid(Phi(||Q_h|| cos(Q_h, K_h)))
        X^t <- X^t + DropPath(ReLU(Norm(gate * DWConv3x3(U^t / (Z^t + eps)))))

    When ``renorm`` is set (first block of a stage, and the official extra
    block 11), the incoming state is first re-normalised (Algorithm 1 of the
    paper)::

        A = Norm_s(Adapt(U^{t-1} / Z^{t-1}))
        Z^{t-1} = exp(min(||conv1d_s(GAP(A))_h|| / tau_h, clamp))
        U^{t-1} = A Z^{t-1}

    where Adapt, a head-grouped strided 1x1 conv, maps the state to the new
    width and size when either changes.

    Args:
        channels (int): Channels of the block output X^t.
        head_dim (int): Channels per head. Default: 64.
        state_channels (int, optional): Channels of the incoming state when
            it differs from ``channels``. Default: None (same width).
        state_stride (int): Spatial stride between the incoming state and
            X^t. Default: 1.
        renorm (bool): Whether this layer re-normalises the incoming state.
            Default: False.
        temperature_range (Sequence[float]): The per-head temperatures are
            the reciprocals of a log-uniform sequence from
            ``temperature_range[0]`` to ``temperature_range[1]``.
            Default: (0.7, 1 / 0.7).
        clamp (float): Upper bound of ||K|| / tau before ``exp``. Default: 10.
        drop_path (float): Drop-path rate of the attention branch.
            Default: 0.2.
        implementation (str): ``'auto'`` (``'compiled'`` where it applies,
            else ``'fused'``), ``'compiled'`` (:mod:`.compiled`: the
            block-sized work in the C++ kernels that setup builds, two
            passes over memory, nothing block-sized kept for backward;
            CPU, fp32/fp64, NCHW and BatchNorm only; an error where the
            extension is not built, and a call it does not cover raises
            naming the condition that fails: see
            :data:`.compiled.COMPILED_CONDITIONS`), ``'fused'``
            (:mod:`.fused`: pure PyTorch, fewer passes over memory
            than the reference), ``'reference'`` (:meth:`forward_reference`,
            the equations above as written) or ``'recompute'`` (the fused
            path whose train steps keep one block-sized tensor per layer
            for the backward pass instead of four, and recompute the
            branch there: :mod:`.recompute`). All compute the same
            function; :data:`.dispatch.DISPATCH` says which runs a call,
            and ``last_implementation`` which ran the last one.
            Default: 'auto'.
        recompute_block_input (bool): In a train step on the compiled
            kernels, let the block before this layer (the one
            :meth:`forward_with_block` runs) recompute its input, the
            previous layer's output, in backward instead of keeping it
            (:mod:`.recomputed_input`): that is the one block-sized tensor
            per block that KCLA adds to what ResNet keeps, so activation
            memory falls to about ResNet's, for one more pass of the
            previous branch in backward. Gradients are bit for bit the
            same. Default: True.
        zero_init_branch (bool): Multiply the branch output (after its
            ReLU) by a learnable per-channel ``branch_scale`` that starts
            at 0, so that the layer starts by returning X^t unchanged (warm
            start from plain ResNet weights; the state is still computed)
            and the branch still trains. A zero weight and bias of
            ``norm`` would also return X^t, but would put the ReLU's input
            at 0, where its gradient is 0: the branch would never train
            (see :func:`.attention_branch.zero_branch_scale`).
            Default: False (no such parameter, as the official model).
        conv_cfg (dict, optional): Config of the state adaptation conv.
            Default: None (nn.Conv2d).
        norm_cfg (dict): Config of the output and state norms.
            Default: dict(type='BN').
        init_cfg (dict or list[dict], optional): Initialization config.
    """

    def __init__(self,
                 channels: int,
                 head_dim: int = 64,
                 state_channels: Optional[int] = None,
                 state_stride: int = 1,
                 renorm: bool = False,
                 temperature_range: Sequence[float] = (0.7, 1 / 0.7),
                 clamp: float = 10.,
                 drop_path: float = 0.2,
                 implementation: str = 'auto',
                 recompute_block_input: bool = True,
                 zero_init_branch: bool = False,
                 conv_cfg: Optional[dict] = None,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg=(dict(type='Kaiming', layer='Conv2d'),
                           dict(
                               type='Xavier',
                               layer=['Conv1d', 'Linear'],
                               distribution='uniform'))):
        super().__init__(init_cfg=init_cfg_list(init_cfg))
        check_branch_args(channels, head_dim, drop_path)
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f'implementation={implementation!r} must be one '
                             f'of {IMPLEMENTATIONS}')
        if implementation == 'compiled':
            require_extension()
        self.channels = channels
        self.head_dim = head_dim
        self.num_heads = channels // head_dim
        self.clamp = float(clamp)
        self.drop_path = drop_path
        self.implementation = implementation
        self.recompute_block_input = recompute_block_input
        # The implementation that ran the last call (see .dispatch).
        self.last_implementation: Optional[str] = None
        state_channels = channels if state_channels is None else state_channels

        self.query_conv = eca_conv1d(channels)
        self.key_conv = eca_conv1d(channels)
        self.value_conv = nn.Conv2d(
            channels, channels, 3, padding=1, groups=channels, bias=False)
        # Phi: the learnable map over heads of ||Q_h|| cos(theta_h).
        self.head_mix = nn.Linear(self.num_heads, self.num_heads, bias=False)
        self.norm = build_norm_layer(norm_cfg, channels)[1]
        self.branch_scale = zero_branch_scale(channels, zero_init_branch)
        # Fixed, but kept in the state dict so a checkpoint carries the
        # temperatures it was trained with.
        self.register_buffer(
            'tau', head_temperatures(self.num_heads, temperature_range))

        self.renorm = renorm
        if renorm:
            if state_channels != channels or state_stride != 1:
                self.state_adapt = build_state_adapter(conv_cfg,
                                                       state_channels,
                                                       channels, state_stride,
                                                       self.num_heads)
            else:
                self.state_adapt = None
            self.state_norm = build_norm_layer(norm_cfg, channels)[1]
            self.state_key_conv = eca_conv1d(channels)
        elif state_channels != channels or state_stride != 1:
            raise ValueError('a layer whose state changes width or size '
                             'must have renorm=True')

    def recomputes_backward(self, x: Tensor,
                            state: Optional[KCLAState]) -> bool:
        """Whether the call ``self(x, state)`` recomputes its branch in
        backward, decided by the table that picks its implementation
        (:func:`.select_implementation`). Where it does, ``with_cp``
        leaves the layer out of the block's checkpoint (its nodes read each
        other's saved tensors, and it keeps little already); where the
        call runs 'fused' or 'reference' (CUDA, autocast, GN, SyncBN,
        channels_last, ...), the layer joins the checkpoint."""
        return select_implementation(self.implementation, self.params(), x,
                                     state) in ('compiled', 'recompute')

    def params(self) -> KCLAParams:
        """What the fast implementations read, as they read it now
        (:class:`.KCLAParams`)."""
        renorm = self.renorm
        # Children from the dict that Module.__setattr__ and add_module keep
        # them in (a None adapter is a plain attribute, hence .get): each
        # self.<child> is a Python-level Module.__getattr__ call, and every
        # layer of an inference pays this method once (timeit, torch 2.13,
        # a re-normalising layer: 11 us a call that way, 4.6 us this way).
        modules = self._modules
        query_conv = modules['query_conv']
        return KCLAParams(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            query_weight=query_conv.weight,
            key_weight=modules['key_conv'].weight,
            eca_padding=query_conv.padding[0],
            head_mix=modules['head_mix'].weight,
            tau=self.tau,
            clamp=self.clamp,
            value_weight=modules['value_conv'].weight,
            norm=modules['norm'],
            branch_scale=self.branch_scale,
            drop_path=self.drop_path,
            training=self.training,
            renorm=renorm,
            state_adapt=modules.get('state_adapt') if renorm else None,
            state_norm=modules['state_norm'] if renorm else None,
            state_key_conv=modules['state_key_conv'] if renorm else None,
            # Asked only where a gradient can be taken at all: a walk over
            # the parameters is not free at batch 1.
            requires_grad=torch.is_grad_enabled()
            and any(p.requires_grad for p in self.parameters()))

    def split_heads(self, t: Tensor) -> Tensor:
        """(N, C, ...) -> (N, heads, head_dim, ...), a view."""
        return t.view(t.shape[0], self.num_heads, self.head_dim, *t.shape[2:])

    def query_key(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """Q = conv1d_q(GAP(X)) and K = conv1d_k(GAP(X)), each of shape
        (N, heads, head_dim), at least fp32 (:func:`.pooled_conv`)."""
        pooled = spatial_mean(x)[:, None]
        query = pooled_conv(self.query_conv, pooled)
        key = pooled_conv(self.key_conv, pooled)
        return self.split_heads(query[:, 0]), self.split_heads(key[:, 0])

    def layer_weight(self, key_norm: Tensor) -> Tensor:
        """w_h = exp(min(||K_h|| / tau_h, clamp)) from ``key_norm`` =
        ||K_h||, of shape (N, heads)."""
        return torch.exp(torch.clamp(key_norm / self.tau, max=self.clamp))

    def gate(self, query: Tensor, key: Tensor) -> Tensor:
        """gate_h = sigmoid(Phi(||Q_h|| cos(Q_h, K_h))), of shape
        (N, heads), in ``query``'s and ``key``'s (at least fp32) dtype;
        ||Q|| cos = <Q, K> / ||K||."""
        key_norm = torch.linalg.vector_norm(key, dim=2)
        # The clamp only guards K = 0.
        q_cos = (query * key).sum(2) / key_norm.clamp_min(1e-12)
        return torch.sigmoid(pooled_linear(q_cos, self.head_mix.weight))

    def renormalise(self, state: KCLAState) -> KCLAState:
        """Algorithm 1: carry the state across a change of width or size
        (or, at the official block 11, re-normalise it in place)."""
        u, z = state.u, state.z
        n, heads_in = z.shape
        # A = U / Z, Z per head of the previous stage.
        a = (u.view(n, heads_in, -1, *u.shape[2:]) /
             z[..., None, None, None]).flatten(1, 2)
        # The state is fp32; a half-precision model (no autocast) needs its
        # own dtype here.
        a = a.to(self.value_conv.weight.dtype)
        if self.state_adapt is not None:
            a = self.state_adapt(a)
        a = self.state_norm(a)
        key = self.split_heads(
            pooled_conv(self.state_key_conv,
                        spatial_mean(a)[:, None])[:, 0])
        z = self.layer_weight(torch.linalg.vector_norm(key, dim=2))
        u = (self.split_heads(a) * z[..., None, None, None]).flatten(1, 2)
        return KCLAState(u, z)

    def forward_reference(
            self, x: Tensor,
            state: Optional[KCLAState]) -> Tuple[Tensor, KCLAState]:
        """The equations of the class docstring, one line each."""
        if state is not None and self.renorm:
            state = self.renormalise(state)
        query, key = self.query_key(x)
        w = self.layer_weight(torch.linalg.vector_norm(key, dim=2))
        # U^t = U^{t-1} + w X^t;  Z^t = Z^{t-1} + w
        u = self.split_heads(x) * w[..., None, None, None]
        z = w
        if state is not None:
            u = self.split_heads(state.u) + u
            z = state.z + z
        u = u.flatten(1, 2)
        out = self.branch(u, z, self.gate(query, key), x.dtype)
        out = scale_branch(out, self.branch_scale)
        # X^t + DropPath(.)
        x = add_branch(x, out, self.drop_path, self.training)
        return x, KCLAState(u, z)

    def branch(self, u: Tensor, z: Tensor, gate: Tensor,
               dtype: torch.dtype) -> Tensor:
        """The attention output ReLU(Norm(gate * DWConv3x3(U / (Z + eps))))
        in ``dtype``; ``z`` and ``gate`` have shape (N, heads)."""
        a = self.split_heads(u) / (z + STATE_EPS)[..., None, None, None]
        v = self.split_heads(self.value_conv(a.flatten(1, 2).to(dtype)))
        v = v * gate[..., None, None, None]
        return F.relu(self.norm(v.flatten(1, 2).to(dtype)))

    def forward_with_block(
            self, block: nn.Module, x: Tensor,
            state: Optional[KCLAState]) -> Optional[Tuple[Tensor, KCLAState]]:
        """``self(block(x), state)`` with the block's last norm, residual
        add and ReLU fused into the compiled kernels in inference
        (:mod:`.block_tail`), or in a train step, with
        ``recompute_block_input`` the block's convs recomputing ``x``, the
        previous layer's output, in backward instead of keeping it
        (:mod:`.recomputed_input`), and the block's add and ReLU and this
        layer's plane means in one node (:mod:`.train_tail`), where nothing
        could tell the difference; None, having run nothing, elsewhere:
        the caller then runs ``block`` and this layer as modules. A
        layer-attention backbone asks any attention module that offers
        this method."""
        out = fused_block_and_kcla(block, self, x, state)
        if out is not None:
            self.last_implementation = 'compiled'
            return out
        if self.recompute_block_input:
            out = block_with_recomputed_input(block, self, x, state)
            if out is not None:
                return out
        return block_with_fused_tail(block, self, x, state)

    def forward(self, x: Tensor,
                state: Optional[KCLAState]) -> Tuple[Tensor, KCLAState]:
        """Returns the updated block output and the new state.

        Args:
            x (Tensor): The block output X^t, (N, C, H, W).
            state (KCLAState, optional): (U^{t-1}, Z^{t-1}); None at the
                network's first block.
        """
        params = self.params()
        implementation = select_implementation(self.implementation, params, x,
                                               state)
        self.last_implementation = implementation
        if implementation == 'reference':
            return self.forward_reference(x, state)
        return IMPLEMENTATION_FORWARDS[implementation](params, x, state)
