"""KCLALayer, both implementations, against an independent
re-implementation of the official equations (tests/official_reference.py).
tests/test_kcla_fused.py checks the fused pieces against the reference."""
import pytest
import torch

from kcla_mm.models.layers import KCLALayer, KCLAState
from kcla_mm.models.layers.attention_branch import eca_kernel_size
from kcla_mm.models.layers.kcla import head_temperatures
from helpers import assert_close_to_max, incoming_state
from official_reference import OFFICIAL_TO_MM, OfficialKCLA, randomise_


def paired_layers(channels,
                  renorm,
                  state_channels=None,
                  stride=1,
                  implementation='fused'):
    ref = randomise_(OfficialKCLA(channels, init_layer=renorm, stride=stride))
    ours = KCLALayer(
        channels,
        state_channels=state_channels,
        state_stride=stride,
        renorm=renorm,
        drop_path=0.,
        implementation=implementation)
    state = {}
    for key, value in ref.state_dict().items():
        module, _, rest = key.partition('.')
        if module == 'norm_d':
            state['tau'] = value.flatten()
        elif module == 'adjust_channel' and state_channels is None:
            continue  # the official builds it even where it is never used
        else:
            state[f'{OFFICIAL_TO_MM[module]}.{rest}'] = value
    ours.load_state_dict(state, strict=True)
    return ref, ours


def test_temperatures_and_kernel_size_follow_the_official_definition():
    tau = head_temperatures(4, (0.7, 1 / 0.7))
    seq = torch.exp(
        torch.linspace(
            torch.log(torch.tensor(0.7)), torch.log(torch.tensor(1 / 0.7)), 4))
    assert torch.equal(tau, 1 / seq)
    assert tau[0] == pytest.approx(1 / 0.7) and tau[-1] == pytest.approx(0.7)
    # ECA: t = int(|(log2 C + 1) / 2|), made odd
    assert [eca_kernel_size(c) for c in (64, 256, 512, 1024, 2048)] == \
        [3, 5, 5, 5, 7]


@pytest.mark.parametrize('implementation', ['reference', 'fused'])
@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('case', ['first', 'carry', 'adapt', 'renorm'])
def test_layer_matches_official_equations_float64(float64, mode, case,
                                                  implementation):
    """Forward and backward of one layer, in float64 so that any difference
    is a difference of math, not of rounding."""
    c, n, h, w = 256, 3, 9, 7
    if case == 'adapt':  # width 128 -> 256, size 17x13 -> 9x7
        ref, ours = paired_layers(
            c,
            True,
            state_channels=128,
            stride=2,
            implementation=implementation)
        u0 = torch.rand(n, 2, 64, 17, 13) * 5
        z0 = torch.rand(n, 2, 1, 1, 1) + 0.5
    else:
        ref, ours = paired_layers(
            c, case == 'renorm', implementation=implementation)
        u0 = torch.rand(n, 4, 64, h, w) * 5
        z0 = torch.rand(n, 4, 1, 1, 1) + 0.5
    ref.train(mode == 'train')
    ours.train(mode == 'train')
    x = torch.rand(n, c, h, w, requires_grad=True)
    u0.requires_grad_()
    z0.requires_grad_()
    if case == 'first':
        u0 = z0 = None
    y_ref, u_ref, z_ref = ref(x, u0, z0)
    state = None if u0 is None else KCLAState(u0.flatten(1, 2), z0.flatten(1))
    y, new_state = ours(x, state)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(
        new_state.u, u_ref.flatten(1, 2), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(
        new_state.z, z_ref.flatten(1), rtol=1e-10, atol=1e-10)

    grads = [torch.randn_like(t) for t in (y_ref, u_ref, z_ref)]
    inputs = [x] + ([] if u0 is None else [u0, z0])
    ref_params = [p for p in ref.parameters() if p.requires_grad]
    g_ref = torch.autograd.grad((y_ref, u_ref, z_ref),
                                inputs + ref_params,
                                grads,
                                allow_unused=True)
    g = torch.autograd.grad(
        (y, new_state.u, new_state.z), inputs + list(ours.parameters()),
        (grads[0], grads[1].flatten(1, 2), grads[2].flatten(1)))
    for a, b in zip(g[:len(inputs)], g_ref[:len(inputs)]):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    ref_grads = {
        name: grad
        for (name, p), grad in zip([(k, p) for k, p in ref.named_parameters()
                                    if p.requires_grad], g_ref[len(inputs):])
    }
    for (name, p), grad in zip(ours.named_parameters(), g[len(inputs):]):
        module, _, rest = name.partition('.')
        official = {v: k for k, v in OFFICIAL_TO_MM.items()}[module]
        torch.testing.assert_close(
            grad, ref_grads[f'{official}.{rest}'], rtol=1e-8, atol=1e-10)


def test_only_used_modules_are_built():
    carry = KCLALayer(256)
    assert not any('state' in n for n, _ in carry.named_parameters())
    renorm = KCLALayer(256, renorm=True)
    assert renorm.state_adapt is None  # same width and size: no conv
    adapt = KCLALayer(256, state_channels=128, state_stride=2, renorm=True)
    conv = adapt.state_adapt
    assert (conv.in_channels, conv.out_channels, conv.stride,
            conv.groups) == (128, 256, (2, 2), 4)


def test_drop_path_only_in_training():
    torch.manual_seed(0)
    layer = KCLALayer(64, head_dim=16, drop_path=0.5)
    x = torch.rand(64, 64, 6, 6)
    layer.train()
    y, _ = layer(x, None)
    branch = (y - x).flatten(1).abs().sum(1)
    dropped = (branch == 0).sum().item()
    # 64 samples, p = 0.5: both kinds must occur
    assert 10 < dropped < 54
    layer.eval()
    y1, _ = layer(x.clone(), None)
    y2, _ = layer(x.clone(), None)
    assert torch.equal(y1, y2) and (y1 != x).any()


def test_bad_head_dim_is_named():
    with pytest.raises(ValueError, match='head_dim=48'):
        KCLALayer(256, head_dim=48)


@pytest.mark.parametrize('n', [1, 3])
@pytest.mark.parametrize('mode', ['train', 'eval', 'no_grad'])
@pytest.mark.parametrize('case', ['first', 'carry', 'adapt'])
def test_channels_last_keeps_its_format_and_values(case, mode, n):
    """A channels_last model keeps its state channels_last (a state in the
    other format makes every update a transposing copy) and computes what
    the contiguous model computes."""
    torch.manual_seed(0)
    kwargs = dict(state_channels=128, state_stride=2) \
        if case == 'adapt' else {}
    layer = randomise_(
        KCLALayer(256, renorm=case == 'adapt', drop_path=0., **kwargs))
    layer.train(mode == 'train')
    x = torch.rand(n, 256, 9, 7)
    state = incoming_state(case, n)
    channels_last = torch.channels_last

    def run(memory_format):
        inputs = x.clone(memory_format=memory_format)
        inputs.requires_grad_(mode != 'no_grad')
        layer_state = None if state is None else KCLAState(
            state.u.clone(memory_format=memory_format), state.z.clone())
        with torch.set_grad_enabled(mode != 'no_grad'):
            y, new_state = layer(inputs, layer_state)
        grads = None
        if mode != 'no_grad':
            grads = torch.autograd.grad((y * y).sum() + new_state.u.sum(),
                                        [inputs] + list(layer.parameters()))
        return y, new_state, grads

    y_ref, state_ref, grads_ref = run(torch.contiguous_format)
    y, new_state, grads = run(channels_last)
    assert y.is_contiguous(memory_format=channels_last)
    assert new_state.u.is_contiguous(memory_format=channels_last)
    # fp32 sums in another order (convs, weight gradients), scaled by
    # weights up to e^10 in the state: tolerances relative to the largest
    # entry.
    pairs = [(y, y_ref, 1e-5), (new_state.u, state_ref.u, 1e-5),
             (new_state.z, state_ref.z, 1e-5)]
    if grads is not None:
        pairs += [(ours, ref, 1e-4) for ours, ref in zip(grads, grads_ref)]
    for ours, ref, tol in pairs:
        assert_close_to_max(ours, ref, tol, rtol=1e-4)
