"""Tensor plumbing the checks rely on: canary-padded outputs, alias-preserving clones, bitwise compares.

Outputs are views into a larger allocation whose padding holds a canary pattern; a kernel that writes
outside its output changes the padding (`canary_intact`). Inputs are cloned per backend storage by
storage, so views that share memory (an MLA value cache that is a slice of the key cache) stay views.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

CANARY_ELEMENTS = 256  # elements of padding on each side of every output
_CANARY_VALUE = -31337.0


def output_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes `alloc_output(shape, dtype)` allocates: the tensor and its canary padding."""
    return (math.prod(shape) + 2 * CANARY_ELEMENTS) * dtype.itemsize


def alloc_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An output buffer: NaN-filled (signed ints -1, unsigned all bits set), canary padding on both sides."""
    n = math.prod(shape)
    base = torch.empty(n + 2 * CANARY_ELEMENTS, dtype=dtype, device=device)
    if dtype.is_floating_point:
        base.fill_(_CANARY_VALUE)
        base[CANARY_ELEMENTS : CANARY_ELEMENTS + n] = float("nan")
    elif dtype.is_signed:
        base.fill_(-7777)
        base[CANARY_ELEMENTS : CANARY_ELEMENTS + n] = -1
    else:  # bool (True inside and out, as for signed ints) and unsigned ints (all bits set, 0xA5 outside)
        base.fill_(True if dtype == torch.bool else 0xA5)
        base[CANARY_ELEMENTS : CANARY_ELEMENTS + n] = True if dtype == torch.bool else torch.iinfo(dtype).max
    return base[CANARY_ELEMENTS : CANARY_ELEMENTS + n].view(shape)


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def canary_intact(out: torch.Tensor, pristine: torch.Tensor) -> bool:
    """True when every byte of `out`'s storage outside `out` equals the same byte of `pristine`'s."""
    a, b = _storage_bytes(out), _storage_bytes(pristine)
    lo = out.storage_offset() * out.element_size()
    hi = lo + out.numel() * out.element_size()
    return bool(torch.equal(a[:lo], b[:lo]) and torch.equal(a[hi:], b[hi:]))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as an integer tensor (NaN-aware, -0.0 != 0.0)."""
    if not t.dtype.is_floating_point:
        return t
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise bit equality, as a bool tensor of `a`'s shape."""
    return bits(a) == bits(b)


COUNT_CHUNK = 1 << 27  # elements per partial sum in `count_true` (its int64 temporary: 1 GiB)


def count_true(mask: torch.Tensor) -> int:
    """The number of True elements of a bool tensor. `mask.sum()` first converts the whole mask to int64
    (8 bytes an element: 16.5 GiB for a 2.2e9-element pool's mask, suites/large.yaml); this sums it in
    chunks of COUNT_CHUNK elements."""
    flat = mask.reshape(-1)
    return sum(int(flat[i : i + COUNT_CHUNK].sum()) for i in range(0, flat.numel(), COUNT_CHUNK))


def map_tensors(v: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`v` with every tensor `t` it holds (in lists, tuples and dicts, at any depth) replaced by `fn(t)`.

    A module-level recursion on purpose: a nested function that calls itself is a reference cycle
    (function -> closure cell -> function), which keeps everything the closure reaches (the copies
    `clone_tensors` made, the device storages `to_device` moved) alive until Python's cycle collector
    runs. On a GPU that is memory: on an 8 GiB GDN state pool the stale-output check's copies piled up to
    nine pools and ran out of memory (suites/large.yaml on an H100)."""
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, (list, tuple)):
        return type(v)(map_tensors(x, fn) for x in v)
    if isinstance(v, dict):
        return {k: map_tensors(x, fn) for k, x in v.items()}
    return v


def map_fields(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A copy of dataclass `obj` with `map_tensors(field, fn)` for every field."""
    return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)})


def clone_tensors(obj: Any, only: Iterable[str] | None = None) -> Any:
    """Deep-copy every tensor field of a dataclass, keeping views that share storage as views.

    Each distinct storage is copied once (padding included), and every tensor is rebuilt on the copy
    with its own offset, shape and strides. With `only` (field names), just the storages of those
    fields are copied, with every field that views one of them; the other fields are the same tensors
    (a perturbed copy of a multi-GB input then costs the fields it changes). Nothing but the returned
    copy holds the new storages (no reference cycle: `map_tensors`).
    """
    copies: dict[tuple[str, int], torch.UntypedStorage] = {}
    wanted = None
    if only is not None:
        wanted = {_key_of(t) for f in only if isinstance(t := getattr(obj, f), torch.Tensor)}

    def clone(t: torch.Tensor) -> torch.Tensor:
        key = _key_of(t)
        if wanted is not None and key not in wanted:
            return t
        if key not in copies:
            copies[key] = t.untyped_storage().clone()
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(copies[key], t.storage_offset(), t.shape, t.stride())

    return map_fields(obj, clone)


def _key_of(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def all_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor of a dataclass, in its fields and in the tuples, lists and dicts they hold (a
    gdn_chain's per-step inputs); of a tuple, list or dict, every tensor it holds, dataclasses included."""
    found: list[torch.Tensor] = []
    _collect(obj, found)
    return found


def _collect(v: Any, found: list[torch.Tensor]) -> None:
    """`all_tensors`' walk (module-level: see `map_tensors` on nested recursive functions)."""
    if isinstance(v, torch.Tensor):
        found.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect(x, found)
    elif isinstance(v, dict):
        for x in v.values():
            _collect(x, found)
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        for f in dataclasses.fields(v):
            _collect(getattr(v, f.name), found)


def storage_bytes(obj: Any) -> int:
    """Bytes of the distinct storages of every tensor `obj` holds (`all_tensors`): views of one storage,
    padding included, count once."""
    seen: dict[tuple[str, int], int] = {}
    for t in all_tensors(obj):
        s = t.untyped_storage()
        seen[(str(t.device), s.data_ptr())] = s.nbytes()
    return sum(seen.values())


def tensor_fields(obj: Any) -> dict[str, torch.Tensor]:
    """The dataclass's fields that hold tensors (None fields left out)."""
    return {f.name: v for f in dataclasses.fields(obj) if isinstance(v := getattr(obj, f.name), torch.Tensor)}


def host_available_bytes() -> int | None:
    """The host's MemAvailable (Linux /proc/meminfo), in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cuda_available_bytes(device: torch.device | str) -> int:
    """Bytes new tensors can take on a CUDA device: its free memory plus what PyTorch's allocator holds
    unused (freed blocks it keeps for reuse; after a case with large inputs the device reads nearly
    full while all of that is PyTorch's to hand out again)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
