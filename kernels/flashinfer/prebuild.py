"""Compile the FlashInfer JIT modules a set of cases needs, all at once, before running them.

FlashInfer builds each kernel module with nvcc on first use (one module per backend, dtypes, head
dims, window and soft-cap flag; 10-90 s each), one after the other as the cases reach them. This
collects the modules that the planned (backend, case) pairs will load and builds them together, so
their sources compile in parallel on every core. Each `prepare` then loads the built module (its
`jit_s` is then a load time).

The contract, checked on CPU through FlashInfer's own wrappers (tests/kernels/flashinfer/test_flashinfer_prebuild.py):

- Modules are named by keys (`JitKey`): the backends' `jit_keys(case)` return them, and
  `specs()` turns them into the JitSpecs the wrappers build, same generator and arguments, hence
  the same module names. A key that misses a module costs that module's build at first use.
- `build()` runs ninja for each module in the module's own directory, as a wrapper's first use does
  (`JitSpec.build`). Ninja keeps its build log and header dependencies in the directory it runs in,
  and takes an output that its log does not list as out of date: modules built by FlashInfer's
  `build_jit_specs` (one ninja run from the JIT cache root) were compiled again at first use.

A build failure is only reported: `prepare` builds what it needs on its own either way.
AttentionSink modules are named without their head dims (see `sinks.py`): of two sink keys with one
name, only the first is prebuilt.

Usage (on the GPU machine)::

    python -m attnbench.kernels.flashinfer.prebuild smoke -b flashinfer -b flashinfer-cudacore

or on a machine without a GPU but with nvcc (same FlashInfer version and CUDA major version as the
GPU machine), building the modules as FlashInfer AOT artifacts to copy into its `data/aot` folder
there (docs/gpu-testing.md)::

    CUDA_HOME=/usr/local/cuda python -m attnbench.kernels.flashinfer.prebuild decode extend --arch 9.0a --aot-out aot/
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from attnbench.kernels.flashinfer.jitkeys import JitKey


def keys_for(backends: Iterable, cases: Iterable, offline: bool = False) -> list[JitKey]:
    """The JIT modules the supported (backend, case) pairs will load (`Backend.precompile_keys`),
    without duplicates. `offline`: decide support from the declared limits alone (the case), not
    from this machine (no GPU is needed: for building on a machine without one, `--arch`)."""
    out: dict[JitKey, None] = {}
    cases = list(cases)
    for b in backends:

        def runs(c, b=b) -> bool:
            if offline:
                return c.op_name in b.implementations and b.limits(c) is None
            return b.supports(c) is None

        out.update(dict.fromkeys(b.precompile_keys([c for c in cases if runs(c)])))
    return list(out)


def specs(keys: Iterable[JitKey]) -> list:
    """FlashInfer JitSpecs for the keys: the generators and arguments the wrappers build them with.

    prefill: `get_batch_prefill_module(backend, q, kv, o, int32, Dk, Dv, posenc NONE, window, cap,
    fp16_qk_reduction False)`, which builds fa2's "primary" module (its independent-stride paged
    module is a lazy second one, `prefill-independent`) and fa3's whole module; the tensor-core
    decode wrapper calls it the same way, with Dk = Dv. decode: `get_batch_decode_module` (CUDA-core).
    """
    from flashinfer.jit import gen_batch_decode_module, gen_batch_mla_module
    from flashinfer.jit.attention.modules import (
        _gen_batch_prefill_independent_paged_module,
        _gen_batch_prefill_primary_module,
        gen_batch_prefill_module,
        gen_customize_batch_prefill_module,
    )
    from flashinfer.jit.attention.variants import attention_sink_decl
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.quantization import gen_quantization_module
    from flashinfer.jit.utils import filename_safe_dtype_map

    from attnbench.kernels.flashinfer.sinks import module_name

    out, names = [], set()
    for k in keys:
        common = (k.dtype, k.kv_dtype or k.dtype, k.dtype, torch.int32, k.head_dim_qk, k.head_dim_vo)
        flags = (0, k.sliding_window, k.soft_cap)  # pos_encoding_mode NONE, window, soft cap
        if k.kind == "prefill" and k.backend == "fa2":
            spec = _gen_batch_prefill_primary_module("fa2", *common, *flags, False)
        elif k.kind == "prefill":
            spec = gen_batch_prefill_module(k.backend, *common, *flags, False)
        elif k.kind == "prefill-independent":
            spec = _gen_batch_prefill_independent_paged_module("fa2", *common, *flags, False)
        elif k.kind == "decode":
            spec = gen_batch_decode_module(*common, *flags)
        elif k.kind == "mla":
            spec = gen_batch_mla_module(k.backend, *common[:4], 512, 64, False)
        elif k.kind == "cascade":
            spec = gen_cascade_module()
        elif k.kind == "packbits":  # segment_packbits, which plan() packs a custom mask with
            spec = gen_quantization_module()
        elif k.kind == "sink":
            name = module_name(filename_safe_dtype_map[k.dtype], 0 if k.sliding_window else -1, k.backend)
            if name in names:
                continue
            # BatchAttentionWithAttentionSinkWrapper.__init__'s jit_args / jit_kwargs (attention/_core.py)
            spec = gen_customize_batch_prefill_module(
                k.backend, name, *common,
                ("sink",), ("float",), ("sm_scale",), ("double",), "AttentionSink",
                attention_sink_decl[k.backend],
                pos_encoding_mode=0,
                use_sliding_window=k.sliding_window,
                use_fp16_qk_reduction=False,
                paged_kv_stride_mode="independent" if k.backend == "fa2" else "runtime",
                module_surface="full",
            )  # fmt: skip
        else:
            raise ValueError(f"unknown JitKey kind {k.kind!r}")
        if spec.name not in names:
            names.add(spec.name)
            out.append(spec)
    return out


def _jobs() -> int:
    """Compile processes at once: FLASHINFER_JIT_PREBUILD_MAX_JOBS, MAX_JOBS, or one per core."""
    for var in ("FLASHINFER_JIT_PREBUILD_MAX_JOBS", "MAX_JOBS"):
        if (value := os.environ.get(var, "")).isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


def build(specs: list, jobs: int | None = None) -> None:
    """Build each spec as its first use would (`JitSpec.build`: ninja in the module's directory).

    The modules build side by side and share `jobs` compile slots: each ninja run gets `-j` of what
    is free when it starts, up to its number of sources. The first failure is raised after every
    build has ended.
    """
    from filelock import FileLock
    from flashinfer.jit import cpp_ext

    todo = sorted((s for s in specs if not s.is_aot), key=lambda s: -len(s.sources))
    free = [jobs or _jobs()]
    slots = threading.Condition()

    def one(spec) -> None:
        with slots:
            slots.wait_for(lambda: free[0] > 0)
            take = min(free[0], max(1, len(spec.sources)))
            free[0] -= take
        try:
            with FileLock(spec.lock_path, thread_local=False):
                spec.write_ninja()
                cpp_ext.run_ninja(spec.build_dir, spec.ninja_path, False, max_jobs=take)
        finally:
            with slots:
                free[0] += take
                slots.notify_all()

    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        for done in [pool.submit(one, s) for s in todo]:
            done.result()


def prebuild(keys: Iterable[JitKey], log=print) -> float:
    """Build the modules of `keys` in parallel; returns the seconds it took.

    Failures are logged, not raised: every `prepare` still builds what it needs by itself.
    """
    keys = list(keys)
    if not keys:
        return 0.0
    t0 = time.perf_counter()
    try:
        build(specs(keys))
    except Exception as e:  # noqa: BLE001 - a prebuild problem must not stop the run
        log(f"flashinfer prebuild failed ({type(e).__name__}: {str(e)[:2000]}); modules build when used")
    dt = time.perf_counter() - t0
    log(f"flashinfer prebuild: {len(keys)} modules in {dt:.1f} s")
    return dt


def export_aot(spec_list: list, dest: Path) -> list[Path]:
    """Copy built modules to `dest/<name>/<name>.so`, the layout of FlashInfer's AOT folder
    (`flashinfer/data/aot` in its package), from which FlashInfer loads a module without building it."""
    out = []
    for spec in spec_list:
        if spec.is_aot or not spec.jit_library_path.exists():
            continue
        target = dest / spec.name / f"{spec.name}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, target)
        out.append(target)
    return out


def driver_stub(cache: Path | None = None) -> Path | None:
    """On a machine without the CUDA driver, a stub `libcuda.so` (no symbols, soname libcuda.so.1,
    as the toolkit's own stub) put on `LIBRARY_PATH`, so that FlashInfer's `-lcuda` links; the module
    binds the real driver's symbols when it loads on the GPU machine. None when the toolkit's stub
    (`$CUDA_HOME/lib64/stubs`) or a driver is found, or no C compiler is there to make one."""
    import ctypes.util
    import subprocess

    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if (home / "lib64" / "stubs" / "libcuda.so").exists() or ctypes.util.find_library("cuda"):
        return None
    folder = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attnbench" / "libcuda-stub"
    stub = folder / "libcuda.so"
    if not stub.exists():
        folder.mkdir(parents=True, exist_ok=True)
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            return None
        src = folder / "empty.c"
        src.write_text("")
        subprocess.run([cc, "-shared", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(src)], check=True)
    os.environ["LIBRARY_PATH"] = os.pathsep.join(filter(None, (str(folder), os.environ.get("LIBRARY_PATH"))))
    return stub


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="+", help="suite names or YAML files")
    ap.add_argument("-b", "--backend", action="append", help="only these (default: every flashinfer*)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--arch",
        help="build without a GPU (nvcc and the CUDA toolkit only) for this architecture, e.g. 9.0a "
        "(H100/H200); the modules are chosen from the cases and the backends' declared limits",
    )
    ap.add_argument(
        "--aot-out",
        type=Path,
        help="also copy the built modules here as FlashInfer AOT artifacts (<name>/<name>.so): copied "
        "into flashinfer/data/aot of the same FlashInfer version on the GPU machine, they load without nvcc",
    )
    args = ap.parse_args(argv)
    if args.arch:  # FlashInfer reads its target architectures when its JIT package is imported
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = args.arch
        if stub := driver_stub():
            print(f"no libcuda.so on this machine: linking against a stub ({stub})")
    from attnbench.backend import all_backends, load_builtin
    from attnbench.plan.suite import load

    load_builtin()
    chosen = args.backend or [n for n in all_backends() if n.startswith("flashinfer")]
    backends = [b for n, b in all_backends().items() if n in chosen]
    cases = [c for s in args.suites for c in load(s, args.device).cases]
    keys = keys_for(backends, cases, offline=bool(args.arch))
    print(f"{len(cases)} cases x {len(backends)} backends -> {len(keys)} JIT modules")
    prebuild(keys)
    if args.aot_out:
        copied = export_aot(specs(keys), args.aot_out)
        size = sum(p.stat().st_size for p in copied)
        print(f"{len(copied)} modules ({size / 2**20:.1f} MiB) as AOT artifacts in {args.aot_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
