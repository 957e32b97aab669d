"""``fm.save(obj, path)`` / ``fm.load(path)``: checkpoints as safetensors files, through the
``safetensors`` package (readable by ``safetensors.numpy`` and ``safetensors.torch``).

``obj`` is a dict of Arrays or NumPy arrays (a Module's ``state_dict()``); nested dicts (an
optimizer's ``state_dict()``) are flattened with dotted keys (``state.0.exp_avg``). The
values that are not arrays (``step`` counts, hyper-parameters, lists of parameter indices)
go to the file's metadata as JSON, so ``load`` gives back the same nesting. A file written by
another program (``safetensors.torch.save_file``) loads as a flat dict of Arrays."""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from ._core import Array
from .ops.creation import asarray

__all__ = ["save", "load"]

_TREE = "fastmetal.tree"  # the metadata key of the nesting and the non-array values
_LOSSLESS = {np.dtype(np.int32): np.int64, np.dtype(np.int16): np.int64,
             np.dtype(np.int8): np.int64, np.dtype(np.uint8): np.int64,
             np.dtype(np.bool_): np.int64}


def _flatten(obj: Any, prefix: str, arrays: dict, where: str) -> Any:
    """The tree with arrays replaced by their dotted keys (collected into `arrays`)."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            name = str(key)
            out[name] = _flatten(value, f"{prefix}.{name}" if prefix else name, arrays, where)
        return {"dict": out, "keys": [type(k).__name__ for k in obj]}
    if isinstance(obj, (Array, np.ndarray)):
        value = obj.numpy() if isinstance(obj, Array) else obj
        # ascontiguousarray makes a 0-d array 1-d: keep the shape (a BatchNorm's
        # num_batches_tracked is 0-d, and load_state_dict checks shapes).
        host = np.ascontiguousarray(value).reshape(value.shape)
        if prefix in arrays:
            raise ValueError(f"[{where}] expected distinct dotted keys, got {prefix!r} twice "
                             "(a nested key and a key with dots that spell the same path)")
        arrays[prefix] = host
        return {"array": prefix}
    if isinstance(obj, (list, tuple)):
        return {"list": [_flatten(v, f"{prefix}.{i}", arrays, where) for i, v in enumerate(obj)],
                "tuple": isinstance(obj, tuple)}
    if obj is None or isinstance(obj, (bool, int, float, str)) or \
            isinstance(obj, (np.integer, np.floating, np.bool_)):
        return {"value": obj.item() if isinstance(obj, np.generic) else obj}
    raise TypeError(f"[{where}] expected dicts, lists, arrays, numbers and strings, got "
                    f"{type(obj).__name__} at {prefix!r}")


def _rebuild(node: dict, arrays: dict) -> Any:
    if "dict" in node:
        types = iter(node["keys"])
        return {(int(k) if next(types) == "int" else k): _rebuild(v, arrays)
                for k, v in node["dict"].items()}
    if "array" in node:
        return arrays[node["array"]]
    if "list" in node:
        items = [_rebuild(v, arrays) for v in node["list"]]
        return tuple(items) if node["tuple"] else items
    return node["value"]


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` (a dict of arrays, nested dicts allowed) to ``path`` as safetensors."""
    where = "fastmetal.save"
    if not isinstance(obj, dict):
        raise TypeError(f"[{where}] expected a dict (a state_dict), got {type(obj).__name__}")
    arrays: dict = {}
    tree = _flatten(obj, "", arrays, where)
    save_file(arrays, os.fspath(path), metadata={_TREE: json.dumps(tree)})


def load(path: str | os.PathLike, device: str | None = None) -> Any:
    """Read a safetensors file: what :func:`save` wrote, nesting included, or any file's
    tensors as a flat dict; arrays come back as Arrays on ``device`` (default device)."""
    where = "fastmetal.load"
    arrays: dict = {}
    try:
        handle = safe_open(os.fspath(path), framework="numpy")
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors' own error type: a truncated or foreign file
        raise ValueError(f"[{where}] expected a safetensors file, got {os.fspath(path)!r}, "
                         f"which is not one or is truncated ({e})") from None
    with handle as f:
        metadata = f.metadata() or {}
        for key in f.keys():
            host = f.get_tensor(key)
            if host.dtype in _LOSSLESS:
                host = host.astype(_LOSSLESS[host.dtype])
            if host.dtype not in (np.float32, np.float16, np.int64):
                raise TypeError(f"[{where}] expected float32, float16 or integer tensors, got "
                                f"{key!r} of dtype {host.dtype} (convert it before saving)")
            arrays[key] = asarray(host, dtype=host.dtype, device=device)
    if _TREE in metadata:
        return _rebuild(json.loads(metadata[_TREE]), arrays)
    return arrays
