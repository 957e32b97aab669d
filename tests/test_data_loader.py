"""fastmetal.data's DataLoader / TensorDataset / Dataset against the batches NumPy gives:
order, shuffling (a permutation, reproducible through fm.manual_seed or a generator),
drop_last, samplers, collation of custom datasets, dtypes and devices."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.data import DataLoader, Dataset, TensorDataset
from helpers import host

X = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
Y = np.arange(10, dtype=np.int64) % 4


def test_batches_in_order_with_the_last_smaller(device):
    batches = list(DataLoader(TensorDataset(X, Y), batch_size=4, device=device))
    assert len(batches) == 3 == len(DataLoader(TensorDataset(X, Y), batch_size=4))
    xb, yb = batches[-1]
    assert isinstance(xb, fm.Array) and xb.device == device and xb.dtype == np.float32
    assert yb.dtype == np.int64
    np.testing.assert_array_equal(np.concatenate([host(b[0]) for b in batches]), X)
    assert [host(b[1]).shape for b in batches] == [(4,), (4,), (2,)]
    assert len(list(DataLoader(TensorDataset(X), batch_size=4, drop_last=True))) == 2


def test_shuffle_is_a_seeded_permutation(device):
    def epoch():
        return np.concatenate([host(b[1]) for b in
                               DataLoader(TensorDataset(X, np.arange(10)), batch_size=3,
                                          shuffle=True, device=device)])
    fm.manual_seed(5)
    a, b = epoch(), epoch()
    fm.manual_seed(5)
    assert sorted(a) == list(range(10)) and not np.array_equal(a, b)  # each epoch anew
    np.testing.assert_array_equal(epoch(), a)
    g1, g2 = fm.random.Generator(7), fm.random.Generator(7)
    one = [host(v) for v in DataLoader(TensorDataset(np.arange(10)), 10, shuffle=True, generator=g1)]
    two = [host(v) for v in DataLoader(TensorDataset(np.arange(10)), 10, shuffle=True, generator=g2)]
    np.testing.assert_array_equal(one[0], two[0])


def test_device_arrays_and_samplers(device):
    xs = fm.asarray(X, device=device)
    loader = DataLoader(TensorDataset(xs, Y), batch_size=2, sampler=[9, 0, 4, 4])
    got = [(host(a), host(b)) for a, b in loader]
    np.testing.assert_array_equal(got[0][0], X[[9, 0]])
    np.testing.assert_array_equal(got[1][1], Y[[4, 4]])


def test_custom_datasets_are_collated():
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"x": np.full(2, i, np.float64), "y": i * i}
    batches = list(DataLoader(Squares(), batch_size=2))
    assert batches[0]["x"].dtype == np.float32 and batches[0]["y"].dtype == np.int64
    np.testing.assert_array_equal(host(batches[1]["y"]), [4, 9])
    sums = list(DataLoader(Squares(), batch_size=5, collate_fn=lambda s: sum(d["y"] for d in s)))
    assert sums == [30]


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"\[fastmetal.data.DataLoader\] expected batch_size"):
        DataLoader(TensorDataset(X), batch_size=0)
    with pytest.raises(ValueError, match="shuffle or a sampler"):
        DataLoader(TensorDataset(X), shuffle=True, sampler=[0])
    with pytest.raises(TypeError, match="expected a dataset"):
        DataLoader(3)
    with pytest.raises(ValueError, match="same first dimension"):
        TensorDataset(X, Y[:3])


def _prefetch_threads():
    import threading
    return [t for t in threading.enumerate() if t.name == "fastmetal-DataLoader-prefetch"]


@pytest.mark.parametrize("tensor_dataset", [True, False])
def test_prefetch_gives_the_same_batches_in_the_same_order(device, tensor_dataset):
    class Squares(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return X[i], Y[i]
    dataset = TensorDataset(X, Y) if tensor_dataset else Squares()
    plain = DataLoader(dataset, batch_size=3, shuffle=True, device=device,
                       generator=fm.random.Generator(4))
    ahead = DataLoader(dataset, batch_size=3, shuffle=True, device=device, prefetch=True,
                       generator=fm.random.Generator(4))
    for (xa, ya), (xb, yb) in zip(plain, ahead, strict=True):
        assert xb.device == device and yb.dtype == np.int64
        np.testing.assert_array_equal(host(xa), host(xb))
        np.testing.assert_array_equal(host(ya), host(yb))
    assert not _prefetch_threads()


def test_prefetch_prepares_the_next_batch_while_the_caller_works():
    import threading
    import time
    prepared = []

    class Slow(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(0.05)
            prepared.append((i, threading.current_thread().name))
            return np.float32(i)
    loader = DataLoader(Slow(), batch_size=1, prefetch=True)
    it = iter(loader)
    first = next(it)
    time.sleep(0.3)  # the caller "trains": the next batch is prepared meanwhile
    assert len(prepared) >= 2 and {n for _, n in prepared} == {"fastmetal-DataLoader-prefetch"}
    assert [host(first)[0]] + [host(b)[0] for b in it] == [0.0, 1.0, 2.0, 3.0]
    assert not _prefetch_threads()


def test_prefetch_raises_the_datasets_exception_where_its_batch_would_come():
    class Broken(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 4:
                raise KeyError(f"sample {i} is missing")
            return np.float32(i)
    got = []
    with pytest.raises(KeyError, match="sample 4 is missing"):
        for b in DataLoader(Broken(), batch_size=2, prefetch=True):
            got.append(host(b).tolist())
    assert got == [[0.0, 1.0], [2.0, 3.0]]
    assert not _prefetch_threads()


def test_prefetch_leaves_no_thread_behind_when_the_loop_stops_early():
    loader = DataLoader(TensorDataset(np.arange(1000, dtype=np.float32)), batch_size=1,
                        prefetch=True)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert not _prefetch_threads()
    with pytest.raises(ZeroDivisionError):
        for _ in loader:
            1 / 0
    assert not _prefetch_threads()
    it = iter(loader)
    next(it)
    it.close()
    assert not _prefetch_threads()


def test_prefetch_must_be_a_bool():
    with pytest.raises(TypeError, match=r"\[fastmetal.data.DataLoader\] expected prefetch"):
        DataLoader(TensorDataset(X), prefetch="yes")


def test_pytorchs_worker_arguments_are_taken(device):
    # PyTorch's loader, as its examples write it: worker processes become the prefetch thread.
    kwargs = {"num_workers": 1, "persistent_workers": True, "pin_memory": True, "shuffle": True}
    workers = DataLoader(TensorDataset(X, Y), batch_size=4, device=device,
                         generator=fm.random.Generator(7), **kwargs)
    plain = DataLoader(TensorDataset(X, Y), batch_size=4, shuffle=True, device=device,
                       generator=fm.random.Generator(7))
    assert workers.prefetch and workers.num_workers == 1 and workers.pin_memory
    for (xa, ya), (xb, yb) in zip(plain, workers, strict=True):
        np.testing.assert_array_equal(host(xa), host(xb))
        np.testing.assert_array_equal(host(ya), host(yb))
    assert not _prefetch_threads()
    assert not DataLoader(TensorDataset(X), num_workers=0, pin_memory=True).prefetch
    with pytest.raises(ValueError, match=r"persistent_workers=True needs num_workers > 0"):
        DataLoader(TensorDataset(X), persistent_workers=True)
    with pytest.raises(ValueError, match=r"expected num_workers to be a non-negative int, got -1"):
        DataLoader(TensorDataset(X), num_workers=-1)
    with pytest.raises(TypeError, match=r"expected pin_memory to be a bool, got 'yes'"):
        DataLoader(TensorDataset(X), pin_memory="yes")
