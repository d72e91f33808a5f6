"""The compiled CPU kernels (paged_decode.cpp, decode_layers.cpp, causal_prefill.cpp, bf16_gemv.cpp, f32_gemv.cpp,
row_ops.cpp, bound in bindings.cpp) as one torch JIT extension.

Built once per machine and source (the build directory's name carries a hash of the sources, the compiler flags, the
torch version and the CPU's feature flags, since it is compiled for this CPU: -march=native, or the instruction set
TRITONLLM_KERNEL_MARCH names, e.g. x86-64-v3 to run the AVX2 code paths on an AVX-512 CPU) under
`$TRITONLLM_CACHE/kernels`, else `<repo>/.cache/kernels`: about a minute on 2 cores, then a load takes milliseconds.
`python -m backend.model.kernels.build` builds it ahead of time (`make kernels` does), so that no model process
compiles while a server starts.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import platform
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
SOURCES = tuple(HERE / name for name in (
    "paged_decode.cpp", "decode_layers.cpp", "causal_prefill.cpp", "bf16_gemv.cpp", "f32_gemv.cpp", "row_ops.cpp",
    "bindings.cpp"))
HEADERS = tuple(HERE / name for name in ("kernels.h", "pool_lines.h"))
# -fopenmp: at::parallel_for is inlined from ATen's headers and runs serially unless the code is compiled with OpenMP.
# The library links against the OpenMP runtime torch has loaded (openmp_runtimes()), so that the process keeps one
# runtime: one thread pool, and torch.set_num_threads governs the kernels too.
CFLAGS = ("-O3", f"-march={os.environ.get('TRITONLLM_KERNEL_MARCH') or 'native'}", "-fopenmp")
_OPENMP = re.compile(r"/lib(gomp|iomp5|omp)[^/]*\.so[^/]*$")


class KernelUnavailable(RuntimeError):
    """The kernels cannot be built or loaded here; the message says why."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def openmp_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (torch's, once torch is imported)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    paths = {fields[-1] for fields in map(str.split, lines) if len(fields) >= 6}  # the 6th field: the mapped file
    return sorted(path for path in paths if _OPENMP.search(path))


def ldflags() -> list[str]:
    """torch's OpenMP runtime by path (its own soname then resolves to the loaded copy), else the compiler's."""
    runtimes = openmp_runtimes()
    torch_own = [r for r in runtimes if "/torch/lib/" in r or "/torch.libs/" in r]
    return (torch_own or runtimes or ["-fopenmp"])[:1]


def build_name() -> str:
    """tritonllm_kernels_<hash of sources, flags, torch, CPU>: a change of any of them builds anew."""
    texts = [path.read_text() for path in SOURCES + HEADERS]
    key = "\n".join([*texts, " ".join(CFLAGS + tuple(ldflags())), torch.__version__, _cpu_flags()])
    return "tritonllm_kernels_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def build_root() -> Path:
    cache = os.environ.get("TRITONLLM_CACHE")
    return (Path(cache) if cache else HERE.parents[2] / ".cache") / "kernels"


def _ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the pip package `ninja` (a dependency) may sit only in the venv."""
    try:
        import ninja
    except ImportError:
        return
    if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Holds an flock on `<directory>.flock` (created if missing) while the body runs; blocks while another holds it.

    torch's builder guards its build directory with a `lock` file that only its holder removes, so a build killed
    part-way (a timeout, Ctrl-C twice, an OOM kill) leaves the file behind and every later build waits on it forever,
    silently. An flock is released by the kernel when its holder dies: whoever holds this one is the only builder
    alive, and a `lock` file found then is stale.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clear_stale_baton(directory: Path) -> None:
    """Removes torch's `lock` file from `directory` (call it holding build_lock: no live builder owns it then)."""
    baton = directory / "lock"
    if baton.exists():
        warnings.warn(f"removing {baton}, left by a kernel build that did not finish (its process is gone)",
                      RuntimeWarning, stacklevel=2)
        baton.unlink(missing_ok=True)


def _import(name: str, built: Path) -> ModuleType | None:
    """The built library imported as it is (no ninja, no build lock); None, with a warning, if it will not load."""
    spec = importlib.util.spec_from_file_location(name, built)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:  # e.g. a library cut short by a build killed while linking: built again
        warnings.warn(f"{built} does not load ({exc}); building it again", RuntimeWarning, stacklevel=2)
        built.unlink(missing_ok=True)
        return None
    return module


def build_once(name: str, directory: Path, build: Callable[[], ModuleType]) -> ModuleType:
    """`<directory>/<name>.so` imported if present, else `build()` run by one process at a time, stale locks cleared."""
    built = directory / f"{name}.so"
    if built.is_file() and (module := _import(name, built)) is not None:
        return module
    with build_lock(directory):
        if built.is_file() and (module := _import(name, built)) is not None:  # built while this process waited
            return module
        directory.mkdir(parents=True, exist_ok=True)
        clear_stale_baton(directory)
        return build()


@functools.lru_cache(maxsize=1)
def load() -> ModuleType:
    """The built extension (built now if needed); KernelUnavailable naming the reason otherwise."""
    from torch.utils import cpp_extension

    name = build_name()
    directory = build_root() / name

    def build() -> ModuleType:
        _ninja_on_path()
        return cpp_extension.load(name, [str(s) for s in SOURCES], extra_cflags=list(CFLAGS),
                                  extra_ldflags=ldflags(), build_directory=str(directory), verbose=False)

    try:
        return build_once(name, directory, build)
    except Exception as exc:  # a compiler, ninja or header missing: say which
        raise KernelUnavailable(f"building the kernels ({', '.join(s.name for s in SOURCES)}) in {directory} "
                                f"failed: {exc}") from exc


def avx512_bf16_missing(kernel: str, compiled: str) -> str | None:
    """Why `kernel` (AVX-512 BF16 code, compiled only for CPUs with it) cannot run here: the extension's `compiled()`
    says it was left out, or the kernels do not build; None where it runs."""
    try:
        if not getattr(load(), compiled)():
            return f"the {kernel} needs AVX-512 BF16, which this CPU lacks"
    except KernelUnavailable as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    load()
    print(build_root() / build_name())
