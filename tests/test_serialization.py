"""fm.save / fm.load: safetensors checkpoints of Modules and optimizers that round-trip on
every device, read by the safetensors package itself, and PyTorch's files read back."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from helpers import host, needs_torch, torch


def _model(device):
    fm.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4, device=device), nn.Tanh(), nn.Linear(4, 2, device=device))


def test_module_and_optimizer_checkpoints_round_trip(tmp_path, device):
    model = _model(device)
    opt = fm.optim.Adam(model.parameters(), lr=1e-2)
    x = fm.asarray(np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32), device=device)
    for _ in range(2):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    fm.save(model.state_dict(), tmp_path / "model.safetensors")
    fm.save(opt.state_dict(), tmp_path / "optim.safetensors")
    loaded = fm.load(tmp_path / "model.safetensors", device=device)
    assert list(loaded) == list(model.state_dict())
    assert all(isinstance(v, fm.Array) and v.device == device for v in loaded.values())
    fm.manual_seed(99)  # different initial values, then the checkpoint's
    fresh = nn.Sequential(nn.Linear(3, 4, device=device), nn.Tanh(), nn.Linear(4, 2, device=device))
    fresh.load_state_dict(loaded)
    np.testing.assert_array_equal(host(fresh(x)), host(model(x)))
    state = fm.load(tmp_path / "optim.safetensors", device=device)
    assert state["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert state["param_groups"][0]["betas"] == (0.9, 0.999) and state["state"][0]["step"] == 2
    resumed = fm.optim.Adam(fresh.parameters(), lr=1e-2)
    resumed.load_state_dict(state)
    for m, o in ((model, opt), (fresh, resumed)):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    for (_, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        np.testing.assert_array_equal(host(a), host(b))


def test_the_file_is_plain_safetensors(tmp_path):
    from safetensors.numpy import load_file
    sd = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(7, np.int64),
          "h": fm.asarray(np.ones(2, np.float16))}
    fm.save(sd, tmp_path / "f.safetensors")
    raw = load_file(str(tmp_path / "f.safetensors"))
    assert set(raw) == {"w", "n", "h"} and raw["h"].dtype == np.float16
    np.testing.assert_array_equal(raw["w"], sd["w"])


@needs_torch
def test_pytorch_files_load_as_arrays(tmp_path):
    from safetensors.torch import save_file
    layer = torch.nn.BatchNorm2d(3)
    layer(torch.randn(4, 3, 2, 2))  # running statistics and num_batches_tracked (int64)
    save_file(layer.state_dict(), str(tmp_path / "bn.safetensors"))
    loaded = fm.load(tmp_path / "bn.safetensors")
    assert set(loaded) == set(layer.state_dict())
    for k, v in layer.state_dict().items():
        np.testing.assert_array_equal(host(loaded[k]), v.numpy())
    assert loaded["num_batches_tracked"].dtype == np.int64


def test_bad_input_says_what_is_wrong(tmp_path):
    with pytest.raises(TypeError, match=r"\[fastmetal.save\] expected a dict"):
        fm.save([1, 2], tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match=r"expected dicts, lists, arrays.*got object at 'a'"):
        fm.save({"a": object()}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="distinct dotted keys"):
        fm.save({"a.b": np.zeros(1), "a": {"b": np.zeros(1)}}, tmp_path / "x.safetensors")
    from safetensors.numpy import save_file
    save_file({"d": np.zeros(2, np.float64)}, str(tmp_path / "d.safetensors"))
    with pytest.raises(TypeError, match=r"'d' of dtype float64"):
        fm.load(tmp_path / "d.safetensors")


def test_truncated_or_foreign_files_are_a_value_error(tmp_path):
    fm.save({"w": np.ones((64, 64), np.float32)}, tmp_path / "ok.safetensors")
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "foreign.npz").write_bytes(b"PK\x03\x04 not a safetensors file at all")
    for name in ("cut.safetensors", "foreign.npz"):
        with pytest.raises(ValueError, match=r"\[fastmetal.load\] expected a safetensors file"):
            fm.load(tmp_path / name)


def test_zero_dimensional_arrays_keep_their_shape(tmp_path, device):
    """A BatchNorm's num_batches_tracked is 0-d: it comes back 0-d, so load_state_dict (which
    checks shapes) takes the checkpoint of a model with BatchNorm."""
    bn = fm.nn.BatchNorm2d(3, device=device)
    bn(fm.asarray(np.ones((2, 3, 2, 2), np.float32), device=device))
    fm.save({"model": bn.state_dict(), "scalar": np.array(2.5, np.float32)},
            tmp_path / "bn.safetensors")
    back = fm.load(tmp_path / "bn.safetensors", device=device)
    assert back["model"]["num_batches_tracked"].shape == () and back["scalar"].shape == ()
    assert int(back["model"]["num_batches_tracked"].numpy()) == 1
    fresh = fm.nn.BatchNorm2d(3, device=device)
    fresh.load_state_dict(back["model"])
    assert int(fresh.num_batches_tracked.numpy()) == 1
