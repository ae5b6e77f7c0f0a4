"""The torch version shims, on whichever stack runs the suite."""
import io
import warnings
from collections import Counter

import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.utils import digit_version

from kcla_mm import torch_compat
from kcla_mm.utils.checkpoint_safety import allow_mmengine_checkpoint_types

NEW_AUTOCAST_QUERY = digit_version(torch.__version__) >= digit_version('2.4')


@pytest.mark.parametrize('query', [
    torch_compat.is_autocast_enabled,
    torch_compat.autocast_enabled_by_device_query
])
def test_autocast_query_follows_autocast(query):
    with warnings.catch_warnings():
        # torch >= 2.4 deprecates the per-device queries.
        warnings.simplefilter('ignore', DeprecationWarning)
        assert not query('cpu') and not query('cuda')
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert query('cpu') and not query('cuda')
            with torch.autocast('cpu', enabled=False):
                assert not query('cpu')
        assert not query('cpu')


def test_legacy_autocast_query_of_an_unknown_device_is_false():
    assert torch_compat.autocast_enabled_by_device_query('nodevice') is False


def test_the_stack_picks_the_autocast_query_it_has():
    assert torch_compat._AUTOCAST_QUERY_TAKES_DEVICE == NEW_AUTOCAST_QUERY
    if not NEW_AUTOCAST_QUERY:
        with pytest.raises(TypeError):
            torch.is_autocast_enabled('cpu')


def training_checkpoint(path):
    loss = HistoryBuffer()
    loss.update(0.5)
    torch.save(
        dict(
            state_dict={'w': torch.ones(2)},
            message_hub=dict(log_scalars={'loss': loss}, counts=Counter(a=1))),
        path)
    return path


def test_training_checkpoint_loads_on_every_stack(tmp_path):
    allow_mmengine_checkpoint_types()
    ckpt = torch_compat.load_checkpoint_file(
        str(training_checkpoint(tmp_path / 'iter_1.pth')))
    assert torch.equal(ckpt['state_dict']['w'], torch.ones(2))
    buffer = ckpt['message_hub']['log_scalars']['loss']
    assert isinstance(buffer, HistoryBuffer) and buffer.current() == 0.5


def test_allow_list_exactly_where_torch_has_it(tmp_path):
    path = str(training_checkpoint(tmp_path / 'iter_1.pth'))
    has_allow_list = allow_mmengine_checkpoint_types()
    assert has_allow_list == torch_compat.WEIGHTS_ONLY_ALLOW_LIST == (
        digit_version(torch.__version__) >= digit_version('2.6'))
    if has_allow_list:
        # Registered: the strict loader takes the training checkpoint.
        torch.load(path, weights_only=True)
        assert HistoryBuffer in torch.serialization.get_safe_globals()
    else:
        # Nothing to register with: the strict loader still refuses it,
        # which is why load_checkpoint_file falls back to mmengine's way.
        with pytest.raises(Exception, match='(?i)unsupported|weights'):
            torch.load(path, weights_only=True)


def test_export_query_answers_as_torch_onnx_does(monkeypatch):
    """is_exporting reads the ONNX exporters' flags itself where torch keeps
    them where :func:`.onnx_export_flags` looks (torch 2.13), and asks torch
    elsewhere (torch 2.1): either way it follows torch's own answer."""
    assert not torch_compat.is_exporting()
    flags = torch_compat.onnx_export_flags()
    if flags is None:
        monkeypatch.setattr(torch.onnx, 'is_in_onnx_export', lambda: True)
        assert torch_compat.is_exporting()
        return
    holders = dict(in_onnx_export=flags[0], _is_onnx_exporting=flags[1])
    for name, holder in holders.items():
        monkeypatch.setattr(holder, name, True)
        assert torch.onnx.is_in_onnx_export()
        assert torch_compat.is_exporting(), name
        monkeypatch.setattr(holder, name, False)
        assert not torch.onnx.is_in_onnx_export()
        assert not torch_compat.is_exporting(), name


def test_export_query_is_true_inside_onnx_export():
    pytest.importorskip('onnx')
    seen = []

    class Probe(torch.nn.Module):

        def forward(self, x):
            seen.append(torch_compat.is_exporting())
            return x + 1

    kwargs = {}
    if 'dynamo' in torch.onnx.export.__code__.co_varnames:
        kwargs['dynamo'] = False
    torch.onnx.export(Probe(), (torch.ones(2), ), io.BytesIO(), **kwargs)
    assert seen and all(seen)
    assert not torch_compat.is_exporting()
