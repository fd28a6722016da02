"""Pick the fastest available PyTorch device and describe the environment.

`get_device` follows the book: CUDA, then Apple's MPS, then Intel's XPU, then the
CPU. On CUDA it switches matrix multiplications to TF32 tensor cores, using the
setting that the installed PyTorch version actually reads.
"""

from __future__ import annotations

import itertools
import platform
import sys

import torch


def torch_version() -> tuple[int, int]:
    """The installed torch version as (major, minor), e.g. (2, 10): local
    tags ("+cpu") and pre-release suffixes ("0a0") ignored."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    digits = "".join(itertools.takewhile(str.isdigit, minor))
    return int(major), int(digits or 0)


def enable_tf32() -> None:
    """Let float32 matmuls and convolutions on CUDA use TF32 tensor cores.

    PyTorch 2.9 introduced the `fp32_precision` switches, but torch.compile in
    2.9 and 2.10 still reads the older `allow_tf32` flags, so those versions
    keep using the old flags; 2.11 and newer use the new ones. That is what the
    book's package (0.2.0) does; the printed Listing 2.1 switches at 2.9.
    """
    if torch_version() >= (2, 11):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def get_device(enable_tensor_cores: bool = True) -> torch.device:
    """Return the best available device (CUDA, MPS, XPU, CPU) and print which."""
    if torch.cuda.is_available():
        device = torch.device("cuda")
        print(f"Using NVIDIA CUDA GPU ({torch.cuda.get_device_name(0)})")
        if enable_tensor_cores:
            enable_tf32()
    elif torch.backends.mps.is_available():
        device = torch.device("mps")
        print("Using Apple Silicon GPU (MPS)")
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        device = torch.device("xpu")
        print("Using Intel GPU (XPU)")
    else:
        device = torch.device("cpu")
        print("Using CPU")
    return device


def resolve_device(name: str | None) -> torch.device:
    """Turn a user-supplied name ("auto", "cpu", "cuda", "cuda:1", "mps",
    "xpu") into a device, with a clear error when it is unknown or absent."""
    if name is None or name == "auto":
        return get_device()
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(
            f"Unknown device {name!r}: use auto, cpu, cuda, cuda:N, mps or xpu."
        ) from exc
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
        "xpu": hasattr(torch, "xpu") and torch.xpu.is_available(),
    }
    if not available.get(device.type, False):
        raise ValueError(
            f"Device {name!r} is not available on this machine "
            f"(available: {', '.join(k for k, v in available.items() if v)})."
        )
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            raise ValueError(
                f"Device {name!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)."
            )
    return device


def supports_bf16(device: torch.device) -> bool:
    """Whether bfloat16 matmuls run natively (not emulated) on `device`."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "mps":
        return torch_version() >= (2, 5)
    return True


def environment_summary(device: torch.device | None = None) -> dict[str, str]:
    """One dictionary describing Python, PyTorch and the device, for notebooks
    and bug reports. It does not print: use `print_environment` for that."""
    if device is None:
        device = torch.device(
            "cuda"
            if torch.cuda.is_available()
            else "mps"
            if torch.backends.mps.is_available()
            else "cpu"
        )
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "device": str(device),
        "bfloat16": "yes" if supports_bf16(device) else "emulated/slow",
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_gb"] = f"{props.total_memory / 1024**3:.1f}"
        info["cuda"] = str(torch.version.cuda)
    else:
        info["cpu_threads"] = str(torch.get_num_threads())
    return info


def print_environment(device: torch.device | None = None) -> None:
    """Print `environment_summary` as aligned `key: value` lines."""
    info = environment_summary(device)
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"{key:<{width}} : {value}")


# --------------------------------------------------------------------------
# Waiting for the device and measuring memory (the one home of these)
# --------------------------------------------------------------------------


def process_memory_bytes() -> tuple[int, int]:
    """(current, peak) resident memory of this process in bytes (CPU runs).

    The peak comes from Windows' peak working set or Unix `getrusage`; where
    neither exists, the current figure stands in for it.
    """
    import psutil

    info = psutil.Process().memory_info()
    current = info.rss
    peak = getattr(info, "peak_wset", None)  # Windows only
    if peak is None:
        try:
            import resource  # Unix only
        except ImportError:
            peak = current
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            # Linux reports kilobytes, macOS bytes
            peak = peak if sys.platform == "darwin" else peak * 1024
    return current, max(int(peak), current)


def _accelerator_backend(device: torch.device):
    if device.type in ("cuda", "xpu", "mps"):
        backend = getattr(torch, device.type, None)
        if backend is not None and backend.is_available():
            return backend
    return None


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """Peak memory for `device` and what the figure means.

    CUDA/XPU: peak tensor memory allocated since the last reset; MPS: memory
    currently held by the allocator; CPU: peak resident size of the process.
    """
    backend = _accelerator_backend(device)
    if backend is not None:
        backend.synchronize()
        if device.type == "mps":
            return int(torch.mps.driver_allocated_memory()), "MPS memory held"
        return int(backend.max_memory_allocated()), (
            f"Max {device.type.upper()} memory allocated"
        )
    return process_memory_bytes()[1], "Peak process memory (RSS)"


def model_device(model: torch.nn.Module | None) -> torch.device:
    """The device `model`'s weights are on (its first parameter's); the CPU
    for a model without parameters, or for None."""
    if model is not None:
        for param in model.parameters():
            return param.device
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for queued work on CUDA/XPU/MPS (no-op on CPU), before timing."""
    backend = _accelerator_backend(device)
    if backend is not None:
        backend.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    """Start a fresh peak-memory measurement on CUDA/XPU (no-op elsewhere)."""
    backend = _accelerator_backend(device)
    if backend is not None and hasattr(backend, "reset_peak_memory_stats"):
        backend.reset_peak_memory_stats()
