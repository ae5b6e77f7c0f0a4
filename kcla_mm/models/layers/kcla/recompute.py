# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""KCLALayer's training forward with less activation memory: the state
update and the branch as one autograd node, Algorithm 1 as another, that
keep little for backward and recompute the rest there.

For each layer the fused path leaves autograd the new state ``U^t`` (the
depthwise conv's input), the conv's output (the norm's input), the norm's
ReLU output and the block output ``X^t`` besides the new block output
(``X^t`` is the block's ReLU result, but the add makes a second tensor of
it that the next block keeps): four block-sized tensors on top of what
mmdet's ResNet keeps. The nodes here keep ``X^t`` (the very tensor that
the block's ReLU keeps: no extra memory), per-(sample, head) vectors and
no state: a :class:`StateTape` recomputes the states of a stage from its
start. The price is one more forward pass of the branch and of the state
updates in each train step.

The norm is replayed as the forward applied it, without touching its
running statistics (:class:`.NormReplay`); a SyncBN, whose replay would
have to communicate again, and autocast, whose state the backward pass
would have to restore, keep the fused path, as do inference and frozen
layers (nothing to differentiate).
Tested against the reference in tests/test_kcla_fused.py (one layer) and
tests/test_kcla_recompute.py (whole backbones).
"""
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.checkpoint import CheckpointError

from ....torch_compat import (checkpoint_hooks_active, in_process_group,
                              is_autocast_enabled, is_compiling, is_exporting)
from ..attention_branch import (drop_path_mask, grouped_strided_input,
                                head_scaled_add, masked_residual_add,
                                scale_branch)
from ..profiling import phase
from .fused import (adapts_by_matmul, folded_value, fused_forward,
                    fused_query_key, fused_renormalise, gate_and_weight,
                    renormalise_strided_input)
from .norm_replay import NormReplay
from .params import KCLAParams, bound_tensors
from .state import STATE_EPS, KCLAState


def differentiates(p: KCLAParams, x: Tensor,
                   state: Optional[KCLAState]) -> bool:
    """Whether autograd records the call ``layer(x, state)``: grad mode on
    and something it reads requires grad, the input, a parameter or the
    incoming state (a layer called on its own, with a detached input and a
    state that requires grad, must pass the gradient back to the state)."""
    return torch.is_grad_enabled() and (
        x.requires_grad or p.requires_grad or
        (state is not None and
         (state.u.requires_grad or state.z.requires_grad)))


def replayable(p: KCLAParams, x: Tensor, state: Optional[KCLAState]) -> bool:
    """Whether :func:`recomputed_forward` applies: a train step (something
    to differentiate: :func:`differentiates`), no autocast, not under
    torch.compile (the tape's side effects would break the graph at every
    layer; the fused path compiles whole), not while exporting (the
    autograd Function has no symbolic), no activation checkpoint around
    the layer (it lets each saved tensor be unpacked once, and the tape
    unpacks other nodes' tensors; torch 2.1 cannot tell, and the
    checkpoint then stops with its own error), and a norm that can be
    replayed locally."""
    if (is_compiling() or is_exporting() or is_autocast_enabled(x.device.type)
            or checkpoint_hooks_active()):
        return False
    if isinstance(p.norm, nn.SyncBatchNorm):
        return False
    return differentiates(p, x, state)


def update_and_branch(
        p: KCLAParams,
        x: Tensor,
        u_prev: Optional[Tensor],
        w: Tensor,
        scale: Tensor,
        mask: Optional[Tensor],
        norm: Optional[NormReplay] = None) -> Tuple[Tensor, Tensor]:
    """``U^t = U^{t-1} + w X^t`` and ``X^t + mask * branch(U^t)``, the part
    of :func:`.fused_forward` that the node wraps; ``scale`` is
    ``gate / (Z^t + eps)``; ``norm``, in the backward's replay, the norm
    as the forward applied it."""
    with phase('state_update'):
        u = head_scaled_add(u_prev, w, x)
    with phase('branch'):
        out = folded_value(p, u, scale, x.dtype, norm=norm)
        out = scale_branch(out, p.branch_scale)
    with phase('residual'):
        return masked_residual_add(x, out, mask), u


def saved(node) -> Tuple[Optional[Tensor], ...]:
    """``node.saved_tensors``, unpacked by the tape or the node itself.

    Inside a non-reentrant activation checkpoint a saved tensor can be
    unpacked once, which the tape cannot keep to: the layer runs 'fused'
    there (:func:`replayable`) wherever torch can tell
    (:func:`.checkpoint_hooks_active`). torch 2.1 cannot; its error is
    turned into one that names the combination and the alternatives."""
    try:
        return node.saved_tensors
    except CheckpointError as exc:
        raise RuntimeError(
            "KCLALayer with kcla_implementation 'auto' or 'recompute' "
            'inside an activation checkpoint (checkpoint_wrapper, '
            f'use_reentrant=False) is not supported on torch '
            f'{torch.__version__}, which cannot tell the layer that it runs '
            "in one: use the block's with_cp=True, or kcla_implementation="
            "'fused' (torch >= 2.2 falls back to it by itself)") from exc


def differentiable_once(node: str) -> None:
    """Raises where a backward pass is being differentiated itself
    (``create_graph=True``: grad mode is on inside a node's backward only
    then). The nodes here compute their gradients with the kernels, or
    with ``autograd.grad`` on a replay, neither recorded for a second
    derivative, which would then come out silently wrong."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f'{node}: a KCLA train step on kcla_implementation \'auto\' (the '
            "compiled kernels), 'compiled' or 'recompute' can be "
            'differentiated once; for second derivatives (backward or '
            "autograd.grad with create_graph=True) use kcla_implementation="
            "'fused' or 'reference'")


#: The tape caches every this-th state on the way to a requested one. 3
#: recomputes about 2 L updates for a run of L layers, as caching the last
#: sqrt(L) states and every sqrt(L)-th before them does, and holds fewer
#: states for every L up to about 36 (5 against 8 for L = 12).
CHECKPOINT_EVERY = 3

# advance(U^{t-1}, w, X^t, out) -> U^t, written into ``out`` (which is
# U^{t-1} or None) where the implementation can.
StateAdvance = Callable[[Optional[Tensor], Tensor, Tensor, Optional[Tensor]],
                        Tensor]


def torch_advance(u: Optional[Tensor], w: Tensor, x: Tensor,
                  out: Optional[Tensor]) -> Tensor:
    """The state update of :func:`update_and_branch`, bit for bit; always
    into a new tensor."""
    return head_scaled_add(u, w, x)


class StateTape:
    """What the states of one run of layers (a stage, or the part of one
    after a re-normalisation) are recomputed from in backward.

    Within a run ``U^t = U^{t-1} + w_t X^t``, where every ``X^t`` is kept
    for backward anyway (it is the block's ReLU result) and ``w_t`` is a
    vector; so no state is kept: the backward pass of layer t gets
    ``U^{t-1}`` by running the run's updates again from its start, bit for
    bit the forward pass's arithmetic (subtracting ``w_t X^t`` from
    ``U^t`` instead would lose ``U^{t-1}`` to rounding where ``w_t``
    dominates ``Z^{t-1}``). The start comes from ``start``: None at the
    network's first block, else recomputed from what the run's first node
    or the re-normalisation node keeps. Backward visits the layers last to
    first: a request recomputes from the nearest state still cached below
    it and caches on the way every :data:`CHECKPOINT_EVERY`-th state (3rd)
    counted from there, so that a run of L layers holds about L / 3 + 2
    states at once rather than L (12 in ResNet-101's third stage after the
    official block 11), for about 2 L recomputed updates in all (each
    request recomputes at most two before the one asked for); each is
    dropped when its consumers (the next node, a re-normalisation that
    recomputes its input from the tape, the next block's convs that
    recompute the layer's output: :meth:`consumes`) have taken it. Each
    step is recomputed as its node's forward computed it (the ``advance``
    it recorded); the compiled kernels' update writes a state that the
    tape does not cache over the one before, so a recomputation allocates
    only what it caches.

    The tape reads ``X^t`` and ``w_t`` from the nodes' saved tensors
    (weak references: no cycle keeps a graph alive), so saved-tensor hooks
    (offloading, checkpointing) see every tensor it uses.
    """

    def __init__(self, start: Optional[Callable[[], Optional[Tensor]]]):
        # None: the run's first node keeps its incoming state.
        self.start = start
        self.nodes: Dict[int, Callable[[], object]] = {}
        self.advances: Dict[int, StateAdvance] = {}
        self.cache: Dict[int, Optional[Tensor]] = {}
        # step -> how many take its state in one backward pass, and of a
        # cached state how many have yet to.
        self.consumers: Dict[int, int] = {}
        self.left: Dict[int, int] = {}

    def consumes(self, step: int) -> None:
        """One more consumer takes the state after ``step`` updates in each
        backward pass (one is assumed where none said so)."""
        self.consumers[step] = self.consumers.get(step, 0) + 1

    def record(self,
               step: int,
               node,
               keep_prev: bool,
               advance: Optional[StateAdvance] = None) -> None:
        """Step ``step`` (from 1) is the update of ``node``, a
        :class:`RecomputedUpdate` context (or the compiled kernels'), whose
        forward computed its state as ``advance`` does (default:
        :func:`torch_advance`); unless it keeps its incoming state
        (``keep_prev``), its backward takes that state from the tape."""
        if not keep_prev:
            self.consumes(step - 1)
        self.nodes[step] = weakref.ref(node)
        self.advances[step] = torch_advance if advance is None else advance

    def state(self, step: int, on_the_way: bool = True) -> Optional[Tensor]:
        """``U`` after ``step`` updates (the start for 0), for one of its
        consumers; ``on_the_way=False`` caches no checkpoints on the way
        (for a consumer whose neighbours take theirs much later)."""
        if step not in self.cache:
            with torch.no_grad(), phase('tape'):
                self.recompute(step, on_the_way)
        u = self.cache[step]
        left = self.left.get(step, self.consumers.get(step, 1)) - 1
        if left > 0:
            self.left[step] = left
        else:
            del self.cache[step]
            self.left.pop(step, None)
        return u

    def recompute(self, step: int, on_the_way: bool = True) -> None:
        """Caches ``U`` after ``step`` updates and the checkpoints on the
        way there (class docstring), bit for bit the forward's."""
        below = [j for j in self.cache if j < step]
        if below:
            base = max(below)
            u = self.cache[base]
        else:
            base = 0
            u = self.cache[0] = (
                saved(self.nodes[1]())[1]
                if self.start is None else self.start())
            self.left.pop(0, None)
        # Whether u is a state that only this loop holds (not cached, not
        # the start): the next one may then be written over it.
        private = False
        for j in range(base + 1, step + 1):
            x, _, w = saved(self.nodes[j]())[:3]
            u = self.advances[j](u, w, x, u if private else None)
            private = j < step and not (on_the_way and
                                        (j - base) % CHECKPOINT_EVERY == 0)
            if not private:
                self.cache[j] = u
                self.left.pop(j, None)


class RecomputedUpdate(torch.autograd.Function):
    """(x, U^{t-1}, w, scale, mask, *params) -> (x + branch, U^t), keeping
    for backward x, vectors and, only where no tape can recompute it,
    U^{t-1}."""

    @staticmethod
    def forward(ctx, p: KCLAParams, tape: StateTape, step: int,
                keep_prev: bool, x: Tensor, u_prev: Optional[Tensor],
                w: Tensor, scale: Tensor, mask: Optional[Tensor], *params:
                nn.Parameter) -> Tuple[Tensor, Tensor]:
        ctx.params, ctx.tape, ctx.step = p, tape, step
        ctx.keep_prev = keep_prev
        ctx.norm_attributes = where(p.norm_attributes())
        ctx.norm = NormReplay(p.norm)
        ctx.set_materialize_grads(False)
        tape.record(step, ctx, keep_prev)
        ctx.save_for_backward(x, u_prev if keep_prev else None, w, scale, mask,
                              *params)
        return update_and_branch(p, x, u_prev, w, scale, mask)

    @staticmethod
    def backward(ctx, grad_x: Optional[Tensor], grad_u: Optional[Tensor]):
        differentiable_once('RecomputedUpdate')
        x, u_prev, w, scale, mask, *params = saved(ctx)
        if ctx.keep_prev:
            # The run's recomputation cached this start too: drop it.
            ctx.tape.cache.pop(0, None)
        else:
            u_prev = ctx.tape.state(ctx.step - 1)
        needs = ctx.needs_input_grad
        inputs = [
            None if t is None else t.detach().requires_grad_(need)
            for t, need in zip((x, u_prev, w, scale), needs[4:8])
        ]
        # params: the depthwise kernel, the norm's, the branch scale.
        norm_tensors = params[1:1 + len(ctx.norm_attributes)]
        with torch.enable_grad(), bound_tensors(ctx.norm_attributes,
                                                norm_tensors):
            outputs = update_and_branch(ctx.params, *inputs, mask, ctx.norm)
        with phase('backward'):
            grads = grads_of(outputs, (grad_x, grad_u), inputs + params)
        return (None, None, None, None, *grads[:4], None, *grads[4:])


class RecomputedRenorm(torch.autograd.Function):
    """(U, Z, *params) -> Algorithm 1's (U, Z), keeping for backward the
    incoming Z and what its adapter reads of the incoming U (instead of
    U / Z, the adapted state, its norm's output and the new U).

    A strided adapter reads a quarter of U (:func:`.adapts_by_matmul`):
    that is kept, so that the next stage's tape starts from this node
    alone. Recomputing it from the previous stage's tape instead would, at
    the first layer of backward, recompute and hold the states of every
    stage before (each tape's start depends on the one before): in a
    ResNet-50 train step at 8x3x224x224 the allocated bytes rose by about
    300 MB at the first layer of backward, against ResNet's 60 MB.
    Elsewhere (no adapter, stride 1: the adapter reads all of U) the
    incoming U is recomputed from ``source`` where a tape made it, else
    kept."""

    @staticmethod
    def forward(ctx, p: KCLAParams, source: Optional[Tuple[StateTape,
                                                           int]], u: Tensor,
                z: Tensor, *params: nn.Parameter) -> Tuple[Tensor, Tensor]:
        ctx.params = p
        ctx.renorm_attributes = where(p.renorm_attributes())
        ctx.state_norm = NormReplay(p.state_norm)
        ctx.set_materialize_grads(False)
        if keeps_strided_input(p, u):
            sub, ctx.size = grouped_strided_input(p.state_adapt, u)
            ctx.source, ctx.incoming_shape = None, u.shape
            ctx.save_for_backward(sub, z, *params)
            with phase('renormalise'):
                return tuple(renormalise_strided_input(p, sub, ctx.size, z))
        ctx.source, ctx.incoming_shape = source, None
        if source is not None:
            source[0].consumes(source[1])
        ctx.save_for_backward(None if source else u, z, *params)
        with phase('renormalise'):
            return tuple(fused_renormalise(p, KCLAState(u, z)))

    @staticmethod
    def incoming_state(ctx) -> KCLAState:
        """(what Algorithm 1 reads of U, Z) as this node saved or its tape
        recomputes them."""
        u, z = saved(ctx)[:2]
        if ctx.source is not None:
            tape, step = ctx.source
            u = tape.state(step, on_the_way=False)
        return KCLAState(u, z)

    @staticmethod
    def renormalise(ctx, state: KCLAState) -> KCLAState:
        norm = ctx.state_norm
        if ctx.incoming_shape is not None:
            return renormalise_strided_input(ctx.params, state.u, ctx.size,
                                             state.z, norm)
        return fused_renormalise(ctx.params, state, norm)

    @staticmethod
    def replay(ctx) -> Tuple[List[Tensor], KCLAState]:
        """(inputs, outputs) of Algorithm 1 run again with autograd, for
        this node's backward, which takes the graph and drops it: the one
        :meth:`start` kept, else run now, from the inputs :meth:`start`
        kept (taken once for both consumers, the tape's start and the
        backward) or taken now."""
        inputs, outputs = getattr(ctx, 'replayed', None) or (None, None)
        ctx.replayed = None  # a second backward pass takes them again
        if outputs is not None:
            return inputs, outputs
        if inputs is None:
            inputs = [
                t.detach().requires_grad_(need) for t, need in zip(
                    RecomputedRenorm.incoming_state(ctx),
                    ctx.needs_input_grad[2:4])
            ]
        with torch.enable_grad(), phase('renormalise'), bound_tensors(
                ctx.renorm_attributes,
                saved(ctx)[2:]):
            outputs = RecomputedRenorm.renormalise(ctx, KCLAState(*inputs))
        return inputs, outputs

    @staticmethod
    def start(ctx) -> Tensor:
        """The new state, bit for bit the forward's, for the tape of the
        layers after this node (requested first, by the run's last layer).
        After a strided adapter its graph is kept for this node's backward
        (at the end of the run's backward, which so runs Algorithm 1 once).
        Where the incoming state comes from a tape (the full-size,
        mid-stage re-normalisation of ResNet-101's block 11) it is not:
        there the adapted state, its norm's output and the new state, each
        of the full state's size, would wait through the next 12 layers'
        backward, at the step's peak of memory; the backward runs
        Algorithm 1 again from the same inputs."""
        inputs, outputs = RecomputedRenorm.replay(ctx)
        ctx.replayed = (inputs, outputs if ctx.source is None else None)
        return outputs.u.detach()

    @staticmethod
    def backward(ctx, grad_u: Optional[Tensor], grad_z: Optional[Tensor]):
        differentiable_once('RecomputedRenorm')
        params = list(saved(ctx)[2:])
        inputs, outputs = RecomputedRenorm.replay(ctx)
        with phase('backward'):
            grads = grads_of(outputs, (grad_u, grad_z), inputs + params)
        if ctx.incoming_shape is not None and grads[0] is not None:
            grads[0] = strided_input_grad(grads[0], ctx.incoming_shape,
                                          ctx.params.state_adapt.stride,
                                          ctx.size)
        return (None, None, *grads)


def keeps_strided_input(p: KCLAParams, u: Tensor) -> bool:
    """Whether :class:`RecomputedRenorm` keeps what a strided adapter
    reads of ``u`` instead of ``u`` (or its tape)."""
    return adapts_by_matmul(p, u) and p.state_adapt.stride != (1, 1)


def strided_input_grad(grad: Tensor, shape: torch.Size,
                       stride: Tuple[int, int], size: Tuple[int,
                                                            int]) -> Tensor:
    """The gradient of U (of ``shape``) from that of
    :func:`.grouped_strided_input` of it (of spatial ``size``): zero where
    the strided 1x1 adapter does not read."""
    full = grad.new_zeros(shape)
    full[:, :, ::stride[0], ::stride[1]] = grad.view(*shape[:2], *size)
    return full


def where(attributes) -> List[Tuple[nn.Module, str, None]]:
    """(module, name) of each tensor attribute, without the tensor (a node
    keeps the tensors as saved tensors, which saved-tensor hooks see)."""
    return [(module, name, None) for module, name, _ in attributes]


def renormalised_start(node) -> Callable[[], Tensor]:
    """The new state of a :class:`RecomputedRenorm` node, from the replay
    that its own backward pass will use."""
    node = weakref.ref(node)

    def start() -> Tensor:
        return RecomputedRenorm.start(node())

    return start


def grads_of(outputs: Sequence[Tensor],
             grad_outputs: Sequence[Optional[Tensor]],
             inputs: Sequence[Optional[Tensor]]) -> List[Optional[Tensor]]:
    """d(outputs . grad_outputs) / d(input) for each of ``inputs`` that
    requires grad (None for the others and for unused ones); outputs
    without a gradient (None) are left out."""
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None]
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    grads = iter(
        torch.autograd.grad([o for o, _ in pairs],
                            wanted, [g for _, g in pairs],
                            allow_unused=True) if pairs and wanted else ())
    return [
        next(grads) if t is not None and t.requires_grad else None
        for t in inputs
    ]


def recomputed_update(p: KCLAParams, tape: StateTape, step: int,
                      keep_prev: bool, x: Tensor, u_prev: Optional[Tensor],
                      w: Tensor, scale: Tensor,
                      mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """The :class:`RecomputedUpdate` node of one p."""
    return RecomputedUpdate.apply(p, tape, step, keep_prev, x, u_prev, w,
                                  scale, mask, *p.branch_parameters())


# update(p, tape, step, keep_prev, x, u_prev, w, scale, mask) -> (x, u)
UpdateNode = Callable[..., Tuple[Tensor, Tensor]]

# pooled(p, x, means, Z^{t-1}) -> (w, Z^t, gate / (Z^t + eps)), each
# (N, heads); means as recomputed_forward takes them.
PooledVectors = Callable[
    [KCLAParams, Tensor, Optional[Tensor], Optional[Tensor]],
    Tuple[Tensor, Tensor, Tensor]]


def torch_pooled(p: KCLAParams, x: Tensor, means: Optional[Tensor],
                 z_prev: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """The pooled-vector work of a layer (queries, keys, the layer weight,
    the gate, ``Z^t`` and the branch's scale) in PyTorch ops, as
    :func:`.fused_forward` runs it."""
    gate, w = gate_and_weight(p, *fused_query_key(p, x, means))
    z = w if z_prev is None else z_prev + w
    return w, z, gate / (z + STATE_EPS)


def recomputed_forward(
        p: KCLAParams,
        x: Tensor,
        state: Optional[KCLAState],
        update: UpdateNode = recomputed_update,
        means: Optional[Tensor] = None,
        pooled: PooledVectors = torch_pooled) -> Tuple[Tensor, KCLAState]:
    """:func:`.fused_forward` (outside inference) with the update and the
    branch in one node made by ``update`` (:class:`RecomputedUpdate`, or
    the compiled kernels' node), the pooled vectors by ``pooled``, and
    Algorithm 1 in a :class:`RecomputedRenorm` node; falls back to the
    fused path where :func:`replayable` says no. ``means``, where given,
    are ``x``'s plane means as :func:`.spatial_mean` gives them, made with
    ``x`` by the caller (:mod:`.train_tail`)."""
    if not replayable(p, x, state):
        return fused_forward(p, x, state)
    # A start that nothing else can recompute (a state from a fused layer,
    # or re-normalised without autograd): the first node keeps it.
    tape, step = StateTape(None), 1
    if state is None:
        tape = StateTape(lambda: None)
    elif p.renorm:
        u, z = RecomputedRenorm.apply(p, state.tape, state.u, state.z,
                                      *p.renorm_parameters())
        # Where a wrapper may shard Algorithm 1's parameters away until
        # this layer's own backward (FSDP per block, in a process group),
        # the later layers cannot replay it: the first node keeps the start.
        if u.requires_grad and not in_process_group():
            tape = StateTape(renormalised_start(u.grad_fn))
        state = KCLAState(u, z)
    elif state.tape is not None:
        tape, step = state.tape
        step += 1
    keep_prev = step == 1 and tape.start is None
    with phase('pooled'):
        w, z, scale = pooled(p, x, means, None if state is None else state.z)
    mask = drop_path_mask(x, p.drop_path, p.training)
    x, u = update(p, tape, step, keep_prev, x,
                  None if state is None else state.u, w, scale, mask)
    # The next layer finds the tape through the state it receives.
    return x, KCLAState(u, z, (tape, step))
