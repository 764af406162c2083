"""The reference cache: a case's float64 reference and native-precision twin, kept on disk by content.

What `Op.expected` returns depends only on the op, its parameters, the dtype, the seed, the code that
builds the inputs and computes the references, the torch that runs it and the device kind it runs on.
The cache key is a SHA-256 of all of these (`key_material`): the source of every file in
`source_files()` (references/, harness/ops/, the input helpers, and the op's own module, a plugin's
too) is part of it, so editing a reference or the input generation invalidates every entry it could
affect; nothing else ever does.

Layout: one file per case, `DIR/<key>.ref` = a header line (`attnbench-ref 4 <digest of the payload>`)
then the payload: an index line (JSON: the key material, and for every tensor of `expected`, `twin` and
the deltas its dtype, shape, offset and byte count), padded so that the data after it starts at a
multiple of `ALIGN` bytes, then each tensor's bytes, each padded to `ALIGN`. No pickle: a reader
trusts nothing but JSON and raw bytes. The digest is the SHA-256 of the SHA-256s of the payload's
`DIGEST_CHUNK`-byte pieces. `get` reads the payload straight into one tensor, piece by piece, and
hashes each piece on a thread pool while the next is read (hashlib lets go of the GIL), so checking
costs little beyond reading; the tensors are views of that buffer (on a CPU) or copies of those views
on the case's device. (Format 3, a `torch.save` of the entry read back through `torch.load` from
memory, took 1.3 s of a 2.6 s load of a 870 MiB GDN entry on a 2-core CPU, beside 0.6 s of reading
and 0.7 s of hashing one after the other.) An entry is
written to a temporary file in `DIR` and renamed into place, so readers (other workers, other runs)
see the old file, the new one or none, never a torn one; an entry whose header, digest, key or
contents do not check out is recomputed and replaced, never trusted: `get` says why, and the sweep
prints it as a warning.

Outputs that are inputs written in place (a KV cache, a state pool) are stored as the rows (entries of
the leading dimension: pages, slots) that differ from the case's pristine input (`_delta`): a pool of a
gigabyte whose step writes a few slots costs those slots, and no index per element. The pristine
inputs are rebuilt from the same seed and source, so they are the same bits.

Size: at most `max_bytes` (default `DEFAULT_MAX_BYTES`, 16 GiB; `$ATTNBENCH_REF_CACHE_MAX`). After each
store the least recently used entries (by mtime, which a hit refreshes) not written or read in the
last `KEEP_S` (a day) are deleted until the total fits; recent entries stay, and a new entry that
still does not fit is not kept. So a suite whose references outweigh the cap keeps the same entries
from run to run and hits on them: on an H100 the `ci` suite's references (float64 GDN state pools
among them) outgrew 4 GiB, and a plain LRU, or one that spared only the running sweep's entries,
evicted each entry just before the next run read it (0 of 18 loaded by a second run). An entry
larger than the cap on its own is not stored.

Reading ahead: loading an entry is host work (reading, hashing) that needs neither the inputs nor the
device, so `read_ahead` starts it on a background thread: the runner asks, at the start of a case, for
the case's own entries and those of the case the supervisor will send next (`RunJob.ahead`), so a
case's entry is read while its inputs are built, or while the previous case ran its checks, and `get`
takes the bytes read (the same digest and key checks, then the copy to the device). The thread makes
no CUDA call (a CUDA-graph capture on the main thread is not disturbed), and the runner waits for it
(`wait_reads`) before a case's timing, so no read competes with a timed window for the host. On an
H100's warm `ci`, loading the 18 entries was 4.0 s of the 51 s sweep, 3.3 s of it four GDN and MLA
entries of 0.5-0.8 GiB (0.7-1.0 s each). Reads ahead not taken are held up to `AHEAD_MAX_BYTES`
together and forgotten when the next case asks for others (the jobs on one thread: `BackgroundWork`,
store/background.py).

Where: `--ref-cache DIR|off` of `attnbench sweep`, else `$ATTNBENCH_REF_CACHE` (a directory or `off`),
else `$ATTNBENCH_CACHE/refs`, else `$XDG_CACHE_HOME/attnbench/refs`, else `~/.cache/attnbench/refs`.
`attnbench cache info|clear` shows and empties it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.cacheroot import cache_root
from attnbench.errors import AttnbenchError
from attnbench.store.background import BackgroundWork

FORMAT = 4  # bump when the entry layout changes: older entries then miss (the format is part of the key)
DIGEST_CHUNK = 64 * 2**20  # bytes of payload per SHA-256 of the digest (module docstring)
ALIGN = 64  # every tensor's bytes start at a multiple of this in the payload (any dtype can view them)
MAGIC = b"attnbench-ref"
SUFFIX = ".ref"
# 16 GiB: on an H100 the `targets` sweep's references filled a 4 GiB cache, so a `ci` sweep after it on
# the same day kept 14 of its 18 (the four float64 GDN state pools were "not kept") and its second
# run computed those four again (reports/examples/h100-session13/ci at e281b29: 16.8 s of references in 115.7 s)
DEFAULT_MAX_BYTES = 16 * 2**30
STALE_TMP_S = 3600  # a temporary file this old was left by a writer that died: removed when seen
_KEY = re.compile(r"^[0-9a-f]{64}\.ref$")
_TMP = re.compile(r"^\.[0-9a-f]{64}\.ref\..+\.tmp$")

_HARNESS = Path(__file__).resolve().parents[1]  # the attnbench package (harness/), above store/
KEEP_S = 24 * 3600  # entries written or read this recently are never evicted (see Size in the docstring)
_INPUT_HELPERS = ("buffers.py", "dtypes.py", "case.py")  # what make_inputs uses outside ops/


# ---- where --------------------------------------------------------------------------------------
def default_dir() -> Path | None:
    """The cache directory from the environment (module docstring), or None when `$ATTNBENCH_REF_CACHE=off`."""
    env = os.environ.get("ATTNBENCH_REF_CACHE", "").strip()
    if env:
        return None if env.lower() == "off" else Path(env).expanduser()
    return cache_root() / "refs"


def resolve(option: str | None) -> Path | None:
    """The cache directory for a `--ref-cache` value: `off` (None), a directory, or None for the default."""
    if option is None:
        return default_dir()
    if option.strip().lower() == "off":
        return None
    if not option.strip():
        raise AttnbenchError("--ref-cache takes a directory or off, got an empty value")
    path = Path(option).expanduser()
    if path.exists() and not path.is_dir():
        raise AttnbenchError(f"--ref-cache {option}: not a directory")
    return path.resolve()


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}  # fmt: skip


def parse_size(text: str, what: str = "$ATTNBENCH_REF_CACHE_MAX") -> int:
    """`4GiB`, `500MB`, plain bytes `1048576` -> bytes; anything else is an AttnbenchError."""
    m = _SIZE.match(text)
    if not m:
        raise AttnbenchError(f"{what}: {text!r} is not a size (e.g. 4GiB, 500MB, 1048576)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def default_max_bytes() -> int:
    env = os.environ.get("ATTNBENCH_REF_CACHE_MAX", "").strip()
    return parse_size(env) if env else DEFAULT_MAX_BYTES


# ---- the key ------------------------------------------------------------------------------------
def source_files(op: Any = None) -> list[Path]:
    """The files whose source the references depend on: every module of references/ and harness/ops/,
    the input helpers (buffers, dtypes, case), and the module that defines `op`'s class (a plugin op)."""
    import attnbench.references as refs

    files = {p.resolve() for d in refs.__path__ for p in Path(d).glob("*.py")}
    files |= {p.resolve() for p in (_HARNESS / "ops").rglob("*.py")}  # the op packages (attention/, gdn/) too
    files |= {(_HARNESS / name).resolve() for name in _INPUT_HELPERS}
    if op is not None:
        mod = sys.modules.get(type(op).__module__)
        if mod is not None and getattr(mod, "__file__", None):
            files.add(Path(mod.__file__).resolve())
    return sorted(files)


_digests: dict[tuple, str] = {}


def _source_name(f: Path) -> str:
    """`f` as the digest names it: its path below the folder holding harness/ (`harness/ops/gdn/params.py`:
    two modules named alike in different packages are told apart), or its file name for one elsewhere."""
    try:
        return f.relative_to(_HARNESS.parent.resolve()).as_posix()
    except ValueError:
        return f.name


def source_digest(files: list[Path]) -> str:
    """SHA-256 over the files' names and bytes (recomputed when a file's size or mtime changes)."""
    stamp = []
    for f in files:
        try:
            st = f.stat()
            stamp.append((str(f), st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append((str(f), None, None))
    stamp = tuple(stamp)
    if stamp not in _digests:
        h = hashlib.sha256()
        for f in files:
            h.update(_source_name(f).encode() + b"\0")
            try:
                h.update(f.read_bytes())
            except OSError:
                h.update(b"<unreadable>")
            h.update(b"\0")
        _digests[stamp] = h.hexdigest()
    return _digests[stamp]


def device_kind(device: str) -> str:
    """What a reference's bits may depend on besides the code: the device model and its math libraries."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        cap = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        return f"cuda {name} sm{cap} cuda{torch.version.cuda}"
    return f"{dev.type} {platform.machine()} {_cpu_model()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def key_material(case, variant: str = "") -> dict[str, Any]:
    """Everything a case's reference depends on, as a JSON-able record (its SHA-256 is the key).
    `variant`: another reference the case determines alone, e.g. "replay batch B" (the replay check's
    other batch of an op that writes nothing: harness/check/replay.py); "" is the case's own."""
    import torch

    extra = {"variant": variant} if variant else {}
    return extra | {
        "format": FORMAT,
        "op": case.op_name,
        "params": case.params.model_dump(mode="json"),
        "dtype": case.dtype,
        "seed": case.seed,
        "device": device_kind(case.device),
        "torch": str(torch.__version__),
        "source": source_digest(source_files(case.op)),
    }


def key_of(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


# ---- the store ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RefCache:
    """A cache directory and its cap. `get`/`put` never raise for a bad entry or a full disk: they say
    what went wrong in their second value ("" when nothing did)."""

    root: Path
    max_bytes: int = DEFAULT_MAX_BYTES

    def path(self, key: str) -> Path:
        return self.root / f"{key}{SUFFIX}"

    def get(self, case, inputs: Any = None, variant: str = "") -> tuple[tuple[dict, dict] | None, str]:
        """((expected, twin) of `case` on its device, ""), or (None, why) for an entry that is there but
        does not check out, or (None, "") for a miss. `variant`: `key_material`'s."""
        material = key_material(case, variant)
        path = self.path(key_of(material))
        try:
            entry = _tensors_of(_take_ahead(path) or _load(path), case.device)
        except FileNotFoundError:
            return None, ""
        except OSError as e:
            return None, f"reference cache entry {path} unreadable ({e}): recomputed"
        except Exception as e:  # corrupt, truncated, foreign: recomputed and overwritten
            return None, _corrupt(path, e)
        try:
            if entry.get("key") != json.dumps(material, sort_keys=True):
                raise ValueError("written for another case or source")
            expected = _undelta(_tensors(entry.get("expected")), entry.get("deltas", {}).get("expected", {}), inputs)
            twin = _undelta(_tensors(entry.get("twin")), entry.get("deltas", {}).get("twin", {}), inputs)
        except Exception as e:
            return None, _corrupt(path, e)
        try:  # most recently used: eviction goes by mtime
            os.utime(path)
        except OSError:
            pass
        return (expected, twin), ""

    def read_ahead(self, wanted) -> int:
        """Start reading the entries of `wanted` (`(case, variant)` pairs) that are on disk, one after
        another on a background thread, so that `get` finds them read and checked (module docstring,
        Reading ahead); reads of entries not in `wanted` that no `get` took are forgotten. Returns how
        many reads this started. Call it, `get` and `wait_reads` from one thread."""
        paths = list(dict.fromkeys(str(self.path(key_of(key_material(c, v)))) for c, v in wanted))
        _reads.keep_only(paths)  # one already running finishes, unread
        started = 0
        for path in paths:
            if path in _reads.keys():
                continue
            try:
                size = os.stat(path).st_size
            except OSError:  # a miss: nothing to read
                continue
            if _reads.start(path, functools.partial(_load, Path(path)), nbytes=size, max_bytes=AHEAD_MAX_BYTES):
                started += 1
        return started

    def put(self, case, expected: dict, twin: dict, inputs: Any = None, variant: str = "") -> str:
        """Store `case`'s reference (atomically); "" when stored, else why not (too large, disk error,
        the cache full of this run's entries). `inputs`: the case's pristine inputs, against which
        outputs written in place are stored as their changed elements. `variant`: `key_material`'s."""
        material = key_material(case, variant)
        exp_kept, exp_delta = _delta(expected, inputs)
        twin_kept, twin_delta = _delta(twin, inputs)
        payload = _encode(
            json.dumps(material, sort_keys=True),
            {"expected": exp_kept, "twin": twin_kept, "deltas": {"expected": exp_delta, "twin": twin_delta}},
        )
        header = b"%s %d %s\n" % (MAGIC, FORMAT, digest(payload).encode())
        size = len(header) + len(payload)
        if size > self.max_bytes:
            return f"reference of {size} bytes is larger than the cache's cap ({self.max_bytes}): not stored"
        key = key_of(material)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key}{SUFFIX}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(header)
                    f.write(payload)
                os.replace(tmp, self.path(key))
            except BaseException:
                _unlink(Path(tmp))
                raise
        except OSError as e:
            return f"reference cache {self.root}: could not store an entry ({e})"
        self.evict()
        if self.size() > self.max_bytes:  # full of this run's entries: the new one goes, the others stay
            _unlink(self.path(key))
            return (
                f"reference cache {self.root} full ({self.max_bytes / 2**30:.3g} GiB of entries used today): not kept "
                f"(a larger cap: $ATTNBENCH_REF_CACHE_MAX)"
            )
        return ""

    def entries(self) -> list[tuple[Path, os.stat_result]]:
        """The entries (not temporary files) with their stat, oldest first."""
        found = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        for name in names:
            p = self.root / name
            try:
                st = p.stat()
            except OSError:  # evicted by another process meanwhile
                continue
            if _KEY.match(name):
                found.append((p, st))
            elif _TMP.match(name) and time.time() - st.st_mtime > STALE_TMP_S:
                _unlink(p)
        return sorted(found, key=lambda e: e[1].st_mtime)

    def size(self) -> int:
        return sum(st.st_size for _, st in self.entries())

    def evict(self, since: float | None = None) -> int:
        """Delete least recently used entries until the total is at most the cap, never one written or
        read since `since` (default: `KEEP_S` ago); returns how many."""
        since = time.time() - KEEP_S if since is None else since
        entries = self.entries()
        total, gone = sum(st.st_size for _, st in entries), 0
        for p, st in entries:
            if total <= self.max_bytes or st.st_mtime >= since:
                break
            _unlink(p)
            total -= st.st_size
            gone += 1
        return gone

    def clear(self) -> int:
        """Delete every entry and temporary file of the cache (nothing else in the directory); returns
        the number of entries deleted."""
        n = 0
        try:
            names = os.listdir(self.root)
        except OSError:
            return 0
        for name in names:
            if _KEY.match(name) or _TMP.match(name):
                n += bool(_KEY.match(name)) and _unlink(self.root / name)
        return n


def open_cache(root: Path | str | None, max_bytes: int | None = None) -> RefCache | None:
    """The cache at `root` (None: off)."""
    if root is None:
        return None
    return RefCache(Path(root), default_max_bytes() if max_bytes is None else max_bytes)


# ---- reading ahead ------------------------------------------------------------------------------
AHEAD_MAX_BYTES = 4 * 2**30  # entries read ahead and not yet taken by `get`, held in host memory together
_reads = BackgroundWork("attnbench-refcache")  # entry path -> the read of it (its size: the bytes held)


def _take_ahead(path: Path) -> _Loaded | None:
    """The read ahead of `path`, waited for and no longer held (its errors raised as `_load`'s), or
    None when none was started (or it was forgotten before it ran)."""
    return _reads.take(str(path))


def wait_reads() -> float:
    """Wait until no read ahead is running (the reads stay held for `get`); returns the seconds waited.
    The runner calls it before a case's timing, so no read competes with a timed window for the host."""
    return _reads.wait()


def reads_ahead() -> list[str]:
    """The entry paths read ahead and not taken yet (tests, messages)."""
    return _reads.keys()


def reads_running() -> list[str]:
    """The entry paths read ahead and not taken yet whose read has not finished (tests)."""
    return _reads.running()


def _same_bits(a, b):
    """Elementwise: `a` and `b` (same dtype) hold the same value, NaN equal to NaN."""
    return (a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a == b


def _delta(tensors: dict, inputs: Any) -> tuple[dict, dict]:
    """(`tensors` stored whole, {name: {"rows", "val"}} of those that are an input of the same name and
    shape written in place, stored as the rows of their leading dimension that differ from it (in
    their dtype) when those are at most half of them)."""
    import torch

    whole, delta = {}, {}
    for name, t in tensors.items():
        base = getattr(inputs, name, None) if inputs is not None else None
        if isinstance(base, torch.Tensor) and base.shape == t.shape and t.dim() > 0 and t.numel() > 0:
            t = t.detach()
            differs = ~_same_bits(t, base.detach().to(t.dtype))
            rows = differs.reshape(t.shape[0], -1).any(1).nonzero().reshape(-1)
            if 2 * rows.numel() <= t.shape[0]:
                delta[name] = {"rows": rows.cpu(), "val": t[rows].cpu()}
                continue
        whole[name] = t.detach().cpu()
    return whole, delta


def _undelta(whole: dict, delta: Any, inputs: Any) -> dict:
    """The tensors `_delta` split, rebuilt from the pristine `inputs` (on the inputs' device)."""
    import torch

    if not isinstance(delta, dict):
        raise ValueError("bad deltas")
    out = dict(whole)
    for name, d in delta.items():
        base = getattr(inputs, name, None) if inputs is not None else None
        if not isinstance(base, torch.Tensor) or not isinstance(d, dict):
            raise ValueError(f"delta of {name!r} without its input")
        rows, val = d["rows"].to(base.device), d["val"].to(base.device)
        if val.shape[1:] != base.shape[1:] or val.shape[0] != rows.numel():
            raise ValueError(f"delta of {name!r} does not fit its input")
        full = base.detach().to(val.dtype).clone()
        full[rows] = val
        out[name] = full
    return out


def _tensors(d: Any) -> dict:
    import torch

    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items()):
        raise ValueError("not a dict of tensors")
    return d


def digest(payload) -> str:
    """The payload's digest (module docstring): SHA-256 over the SHA-256s of its `DIGEST_CHUNK` pieces."""
    view = memoryview(payload)
    pieces = [view[i : i + DIGEST_CHUNK] for i in range(0, len(view), DIGEST_CHUNK)] or [view]
    if len(pieces) == 1:
        parts = [hashlib.sha256(pieces[0]).digest()]
    else:
        with ThreadPoolExecutor(min(len(pieces), os.cpu_count() or 1)) as pool:
            parts = list(pool.map(lambda b: hashlib.sha256(b).digest(), pieces))
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _corrupt(path: Path, e: Exception) -> str:
    why = (str(e).strip().splitlines() or [""])[0][:200]
    return f"reference cache entry {path} is corrupt ({type(e).__name__}: {why}): recomputed"


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _encode(key: str, parts: dict) -> memoryview:
    """The payload (module docstring) of an entry: `parts` is {"expected": {name: tensor}, "twin": ...,
    "deltas": {"expected": {name: {"rows": tensor, "val": tensor}}, "twin": ...}}, tensors on the CPU."""
    import torch

    blobs: list[tuple[int, torch.Tensor]] = []
    end = 0

    def place(t):
        nonlocal end
        t = t.detach().contiguous().cpu()
        spec = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": end,
                "nbytes": t.numel() * t.element_size()}  # fmt: skip
        blobs.append((end, t))
        end += _padded(spec["nbytes"])
        return spec

    index = _walk(parts, place) | {"key": key}
    line = json.dumps(index, sort_keys=True).encode()
    line += b" " * (_padded(len(line) + 1) - len(line) - 1) + b"\n"
    buf = torch.zeros(len(line) + end, dtype=torch.uint8)
    buf[: len(line)] = torch.frombuffer(bytearray(line), dtype=torch.uint8)
    for at, t in blobs:
        if t.numel():
            start = len(line) + at
            buf[start : start + t.numel() * t.element_size()] = t.reshape(-1).view(torch.uint8)
    return memoryview(buf.numpy())


def _walk(parts: dict, leaf) -> dict:
    """`parts` (see `_encode`) with every tensor (or tensor spec) replaced by `leaf(it)`."""
    out: dict = {}
    for part in ("expected", "twin"):
        out[part] = {name: leaf(t) for name, t in _dict(parts.get(part)).items()}
    deltas = _dict(parts.get("deltas"))
    out["deltas"] = {
        part: {name: {f: leaf(_dict(d)[f]) for f in ("rows", "val")} for name, d in _dict(deltas.get(part)).items()}
        for part in ("expected", "twin")
    }
    return out


def _dict(d: Any) -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise ValueError("bad index")
    return d


@dataclass(frozen=True)
class _Loaded:
    """An entry's payload read and checked against its digest, on the CPU: `buf` (the payload's bytes),
    `index` (its JSON index) and `start` (where the tensors' bytes begin in `buf`)."""

    buf: Any
    index: dict
    start: int


def _load(path: Path) -> _Loaded:
    """Read the entry at `path` and check it against its digest (no CUDA call: a read ahead runs it on a
    thread while the case's kernels run, CUDA-graph captures included); raises FileNotFoundError or
    OSError when it cannot be read, another error when it does not check out.

    The payload is read piece by piece into one CPU buffer while a thread pool hashes the pieces
    already read; the digest is compared before anything is built from the bytes."""
    import torch

    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        header = f.read(min(size, 256)).split(b"\n", 1)[0] + b"\n"
        parts = header.rstrip(b"\n").split(b" ")
        if len(header) > size or len(parts) != 3 or parts[0] != MAGIC or parts[1] != str(FORMAT).encode():
            raise ValueError("bad header")
        f.seek(len(header))
        n = size - len(header)
        buf = torch.empty(n, dtype=torch.uint8)
        view = memoryview(buf.numpy()) if n else memoryview(b"")
        chunks = range(0, n, DIGEST_CHUNK)
        with ThreadPoolExecutor(max(1, min(len(chunks), os.cpu_count() or 1))) as pool:
            hashed = []
            for at in chunks:
                piece = view[at : at + DIGEST_CHUNK]
                _read_into(f, piece)
                hashed.append(pool.submit(lambda b: hashlib.sha256(b).digest(), piece))
            sums = [h.result() for h in hashed] or [hashlib.sha256(b"").digest()]
    if hashlib.sha256(b"".join(sums)).hexdigest().encode() != parts[2]:
        raise ValueError("contents do not match their digest")
    head = bytes(view[: min(n, 1 << 20)])
    if b"\n" not in head:
        raise ValueError("bad index")
    start = head.index(b"\n") + 1
    index = json.loads(head[:start])
    if not isinstance(index, dict) or start % ALIGN:
        raise ValueError("bad index")
    return _Loaded(buf, index, start)


def _tensors_of(loaded: _Loaded, device: str) -> dict:
    """The tensors of a loaded entry, on `device` (views of its buffer on a CPU, copies elsewhere)."""
    import torch

    buf, index, start, n = loaded.buf, loaded.index, loaded.start, loaded.buf.numel()
    dev = torch.device(device)

    def tensor(spec):
        dtype = getattr(torch, str(_dict(spec).get("dtype")), None)
        shape, at, nbytes = spec.get("shape"), spec.get("offset"), spec.get("nbytes")
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or not isinstance(at, int):
            raise ValueError("bad tensor in the index")
        if not all(isinstance(d, int) and d >= 0 for d in shape) or at < 0 or at % ALIGN:
            raise ValueError("bad tensor in the index")
        if nbytes != math.prod(shape) * dtype.itemsize or start + at + nbytes > n:
            raise ValueError("a tensor beyond the payload")
        t = buf[start + at : start + at + nbytes].view(dtype).reshape(shape)
        return t if dev.type == "cpu" else t.to(dev)

    return _walk(index, tensor) | {"key": index.get("key")}


def _read_into(f, piece: memoryview) -> None:
    got = 0
    while got < len(piece):
        k = f.readinto(piece[got:])
        if not k:
            raise ValueError("truncated")
        got += k


def _unlink(p: Path) -> bool:
    try:
        p.unlink()
        return True
    except OSError:
        return False
