"""Weight-audit probe: streams a checkpoint through the real loaders and reports what arrived.

Runs inside the system-under-test's Python (torch, runai-model-streamer, maybe vLLM), never in
the bench's, so it imports nothing from the bench: stdlib, torch and the loaders only. The bench
runs it as ``python audit_probe.py PLAN.json`` with the streamer overlay first on PYTHONPATH.

The plan is {"runs": [{"order": name, "files": [path, ...]}, ...], "loaders": ["streamer", "vllm"]}.
For every run and loader, the file list is handed to the loader in one call, exactly as vLLM's
runai_streamer loader does: (a) SafetensorsStreamer.stream_files, (b) vLLM's
runai_safetensors_weights_iterator. Each delivered tensor is hashed at once (runai-model-streamer
0.16 yields views into a buffer it reuses) over its raw bytes viewed as uint8, so FP8 and packed
FP4 hash like any other dtype.

Output is JSON lines on the original stdout, which nothing else may write to: vLLM and the
streamer log to stdout, so fd 1 is pointed at stderr before any of them is imported.
  {"type": "probe", versions...}                 first, once the streamer imported
  {"type": "begin", "order", "loader"}
  {"type": "tensor", "order", "loader", "name", "dtype", "shape", "nbytes", "sha256"}
  {"type": "end", "order", "loader", "error", "seconds"}   error: a loader that raised, a finding
  {"type": "done", "streamer_version"}           last, after every run
  {"type": "fatal", "error"}                     instead, when the probe itself cannot work
"""

from __future__ import annotations

import os
import sys

# Run as a script, the probe's own folder (the bench package) would come first on sys.path and
# its modules (config, records, ...) could shadow the loaders' imports.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

_out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

DTYPE_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3", "float8_e4m3fnuz": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e5m2fnuz": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4",
}


def emit(**fields) -> None:
    _out.write(json.dumps(fields) + "\n")


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def tensor_line(torch, order: str, loader: str, name: str, tensor) -> dict:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy()
    dtype = str(tensor.dtype).removeprefix("torch.")
    return dict(
        type="tensor", order=order, loader=loader, name=name, dtype=DTYPE_NAMES.get(dtype, dtype),
        shape=list(tensor.shape), nbytes=int(raw.nbytes), sha256=hashlib.sha256(raw).hexdigest(),
    )


def stream_with_streamer(files: list[str]):
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_files(files, device="cpu")
        yield from streamer.get_tensors()


def stream_with_vllm(files: list[str]):
    from vllm.model_executor.model_loader.weight_utils import runai_safetensors_weights_iterator

    yield from runai_safetensors_weights_iterator(files, False)


LOADERS = {"streamer": stream_with_streamer, "vllm": stream_with_vllm}


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        plan = json.load(f)
    try:
        import torch
        import runai_model_streamer

        streamer_version = importlib.metadata.version("runai-model-streamer")
    except Exception as exc:
        traceback.print_exc()
        emit(type="fatal", error=describe(exc))
        return 3
    loaders = list(plan["loaders"])
    vllm_version = vllm_error = None
    if "vllm" in loaders:
        try:
            import vllm.model_executor.model_loader.weight_utils  # noqa: F401

            vllm_version = importlib.metadata.version("vllm")
        except Exception as exc:
            traceback.print_exc()
            vllm_error = describe(exc)
            loaders.remove("vllm")
    emit(
        type="probe", python=sys.executable, streamer_version=streamer_version,
        streamer_path=os.path.dirname(runai_model_streamer.__file__), torch_version=torch.__version__,
        vllm_version=vllm_version, vllm_error=vllm_error,
    )
    for run in plan["runs"]:
        for loader in loaders:
            emit(type="begin", order=run["order"], loader=loader)
            started = time.monotonic()
            error = None
            try:
                for name, tensor in LOADERS[loader](list(run["files"])):
                    emit(**tensor_line(torch, run["order"], loader, name, tensor))
            except Exception as exc:
                # A loader that raises is what the audit is looking for: report it and go on.
                traceback.print_exc()
                error = describe(exc)
            emit(type="end", order=run["order"], loader=loader, error=error,
                 seconds=round(time.monotonic() - started, 3))
    emit(type="done", streamer_version=streamer_version)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
