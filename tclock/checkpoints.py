"""The checkpoint format: data only, checked, restored against a template.

A checkpoint file is ``MAGIC``, the payload's length (8 bytes, little endian), its SHA-256
(32 bytes), then the payload: a msgpack map (``flax.serialization.msgpack_serialize``) of

    format     "tclock.checkpoint"
    version    1
    iteration  the iteration the state is after
    host       the host loop's state (plain JSON-like values: runbook.HostState)
    leaves     {path: ndarray}: every array leaf of the training state, keyed by its
               ``jax.tree_util.keystr`` path (``.params['policy']...``)

Nothing in it is code: decoding builds dicts, lists, numbers, strings and NumPy arrays of
numeric dtypes, and the training state's Python types come from the *template* (the state a
fresh run of the same config would start from), never from the file.  ``restore`` checks
that the file holds exactly the template's paths with the same shapes and dtypes and names
the first ones that differ.  A truncated or altered file fails the length or checksum check
(:class:`CorruptCheckpoint`), which is what lets ``--resume`` fall back to an older one.

This module does no file I/O; ``tclock.runlog`` reads and writes the files.
"""
from __future__ import annotations

import hashlib
import struct
from collections import deque
from typing import Any

import jax
import numpy as np
from flax import serialization

MAGIC = b"TCLOCK-CKPT\x00"
FORMAT, VERSION = "tclock.checkpoint", 1
_HEADER = len(MAGIC) + 8 + 32
_SHOW = 4  # differing paths named in an error


class CorruptCheckpoint(ValueError):
    """The bytes are not a complete, intact tclock checkpoint (truncated, altered, other format)."""


class TemplateMismatch(ValueError):
    """The checkpoint is intact but holds a differently shaped training state than the template."""


def _leaves(tree) -> dict[str, Any]:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _plain(value: Any, where: str = "host") -> Any:
    """``value`` as msgpack-able data: dicts, lists, numbers (NaN kept), strings, None, arrays."""
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple, deque)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__array__"):
        return np.asarray(value)
    raise TypeError(f"checkpoint: {where} is a {type(value).__name__}; the host state holds plain data only")


def encode(iteration: int, state: Any, host: dict) -> bytes:
    """The bytes of a checkpoint of ``state`` (a pytree of arrays) after ``iteration``; ``host``
    is plain data (dicts, lists, numbers, strings, arrays)."""
    leaves = {path: np.asarray(leaf) for path, leaf in _leaves(state).items()}
    payload = serialization.msgpack_serialize({"format": FORMAT, "version": VERSION, "iteration": int(iteration),
                                               "host": _plain(host), "leaves": leaves})
    return MAGIC + struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload


def decode(data: bytes) -> dict:
    """``{"iteration", "host", "leaves"}`` of checkpoint bytes; :class:`CorruptCheckpoint` if
    they are not a complete, intact checkpoint of this format."""
    if not data.startswith(MAGIC):
        raise CorruptCheckpoint("not a tclock checkpoint (the file does not start with the format's marker)")
    if len(data) < _HEADER:
        raise CorruptCheckpoint(f"truncated: {len(data)} bytes, shorter than the {_HEADER}-byte header")
    (size,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
    payload = data[_HEADER:]
    if len(payload) != size:
        raise CorruptCheckpoint(f"truncated: the payload has {len(payload)} of its {size} bytes")
    if hashlib.sha256(payload).digest() != data[len(MAGIC) + 8:_HEADER]:
        raise CorruptCheckpoint("corrupt: the payload's SHA-256 does not match the one stored with it")
    try:
        content = serialization.msgpack_restore(payload)
    except Exception as e:  # noqa: BLE001 - any decoding failure means the same thing here
        raise CorruptCheckpoint(f"payload cannot be decoded ({type(e).__name__}: {e})") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise CorruptCheckpoint("payload is not a tclock checkpoint map")
    if content.get("version") != VERSION:
        raise CorruptCheckpoint(f"checkpoint format version {content.get('version')!r}; this tclock reads {VERSION}")
    if not isinstance(content.get("leaves"), dict) or not isinstance(content.get("host"), dict):
        raise CorruptCheckpoint("payload lacks its leaves or host state")
    return {"iteration": int(content["iteration"]), "host": content["host"], "leaves": content["leaves"]}


def differences(leaves: dict, template: Any) -> list[str]:
    """What differs between saved ``leaves`` and ``template``'s (paths, shapes, dtypes)."""
    want = {path: (tuple(np.shape(leaf)), np.dtype(leaf.dtype)) for path, leaf in _leaves(template).items()}
    out = [f"{p} missing from the checkpoint" for p in want if p not in leaves]
    out += [f"{p} in the checkpoint but not in this config's state" for p in leaves if p not in want]
    for path, (shape, dtype) in want.items():
        if path in leaves:
            got = leaves[path]
            if not isinstance(got, np.ndarray):
                out.append(f"{path}: saved a {type(got).__name__}, not an array")
            elif (got.shape, got.dtype) != (shape, dtype):
                out.append(f"{path}: saved {got.dtype}{list(got.shape)}, this config needs {dtype}{list(shape)}")
    return out


def restore(leaves: dict, template: Any) -> Any:
    """The training state: ``template``'s tree with the saved arrays as leaves.

    ``template`` may hold arrays or ``jax.ShapeDtypeStruct`` leaves (``jax.eval_shape`` of the
    learner's ``init``).  Raises :class:`TemplateMismatch` naming the first differing paths."""
    diff = differences(leaves, template)
    if diff:
        more = f"; and {len(diff) - _SHOW} more" if len(diff) > _SHOW else ""
        raise TemplateMismatch("; ".join(diff[:_SHOW]) + more)
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    return jax.tree_util.tree_unflatten(treedef, [leaves[jax.tree_util.keystr(p)] for p, _ in paths])
