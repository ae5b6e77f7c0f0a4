"""kcla_implementation='recompute' (kcla_mm/models/layers/kcla/recompute.py)
and 'compiled' (kcla/compiled.py: the C++ kernels on the same state tape)
across whole backbones: the reference's outputs, gradients and BN
statistics, and the activation memory they were made for. The layer-level
parity is in test_kcla_fused.py, the kernels' own in test_kcla_compiled.py.
"""

import weakref

import pytest
import torch
import torch.nn as nn
from mmdet.models.backbones import ResNet

from kcla_mm.analysis.complexity import saved_activation_bytes
from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers.kcla.compiled import extension
from kcla_mm.models.layers.kcla.recompute import RecomputedRenorm, StateTape
from helpers import assert_close_to_max, pair, train_step

FORMATS = {
    'contiguous': torch.contiguous_format,
    'channels_last': torch.channels_last
}
SETTINGS = {
    # ImageNet training: every BN learns and updates its statistics.
    'bn': dict(norm_eval=False),
    # Detection: stage 1 frozen, BN statistics frozen.
    'detection': dict(frozen_stages=1, norm_eval=True),
    'with_cp': dict(norm_eval=False, with_cp=True),
    'group_norm':
    dict(norm_eval=False, norm_cfg=dict(type='GN', num_groups=4)),
    'warm_start': dict(norm_eval=False, zero_init_attention=True),
}

# The implementations that keep little for backward ('compiled' where
# its kernels are available).
LEAN = [
    'recompute',
    pytest.param(
        'compiled',
        marks=pytest.mark.skipif(
            extension() is None,
            reason='the compiled kernels are not built or '
            'KCLA_MM_NO_EXTENSION is set'))
]


@pytest.mark.parametrize('memory_format', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('setting', sorted(SETTINGS))
@pytest.mark.parametrize('depth', [50, 101])
@pytest.mark.parametrize('implementation', LEAN)
def test_train_step_is_the_reference(float64, implementation, depth, setting,
                                     memory_format):
    """R101 re-normalises mid-stage (the official block 11), so a stage's
    states are recomputed from two starts there. Odd input size, drop path
    and, after the step, the same BN running statistics (updated once, not
    again by the recomputation). 'compiled' runs its kernels where they
    apply; elsewhere (channels_last, GN) it refuses, and 'auto' runs the
    fused path."""
    if implementation == 'compiled' and (memory_format == 'channels_last'
                                         or setting == 'group_norm'):
        implementation = 'auto'
    reference, ours = pair(
        depth, implementation=implementation, **SETTINGS[setting])
    fmt = FORMATS[memory_format]
    reference.to(memory_format=fmt)
    ours.to(memory_format=fmt)
    x = torch.rand(2, 3, 37, 29).contiguous(memory_format=fmt)
    x.requires_grad_()
    with torch.no_grad():
        grad_outputs = [torch.randn_like(o) for o in reference(x)]
    reference.load_state_dict(ours.state_dict())  # undo that forward's stats
    want, want_grads = train_step(reference, x, grad_outputs)
    got, got_grads = train_step(ours, x, grad_outputs)
    for a, b in zip(got, want):
        assert_close_to_max(a, b, 1e-12)
    assert len(got_grads) == len(want_grads)
    for a, b in zip(got_grads, want_grads):
        assert_close_to_max(a, b, 1e-8)
    want_buffers = dict(reference.named_buffers())
    for name, buffer in ours.named_buffers():
        if setting == 'with_cp' and '.kcla.' in name:
            # The reference's KCLA layers run inside a checkpoint, whose
            # recomputation updates their BN statistics a second time;
            # 'recompute' and 'compiled' leave them out of it (and update
            # them once).
            continue
        assert torch.allclose(buffer, want_buffers[name], atol=1e-12), name


@pytest.mark.parametrize('implementation', LEAN)
def test_a_second_backward_through_a_retained_graph(float64, implementation):
    """The cached states are used up by the first backward pass; a second
    one through the retained graph recomputes them."""
    _, model = pair(
        50, drop_path=0., implementation=implementation, norm_eval=False)
    model.train()
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    loss = sum((o**2).mean() for o in model(x))
    first = torch.autograd.grad(loss, x, retain_graph=True)[0]
    second = torch.autograd.grad(loss, x)[0]
    assert torch.equal(first, second)


@pytest.mark.parametrize('flip', ['train, then eval()', 'eval, then train()'])
@pytest.mark.parametrize('implementation', LEAN)
def test_a_mode_switch_before_backward_changes_no_gradient(
        float64, implementation, flip):
    """A user who calls ``model.eval()`` (or ``train()``) between a
    forward and its backward gets the gradient of the forward, as from
    the reference (test_kcla_fused.py has the layer-level cases)."""
    reference, ours = pair(
        50, drop_path=0., implementation=implementation, norm_eval=False)
    forward_mode = flip.startswith('train')
    x = torch.rand(2, 3, 37, 29, requires_grad=True)
    grads = []
    for model, switch in ((reference, False), (ours, True)):
        model.train(forward_mode)
        x.grad = None
        outs = model(x)
        if switch:
            model.train(not forward_mode)
        sum((o**2).mean() for o in outs).backward()
        grads.append([x.grad] + [p.grad for p in model.parameters()])
    for a, b in zip(*reversed(grads)):
        assert_close_to_max(a, b, 1e-8)


def stage_bytes(model, x):
    """Bytes of one block output per block, and of one state per stage
    (the state has the block output's shape, in fp32)."""
    blocks, stages = 0, 0
    with torch.no_grad():
        for layer_name in model.res_layers:
            layer = getattr(model, layer_name)
            for block in layer:
                x = block(x)
                blocks += x.numel() * x.element_size()
            stages += x.numel() * 4
    return blocks, stages


@pytest.mark.parametrize('setting', ['bn', 'detection'])
@pytest.mark.parametrize('implementation', LEAN)
def test_keeps_one_state_per_stage_not_per_layer(implementation, setting):
    """What a train step keeps for backward beyond mmdet's ResNet (the
    weights excluded): with 'recompute' or 'compiled' (the default where
    the kernels are built), one block output per block (the
    block's ReLU result and the sum after the branch are two tensors) and
    at most one state per stage (where a frozen stage left no tape, the
    next stage's re-normalisation keeps its input); the fused path keeps
    several block-sized tensors per layer more."""
    kwargs = dict(depth=50, base_channels=16, head_dim=16, **SETTINGS[setting])
    torch.manual_seed(0)
    resnet = ResNet(**{k: v for k, v in kwargs.items() if k != 'head_dim'})
    fused = KCLAResNet(kcla_implementation='fused', **kwargs)
    ours = KCLAResNet(kcla_implementation=implementation, **kwargs)
    x = torch.rand(2, 3, 64, 64)
    saved = {}
    for name, model in (('resnet', resnet), ('fused', fused), ('ours', ours)):
        model.train()
        saved[name] = saved_activation_bytes(model, x)
    ours.eval()
    with torch.no_grad():
        stem = ours.maxpool(ours.relu(ours.norm1(ours.conv1(x))))
    blocks, states = stage_bytes(resnet, stem)
    # 1% for the per-(sample, head) vectors and the pooled features.
    bound = blocks + states + 0.01 * saved['resnet']
    assert saved['ours'] - saved['resnet'] <= bound, (saved, blocks, states)
    assert saved['fused'] - saved['resnet'] > bound + blocks, saved


def watch_tapes(monkeypatch, on_state=None):
    """Every :class:`StateTape` the model makes, in a list that fills as it
    does; ``on_state(tape, step)`` is called after each request for a
    state."""
    tapes = []
    init, state = StateTape.__init__, StateTape.state

    def recording_init(tape, start):
        init(tape, start)
        tapes.append(tape)

    def watched_state(tape, step, *args, **kwargs):
        out = state(tape, step, *args, **kwargs)
        on_state(tape, step)
        return out

    monkeypatch.setattr(StateTape, '__init__', recording_init)
    if on_state is not None:
        monkeypatch.setattr(StateTape, 'state', watched_state)
    return tapes


@pytest.mark.parametrize('setting', ['bn', 'detection'])
@pytest.mark.parametrize('implementation', LEAN)
def test_backward_recomputes_one_stage_at_a_time(monkeypatch, implementation,
                                                 setting):
    """A stage's tape starts from what its first layer's Algorithm 1 kept
    (what the strided adapter reads of the previous stage's state), not
    from the previous stage's tape: while the last stage recomputes its
    states, no earlier stage holds recomputed ones (recomputing back to
    the network's first block once held every stage's states at the start
    of backward)."""
    held_by_others = []

    def check(tape, step):
        held_by_others.append(
            sum(t.numel() for other in tapes if other is not tape
                for t in other.cache.values() if t is not None))

    tapes = watch_tapes(monkeypatch, check)
    _, model = pair(50, implementation=implementation, **SETTINGS[setting])
    model.train()
    x = torch.rand(2, 3, 64, 64, requires_grad=True)
    sum(o.mean() for o in model(x)).backward()
    used = [tape for tape in tapes if tape.nodes]
    assert len(used) == 4
    assert held_by_others and max(held_by_others) == 0, held_by_others
    # Every tape was used up.
    assert all(not tape.cache for tape in tapes)


@pytest.mark.parametrize('implementation', LEAN)
def test_a_long_stage_holds_about_a_third_of_its_states(
        monkeypatch, implementation):
    """ResNet-101's third stage runs 12 layers on one tape after the
    official block 11: its backward holds the start, every third state and
    the one asked for, not all 12 at once, and recomputes about 2 x 12
    updates."""
    held, updates = {}, {}
    recompute = StateTape.recompute
    tapes = watch_tapes(monkeypatch)

    def counted(advance, tape):

        def counting_advance(*args):
            updates[tape] += 1
            return advance(*args)

        return counting_advance

    def counting_recompute(tape, step, *args, **kwargs):
        if tape not in updates:
            updates[tape] = 0
            for j, advance in list(tape.advances.items()):
                tape.advances[j] = counted(advance, tape)
        recompute(tape, step, *args, **kwargs)
        held[tape] = max(held.get(tape, 0), len(tape.cache))

    monkeypatch.setattr(StateTape, 'recompute', counting_recompute)
    _, model = pair(101, implementation=implementation, norm_eval=False)
    model.train()
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    sum(o.mean() for o in model(x)).backward()
    longest = max((t for t in tapes if t.nodes), key=lambda t: len(t.nodes))
    layers = len(longest.nodes)
    assert layers == 12
    # The first request, for the state after 11 or 12 updates, caches the
    # start and states 3, 6, 9 and the one asked for.
    assert held[longest] <= 1 + layers // 3 + 1 < layers
    assert held[longest] <= 6, held[longest]
    assert layers <= updates[longest] <= 2 * layers + 2, updates[longest]
    assert all(not tape.cache for tape in tapes)


@pytest.mark.parametrize('implementation', LEAN)
def test_a_mid_stage_renormalisation_leaves_no_checkpoints_behind(
        monkeypatch, implementation):
    """ResNet-101's block 11 re-normalises a state that the tape of the
    stage's first 11 layers recomputes, at the start of the next 12
    layers' backward: that tape hands over the one state without caching
    checkpoints on the way, which would wait through all 12 layers'
    backward for the first 11 layers' own."""
    held = []

    def check(tape, step):
        if len(tape.nodes) == 12:
            first = [t for t in tapes if len(t.nodes) == 11]
            held.append(set(first[0].cache))

    tapes = watch_tapes(monkeypatch, check)
    # Where block 11's convs recompute their input (the default), they take
    # the state after 11 updates too, at the end of those 12 layers: that
    # one state then stays, in place of the output kept otherwise.
    _, model = pair(
        101,
        implementation=implementation,
        norm_eval=False,
        kcla_recompute_outputs=False)
    model.train()
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    sum(o.mean() for o in model(x)).backward()
    # The run's start (step 0: what the node or Algorithm 1's replay
    # holds anyway) and nothing else.
    assert len(held) >= 11 and all(h <= {0} for h in held), held


@pytest.mark.parametrize('implementation', LEAN)
def test_the_mid_stage_replay_is_not_held_through_the_next_layers(
        monkeypatch, implementation):
    """The start of the 12 layers after ResNet-101's block 11 is Algorithm
    1 replayed on a full-size state: nothing of that replay is held while
    those layers' backward runs (block 11's node replays again in its own
    backward, at their end). The strided re-normalisations, whose replays
    are a quarter of the size, run theirs once for both."""
    replays = []
    renormalise = RecomputedRenorm.renormalise

    def recording(ctx, state):
        out = renormalise(ctx, state)
        replays.append((ctx.source is not None, weakref.ref(out.u)))
        return out

    alive = []

    def check(tape, step):
        if len(tape.nodes) == 12:
            alive.append([full for full, ref in replays if ref() is not None])

    monkeypatch.setattr(RecomputedRenorm, 'renormalise',
                        staticmethod(recording))
    tapes = watch_tapes(monkeypatch, check)
    _, model = pair(101, implementation=implementation, norm_eval=False)
    model.train()
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    sum(o.mean() for o in model(x)).backward()
    assert len(alive) >= 11 and not any(True in a for a in alive), alive
    # Two replays of the full-size one, one of each strided one.
    assert sorted(full for full, _ in replays) == [False] * 3 + [True] * 2
    assert all(not tape.cache for tape in tapes)


@pytest.mark.parametrize('implementation', LEAN)
def test_the_tape_recomputes_the_forward_states_bit_for_bit(
        monkeypatch, implementation):
    """Every state the tape hands to a node's backward is the very value
    that node's forward received, in ResNet-101 (a 12-layer run); with
    the kernels, the states that the tape does not cache are written over
    the one before instead of into new tensors."""
    import kcla_mm.models.layers.kcla.compiled as kcla_compiled
    from kcla_mm.models.layers import KCLALayer
    forward_states, in_place = {}, []

    def record_state(layer, args, output):
        tape, step = output[1].tape
        forward_states[(id(tape), step)] = output[1].u.detach().clone()

    handed = []
    state = StateTape.state

    def checking_state(tape, step, *args, **kwargs):
        u = state(tape, step, *args, **kwargs)
        if (id(tape), step) in forward_states:  # not a run's start
            handed.append(torch.equal(u, forward_states[(id(tape), step)]))
        return u

    advance = kcla_compiled.compiled_advance

    def counting_advance(u, w, x, out):
        in_place.append(out is not None and out is u)
        return advance(u, w, x, out)

    monkeypatch.setattr(StateTape, 'state', checking_state)
    monkeypatch.setattr(kcla_compiled, 'compiled_advance', counting_advance)
    _, model = pair(101, implementation=implementation, norm_eval=False)
    for layer in model.modules():
        if isinstance(layer, KCLALayer):
            layer.register_forward_hook(record_state)
    model.train()
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    sum(o.mean() for o in model(x)).backward()
    assert len(handed) > 20 and all(handed)
    assert any(in_place) is (implementation == 'compiled')


def with_cp_fallback(case):
    """(backbone kwargs, input transform, context) of a call that 'auto'
    runs as 'fused' (the kernels do not take it)."""
    import contextlib
    plain = contextlib.nullcontext
    if case == 'group_norm':
        return dict(norm_cfg=dict(type='GN', num_groups=4)), None, plain
    if case == 'channels_last':
        return {}, torch.channels_last, plain
    if case == 'autocast':
        return {}, None, lambda: torch.autocast('cpu', torch.bfloat16)
    return {}, torch.bfloat16, plain  # a dtype the kernels do not take


@pytest.mark.parametrize(
    'case', ['group_norm', 'channels_last', 'autocast', 'bfloat16'])
def test_with_cp_checkpoints_the_layers_that_run_fused(case):
    """``with_cp`` asks each call whether it recomputes its own backward
    (the table that picks the implementation): where 'auto' falls back to
    'fused', the layer joins the block's checkpoint, so the step keeps no
    more than with 'fused' and with_cp, no more than without with_cp, and
    gives the gradients of the step without it."""
    kwargs, layout, context = with_cp_fallback(case)
    if case == 'autocast' and not hasattr(torch.compiler, 'is_compiling'):
        # Seen on torch 2.1.2: with_cp=True under CPU autocast, the blocks'
        # convs (mmdet's code, reentrant checkpoint) get no gradient at
        # all (layer1.0.conv1.weight, ...), KCLA layers or not.
        pytest.skip(f'torch {torch.__version__}: mmdet\'s reentrant with_cp '
                    'checkpoint under CPU autocast leaves the block convs '
                    'without gradients')
    common = dict(
        depth=50,
        base_channels=16,
        head_dim=16,
        kcla_drop_path=0.,
        norm_eval=False,
        **kwargs)
    models = {
        name: KCLAResNet(kcla_implementation=impl, with_cp=cp, **common)
        for name, (impl, cp) in {
            'auto': ('auto', False),
            'auto_cp': ('auto', True),
            'fused_cp': ('fused', True)
        }.items()
    }
    for model in models.values():
        model.load_state_dict(models['auto'].state_dict())
        model.train()
    x = torch.rand(2, 3, 64, 64)
    if case in ('group_norm', 'channels_last'):  # exact comparison
        for model in models.values():
            model.double()
        x = x.double()
    if layout is torch.bfloat16:
        for model in models.values():
            model.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
    elif layout is not None:
        for model in models.values():
            model.to(memory_format=layout)
        x = x.contiguous(memory_format=layout)
    saved, grads = {}, {}
    for name, model in models.items():
        with context():
            try:
                saved[name] = saved_activation_bytes(model, x)
            except RuntimeError as exc:  # an op this torch lacks on CPU
                pytest.skip(f'{case} on this torch: {exc}')
        layers = [m for m in model.modules() if hasattr(m, 'params')]
        assert {m.last_implementation for m in layers} == {'fused'}
        # In float64: the exact cases run in float64, and rounding their
        # gradients to float32 turned a 1e-17 difference into one float32
        # ulp (2^-32 at 2.5e-3) where a value lay at a float32 rounding
        # boundary (layer3.0.conv3, one thread, an Intel VM).
        grads[name] = [p.grad.double() for p in model.parameters()]
    assert saved['auto_cp'] <= saved['fused_cp']
    assert saved['auto_cp'] < saved['auto']
    if case in ('autocast', 'bfloat16'):
        # Relative to the largest gradient: bf16 rounds every small one.
        assert_close_to_max(
            torch.cat([g.flatten() for g in grads['auto_cp']]),
            torch.cat([g.flatten() for g in grads['auto']]), 5e-2)
    else:
        for got, want in zip(grads['auto_cp'], grads['auto']):
            assert_close_to_max(got, want, 1e-9)


def test_with_cp_decision_for_syncbn():
    """A SyncBN (mmengine's conversion) cannot be replayed locally: the
    layer's train-step call runs 'fused' and joins the checkpoint. (A
    SyncBN train step itself needs a GPU: tests/test_cuda.py.)"""
    from mmengine.model import convert_sync_batchnorm
    model = convert_sync_batchnorm(
        KCLAResNet(depth=18, base_channels=16, head_dim=16))
    layer = model.layer1[0].kcla
    assert isinstance(layer.norm, torch.nn.SyncBatchNorm)
    x = torch.rand(2, 16, 8, 8, requires_grad=True)
    assert not layer.recomputes_backward(x, None)
    plain = KCLAResNet(depth=18, base_channels=16, head_dim=16)
    expected = extension() is not None
    assert plain.layer1[0].kcla.recomputes_backward(x, None) == expected


@pytest.mark.parametrize('implementation', ['recompute', 'auto'])
def test_backward_replays_with_the_tensors_of_the_forward(implementation):
    """After the forward pass, every parameter of the branch norms and of
    Algorithm 1 is replaced on its module by another tensor (as FSDP swaps
    in new views or shards between forward and backward): the gradients
    still reach the tensors the forward used, equal to an undisturbed
    step's."""
    from kcla_mm.models.layers import KCLALayer
    from helpers import small_kcla
    x = torch.rand(2, 3, 64, 64)
    plain = small_kcla(implementation)
    sum((o**2).mean() for o in plain(x)).backward()
    model = small_kcla(implementation)
    loss = sum((o**2).mean() for o in model(x))
    used = []
    for name, layer in model.named_modules():
        if not isinstance(layer, KCLALayer):
            continue
        for part in ('norm', 'state_adapt', 'state_norm', 'state_key_conv'):
            module = getattr(layer, part, None)
            for key, p in list(getattr(module, '_parameters', {}).items()):
                if p is not None:
                    used.append((f'{name}.{part}.{key}', p))
                    module._parameters[key] = nn.Parameter(
                        torch.full_like(p, 7.))
    assert any('state_adapt' in n for n, _ in used)
    loss.backward()
    want = dict(plain.named_parameters())
    for name, p in used:
        assert p.grad is not None, name
        torch.testing.assert_close(
            p.grad, want[name].grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize('implementation', LEAN)
def test_a_second_derivative_is_refused_not_wrong(implementation):
    """The lean nodes' gradients are not recorded for a second derivative:
    create_graph=True raises, naming the implementations that give one,
    instead of returning a silently wrong one ('fused' does)."""
    _, model = pair(18, implementation=implementation, norm_eval=False)
    model.train()
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="'fused' or 'reference'"):
        torch.autograd.grad(
            sum(o.square().sum() for o in model(x)), x, create_graph=True)
    # Once, without create_graph, it runs.
    torch.autograd.grad(sum(o.square().sum() for o in model(x)), x)
