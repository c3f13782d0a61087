"""Every CUDA kernel of ``mpidist.kernels`` compiled for real GPUs (sm_80, sm_90) without one,
and what matters checked in the PTX and SASS the GPU would run.

The CUDA simulator runs the kernels' Python source, so it cannot see what NVVM and ptxas do to
it; this module compiles each kernel with the argument types it is launched with (numba-cuda's
``compile_ptx``: NVVM from the ``nvidia-nvvm`` wheel), links the PTX of each architecture into
one cubin with nvJitLink (the ``nvidia-nvjitlink`` wheel; its verbose log gives registers,
stack and spills) and disassembles it with nvdisasm (the ``nvidia-cuda-nvdisasm`` wheel). No
GPU, no driver: nothing here loads libcuda.

It checks, for every kernel (all of them promise the CPU twins' bits):
  * PTX: no ``fma``/``mad`` on floats, and every float ``add``/``sub``/``mul`` carries an
    explicit rounding modifier (``.rn``...), which the PTX ISA forbids ptxas to contract;
  * SASS: no FFMA/DFMA/HFMA in the kernel's own code, except in kernels whose PTX divides or
    takes a square root (``div.rn``/``sqrt.rn`` expand into FMA sequences that round
    correctly as a whole; there the PTX check above is the guarantee);
  * PTX: no float -> integer conversion rounding to nearest (``cvt.rni``): NumPy truncates;
  * the hot kernels (reduce, pack/unpack, optimizers): no local-memory spills.

Run ``python -m mpidist.kernels.compiled [--json PATH]`` to print the table (and write the
report); tests/scenarios/test_kernels_compiled.py runs the same on every CI run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["ARCHS", "build_report", "problems", "table", "targets", "ptx_fma_findings",
           "ptx_nearest_int_conversions", "sass_fma_lines", "compile_kernels", "main"]

ARCHS = ((8, 0), (9, 0))

_FLOAT = r"(?:f16|f16x2|bf16|bf16x2|f32|f64)"
_PTX_FUSED = re.compile(rf"^\s*(?:@!?%\w+\s+)?(?:fma|mad)(?:\.\w+)*\.{_FLOAT}\b")
_PTX_ARITH = re.compile(rf"^\s*(?:@!?%\w+\s+)?(add|sub|mul)((?:\.\w+)*)\.{_FLOAT}\b")
_ROUNDING = {"rn", "rz", "rm", "rp"}
_PTX_DIV_SQRT = re.compile(rf"^\s*(?:@!?%\w+\s+)?(?:div|sqrt|rcp|rsqrt)(?:\.\w+)*\.{_FLOAT}\b")
# Float -> integer rounding to nearest; NumPy's astype truncates (cvt.rzi).
_PTX_CVT_NEAREST_INT = re.compile(rf"^\s*(?:@!?%\w+\s+)?cvt\.rni(?:\.\w+)*\.[su]\d+\.{_FLOAT}\b")
_SASS_FMA = re.compile(r"\b[HFD]FMA\w*\b")
_ENTRY = re.compile(r"^\s*\.(?:visible\s+)?\.entry\s+(\S+?)\s*\(", re.M)
_LOG_FUNCTION = re.compile(r"Function properties for (\S+)\s*\n\s*ptxas\s+\.\s+(\d+) bytes stack "
                           r"frame, (\d+) bytes spill stores, (\d+) bytes spill loads\s*\n"
                           r"ptxas info\s+: Used (\d+) registers")


def ptx_fma_findings(ptx: Any) -> Any:
    """The PTX lines a compiler may (or did) turn into a fused multiply-add: float fma/mad, and
    float add/sub/mul without an explicit rounding modifier."""
    found = []
    for line in ptx.splitlines():
        if _PTX_FUSED.match(line):
            found.append(line.strip())
            continue
        m = _PTX_ARITH.match(line)
        if m and not set(m.group(2).split(".")) & _ROUNDING:
            found.append(line.strip())
    return found


def ptx_nearest_int_conversions(ptx: Any) -> Any:
    """PTX lines converting a float to an integer by rounding to nearest (cvt.rni)."""
    return [line.strip() for line in ptx.splitlines() if _PTX_CVT_NEAREST_INT.match(line)]


def sass_fma_lines(sass: Any) -> Any:
    """The SASS FMAs on data: ``HFMA2.MMA R3, -RZ, RZ, 0, 0`` (only the zero register and
    immediates as sources) is how ptxas writes a constant into a register, not arithmetic."""
    found = []
    for line in sass.splitlines():
        m = _SASS_FMA.search(line)
        if not m:
            continue
        sources = line[m.end():].split(";")[0].split(",")[1:]
        if any(re.search(r"\bU?R(?!Z)\w*\d|c\[", s) for s in sources):
            found.append(line.strip())
    return found


def targets() -> Any:
    """(name, kernel, argument types, hot) of every CUDA kernel, as launched."""
    from mpidist.kernels import cuda, optimizers_cuda  # noqa: PLC0415 - imports numba.cuda

    for name, kernel, argtypes in cuda.compile_targets():
        yield name, kernel, argtypes, not name.startswith("cast[")
    for name, kernel, argtypes in optimizers_cuda.compile_targets():
        yield name, kernel, argtypes, True


def compile_kernels(kernels: Any, arch: Any) -> Any:
    """Compile ``[(name, python function, argument types)]`` for ``arch`` (major, minor):
    {name: {"ptx", "entry", "ptx_seconds"}} plus, under "", the cubin, the linker's log and the
    link time."""
    from numba import cuda  # noqa: PLC0415

    out = {}
    for name, pyfunc, argtypes in kernels:
        start = time.perf_counter()
        ptx, _ = cuda.compile_ptx(pyfunc, argtypes, cc=arch)
        entry = _ENTRY.search(ptx)
        out[name] = {"ptx": ptx, "entry": entry.group(1) if entry else None,
                     "ptx_seconds": time.perf_counter() - start}
    start = time.perf_counter()
    cubin, log = _link([v["ptx"] for v in out.values()], arch)
    out[""] = {"cubin": cubin, "log": log, "link_seconds": time.perf_counter() - start}
    return out


def _link(ptxs: Any, arch: Any) -> Any:
    from cuda.bindings import nvjitlink  # noqa: PLC0415 - the nvidia-nvjitlink wheel

    options = [f"-arch=sm_{arch[0]}{arch[1]}", "-verbose"]
    handle = nvjitlink.create(len(options), options)
    try:
        for i, ptx in enumerate(ptxs):
            data = ptx.encode()
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), f"kernel{i}")
        try:
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as e:
            raise RuntimeError(f"nvJitLink failed for sm_{arch[0]}{arch[1]}: "
                               f"{_read_log(nvjitlink, handle, error=True)}") from e
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin), _read_log(nvjitlink, handle)
    finally:
        nvjitlink.destroy(handle)


def _read_log(nvjitlink: Any, handle: Any, error: Any = False) -> Any:
    size = (nvjitlink.get_error_log_size if error else nvjitlink.get_info_log_size)(handle)
    buf = bytearray(size)
    (nvjitlink.get_error_log if error else nvjitlink.get_info_log)(handle, buf)
    return buf.decode(errors="replace").rstrip("\0")


def _nvdisasm() -> Any:
    from cuda.pathfinder import find_nvidia_binary_utility  # noqa: PLC0415

    path = find_nvidia_binary_utility("nvdisasm")
    if path is None:
        raise FileNotFoundError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return path


def disassemble(cubin: Any, workdir: Any) -> Any:
    """{function name: its SASS} of a cubin."""
    path = Path(workdir) / "kernels.cubin"
    path.write_bytes(cubin)
    text = subprocess.run([_nvdisasm(), "-c", str(path)], capture_output=True, text=True,
                          check=True, timeout=120).stdout
    sections: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^\s*\.section\s+\.text\.([^,\s]+)", line)
        if m:
            name = m.group(1)
            sections[name] = []
        elif name is not None:
            sections[name].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def _stats(log: Any) -> Any:
    return {m.group(1): {"stack_bytes": int(m.group(2)), "spill_store_bytes": int(m.group(3)),
                         "spill_load_bytes": int(m.group(4)), "registers": int(m.group(5))}
            for m in _LOG_FUNCTION.finditer(log)}


def _driver_loaded() -> Any:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return bool(re.search(r"/libcuda\.so", maps))


def _version(dist: Any) -> Any:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_report(archs: Any = ARCHS, workdir: Any = None, kernels: Any = None) -> Any:
    """Compile every kernel (or ``kernels``: ``[(name, kernel, argtypes, hot)]``) for each of
    ``archs`` and return the report: a dict, JSON-ready (see docs/testing.md)."""
    import tempfile  # noqa: PLC0415

    started = time.perf_counter()
    driver_before = _driver_loaded()
    kernels = list(targets() if kernels is None else kernels)
    report: dict[str, Any] = {"archs": [f"sm_{a}{b}" for a, b in archs],
              "versions": {d: _version(d) for d in ("numba", "numba-cuda", "nvidia-nvvm",
                                                    "nvidia-nvjitlink", "nvidia-cuda-nvdisasm")},
              "link_seconds": {}, "disassemble_seconds": {}, "kernels": []}
    with tempfile.TemporaryDirectory() if workdir is None else _nullcontext(workdir) as tmp:
        for arch in archs:
            arch_name = f"sm_{arch[0]}{arch[1]}"
            built = compile_kernels([(n, getattr(k, "py_func", k), t) for n, k, t, _ in kernels],
                                    arch)
            link = built.pop("")
            report["link_seconds"][arch_name] = round(link["link_seconds"], 4)
            start = time.perf_counter()
            sass = disassemble(link["cubin"], tmp)
            report["disassemble_seconds"][arch_name] = round(time.perf_counter() - start, 4)
            stats = _stats(link["log"])
            for name, _, _, hot in kernels:
                b = built[name]
                entry = b["entry"]
                divides = any(_PTX_DIV_SQRT.match(line) for line in b["ptx"].splitlines())
                report["kernels"].append({
                    "kernel": name, "arch": arch_name, "hot": hot, "entry": entry,
                    **stats.get(entry, {"registers": None, "stack_bytes": None,
                                        "spill_store_bytes": None, "spill_load_bytes": None}),
                    "ptx_seconds": round(b["ptx_seconds"], 4),
                    "ptx_fma": ptx_fma_findings(b["ptx"]),
                    "ptx_cvt_rni": ptx_nearest_int_conversions(b["ptx"]),
                    "divides_or_sqrt": divides,
                    "sass_fma": sass_fma_lines(sass.get(entry, "")),
                    "sass_found": entry in sass,
                })
    report["driver_loaded"] = bool(_driver_loaded()) and not driver_before
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report


class _nullcontext:  # noqa: N801 - contextlib.nullcontext, returning the given path
    def __init__(self, value: Any) -> None:
        self.value = value

    def __enter__(self) -> Any:
        return self.value

    def __exit__(self, *exc: Any) -> Any:
        return False


def problems(report: Any) -> Any:
    """What the report shows wrong, one line each; empty when every kernel passes."""
    out = []
    if report.get("driver_loaded"):
        out.append("compiling loaded the CUDA driver (libcuda): the check must run without a GPU")
    for k in report["kernels"]:
        where = f"{k['kernel']} on {k['arch']}"
        if k["ptx_fma"]:
            out.append(f"{where}: PTX a compiler may fuse into FMA (the CPU twin rounds twice): "
                       f"{k['ptx_fma'][:3]}")
        if k["ptx_cvt_rni"]:
            out.append(f"{where}: float -> integer rounds to nearest (NumPy truncates): "
                       f"{k['ptx_cvt_rni'][:3]}")
        if not k["sass_found"]:
            out.append(f"{where}: no SASS found for entry {k['entry']}")
        elif k["sass_fma"] and not k["divides_or_sqrt"]:
            out.append(f"{where}: FMA in the SASS: {k['sass_fma'][:3]}")
        if k["registers"] is None:
            out.append(f"{where}: no register count in nvJitLink's log")
        elif k["hot"] and (k["spill_store_bytes"] or k["spill_load_bytes"]):
            out.append(f"{where}: spills to local memory ({k['spill_store_bytes']} B stored, "
                       f"{k['spill_load_bytes']} B loaded)")
    return out


def table(report: Any) -> Any:
    """The report as text: one row per kernel and arch."""
    rows = [f"{'kernel':34} {'arch':6} {'regs':>4} {'stack':>5} {'spill':>5} {'ptx s':>6} "
            f"{'sassFMA':>7}  ok"]
    bad = {p.split(":")[0] for p in problems(report)}
    for k in report["kernels"]:
        spill = (k["spill_store_bytes"] or 0) + (k["spill_load_bytes"] or 0)
        where = f"{k['kernel']} on {k['arch']}"
        rows.append(f"{k['kernel']:34} {k['arch']:6} {k['registers'] or 0:4d} "
                    f"{k['stack_bytes'] or 0:5d} {spill:5d} {k['ptx_seconds']:6.3f} "
                    f"{len(k['sass_fma']):7d}  {'NO' if where in bad else 'ok'}")
    rows.append(f"link s {report['link_seconds']}, disassemble s {report['disassemble_seconds']}, "
                f"total {report['seconds']} s, versions {report['versions']}")
    return "\n".join(rows)


def main(argv: Any = None) -> Any:
    parser = argparse.ArgumentParser(prog="python -m mpidist.kernels.compiled",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    report = build_report()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(table(report))
    found = problems(report)
    for p in found:
        print("PROBLEM:", p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
