"""The weight audit's reader: streams a checkpoint through the real loaders and reports what arrived.

Runs inside the system-under-test's Python (torch, runai-model-streamer, maybe vLLM), never in
the bench's, so it imports nothing from the bench: stdlib, torch and the loaders only. The bench
runs it as ``python reader.py PLAN.json`` with the streamer overlay first on PYTHONPATH.

The plan is {"runs": [{"order": name, "files": [path, ...]}, ...], "loaders": ["streamer", "vllm"]}.
For every run and loader, the file list is handed to the loader in one call, exactly as vLLM's
runai_streamer loader does: (a) SafetensorsStreamer.stream_files, (b) vLLM's
runai_safetensors_weights_iterator. Each delivered tensor is hashed at once (runai-model-streamer
0.16 yields views into a buffer it reuses) over its raw bytes viewed as uint8, so FP8 and packed
FP4 hash like any other dtype.

vLLM's iterator without importing vLLM: importing its module (weight_utils) imports most of vLLM,
~10 s on 2 cores, against ~1.5 s for torch and the streamer; it was most of an audit's time. So
the reader reads the installed weight_utils.py and compiles, under that file's name, the iterator
with the module-level definitions and import statements it uses (enable_tqdm, _BAR_FORMAT;
torch, tqdm, SafetensorsStreamer, imported for real), in the file's order: the bytecode is the
same as vLLM's own (a test compares them). The one vLLM name it uses, current_platform, gets a
stand-in (see _CpuPlatform): the reader passes is_distributed=False, with which the iterator streams
to "cpu" whatever the platform says. When the installed release's iterator needs anything else
from vLLM (or is decorated), the reader imports the module instead; the hello line says which.

Output is JSON lines on the original stdout, which nothing else may write to: vLLM and the
streamer log to stdout, so fd 1 is pointed at stderr before any of them is imported.
  {"type": "hello", versions..., how vLLM's iterator was loaded, import seconds}   first
  {"type": "begin", "order", "loader"}
  {"type": "tensor", "order", "loader", "name", "dtype", "shape", "nbytes", "sha256"}
  {"type": "end", "order", "loader", "error", "seconds", "unsupported"}
      error: a loader that raised, a finding; unsupported: the reader does not know how to call this
      release of the loader (no API it can drive), which says nothing about the weights
  {"type": "done", "streamer_version"}           last, after every run
  {"type": "fatal", "error"}                     instead, when the reader itself cannot work
"""

from __future__ import annotations

import os
import sys

# Run as a script, the reader's own folder (the bench package) would come first on sys.path and
# its modules (config, records, ...) could shadow the loaders' imports.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

import ast  # noqa: E402
import builtins  # noqa: E402
import dis  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402

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


class Unsupported(Exception):
    """This release of the loader has no API the reader knows how to drive: not a finding about
    the weights, and never reported as one."""


def _fits(call, *args, **kwargs) -> bool:
    import inspect

    try:
        inspect.signature(call).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): try the call
        return True
    return True


def streamer_api():
    """How to hand the files to the installed release, decided before any call so that an error
    raised while streaming is always the loader's own. Measured: 0.13.0-0.13.2 have only the
    per-file stream_file, 0.13.3-0.14.0's stream_files takes no device, 0.15.0 and later take one.
    Raises Unsupported for a release with none of these."""
    try:
        from runai_model_streamer import SafetensorsStreamer
    except ImportError as exc:
        raise Unsupported(f"runai_model_streamer has no SafetensorsStreamer ({describe(exc)})") from None
    needs = [n for n in ("__enter__", "__exit__", "get_tensors") if not hasattr(SafetensorsStreamer, n)]
    if needs:
        raise Unsupported(f"SafetensorsStreamer has no {', '.join(needs)}")
    many = getattr(SafetensorsStreamer, "stream_files", None)
    one = getattr(SafetensorsStreamer, "stream_file", None)
    if many is not None and _fits(many, None, ["f"], device="cpu"):
        return SafetensorsStreamer, "stream_files(device)"
    if many is not None and _fits(many, None, ["f"]):
        return SafetensorsStreamer, "stream_files"
    if one is not None and _fits(one, None, "f"):
        return SafetensorsStreamer, "stream_file"
    found = [n for n, f in (("stream_files", many), ("stream_file", one)) if f is not None]
    raise Unsupported("SafetensorsStreamer has no stream_files(paths) or stream_file(path)"
                      + (f" ({', '.join(found)} take other arguments)" if found else ""))


def stream_with_streamer(files: list[str]):
    """All files in one call, as vLLM does, with the API the installed release has."""
    streamer_class, api = streamer_api()
    with streamer_class() as streamer:
        if api == "stream_file":
            for path in files:
                streamer.stream_file(path)
                yield from streamer.get_tensors()
            return
        if api == "stream_files(device)":
            streamer.stream_files(files, device="cpu")
        else:
            streamer.stream_files(files)
        yield from streamer.get_tensors()


VLLM_MODULE = "vllm.model_executor.model_loader.weight_utils"
VLLM_ITERATOR = "runai_safetensors_weights_iterator"


class _CpuPlatform:
    """Stands in for vllm.platforms.current_platform (importing it imports most of vLLM). The
    iterator asks is_cuda_alike() and uses it only together with is_distributed, which the reader
    passes as False: the device is "cpu" either way."""

    def is_cuda_alike(self) -> bool:
        return False

    def current_device(self):
        raise RuntimeError("the audit's reader streams with is_distributed=False: no device to ask for")


# What the extracted code may import from vLLM: (module, name) -> the object it gets instead.
STAND_INS = {("vllm.platforms", "current_platform"): _CpuPlatform()}


class NotExtractable(Exception):
    """The installed iterator needs more than the reader can give it without importing vLLM."""


def _global_names(code) -> set[str]:
    names = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL"):
            names.add(ins.argval)
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            names |= _global_names(const)
    return names


def _top_level(tree: ast.Module) -> tuple[dict[str, ast.stmt], dict[str, ast.Import | ast.ImportFrom]]:
    """Module-level definitions, and import statements cut to one name each, by the name they
    bind. Imports in a try: are taken from its body (the module's first choice), not its handlers."""
    defined: dict[str, ast.stmt] = {}
    imported: dict[str, ast.Import | ast.ImportFrom] = {}
    for node in tree.body:
        for stmt in (node.body if isinstance(node, ast.Try) else [node]):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined[stmt.name] = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        defined[t.id] = stmt
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    one: ast.Import | ast.ImportFrom = (
                        ast.Import(names=[alias]) if isinstance(stmt, ast.Import)
                        else ast.ImportFrom(module=stmt.module, names=[alias], level=stmt.level))
                    imported[(alias.asname or alias.name).split(".")[0]] = ast.copy_location(one, stmt)
    return defined, imported


def _import_without_vllm(name, globals=None, locals=None, fromlist=(), level=0):
    """__import__ for the extracted code: everything as usual, but vLLM's modules, of which only
    the stand-ins exist."""
    if level == 0 and name.split(".")[0] == "vllm":
        if fromlist and all((name, n) in STAND_INS for n in fromlist):
            return types.SimpleNamespace(**{n: STAND_INS[(name, n)] for n in fromlist})
        raise ImportError(f"{name}: vLLM is not imported by the audit's reader")
    return builtins.__import__(name, globals, locals, fromlist, level)


def extract_vllm_iterator(path: str):
    """vLLM's runai_safetensors_weights_iterator compiled from its own source file, with the
    module-level definitions and import statements it needs, in the file's order, without
    importing vLLM: its imports of vLLM get the stand-ins. Keeping the import statements makes
    the compiled bytecode the same as vLLM's own (CPython compiles a call on an imported name
    differently). Raises NotExtractable. (dont_inherit: this file's `from __future__` must not
    change how vLLM's code is compiled.)"""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    defined, imported = _top_level(tree)
    if not isinstance(defined.get(VLLM_ITERATOR), ast.FunctionDef):
        raise NotExtractable(f"no function {VLLM_ITERATOR} at the top level of {path}")
    nodes: list[ast.stmt] = []
    pending, seen = [VLLM_ITERATOR], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        node: ast.stmt
        if name in defined:
            node = defined[name]
            if getattr(node, "decorator_list", None):
                raise NotExtractable(f"{name} is decorated")
            code = compile(ast.Module(body=[node], type_ignores=[]), path, "exec", dont_inherit=True)
            pending += sorted(_global_names(code))
        elif name in imported:
            node = one = imported[name]
            module = (one.module if isinstance(one, ast.ImportFrom) else one.names[0].name) or ""
            if getattr(one, "level", 0) or (
                    module.split(".")[0] == "vllm" and (module, one.names[0].name) not in STAND_INS):
                raise NotExtractable(f"{VLLM_ITERATOR} needs {name} from {module}")
        elif hasattr(builtins, name):
            continue
        else:
            raise NotExtractable(f"{VLLM_ITERATOR} needs {name}, which {path} does not define")
        if node not in nodes:
            nodes.append(node)
    nodes.sort(key=lambda n: n.lineno)  # the file's own order: an assignment may use a def above it
    namespace = {"__name__": VLLM_MODULE, "__file__": path,
                 "__builtins__": dict(vars(builtins), __import__=_import_without_vllm)}
    try:
        exec(compile(ast.Module(body=nodes, type_ignores=[]), path, "exec", dont_inherit=True), namespace)
    except Exception as exc:  # an import the module would have made fails here too
        raise NotExtractable(describe(exc)) from None
    return namespace[VLLM_ITERATOR]


def load_vllm_iterator():
    """(iterator, how it was loaded). Raises what importing vLLM raises when it must be imported."""
    spec = importlib.util.find_spec("vllm")  # a top-level name: finds it without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'vllm'")
    path = os.path.join(next(iter(spec.submodule_search_locations)), *VLLM_MODULE.split(".")[1:]) + ".py"
    try:
        return extract_vllm_iterator(path), f"{VLLM_ITERATOR} compiled from {path} (vLLM not imported)"
    except (OSError, SyntaxError, NotExtractable) as exc:
        reason = describe(exc)
    module = importlib.import_module(VLLM_MODULE)
    return getattr(module, VLLM_ITERATOR), f"{VLLM_MODULE} imported ({reason})"


def stream_with_vllm(iterator):
    def stream(files: list[str]):
        yield from iterator(files, False)

    return stream


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        plan = json.load(f)
    started = time.monotonic()
    try:
        import torch  # first: a Python without torch is named as such  # isort: skip
        import runai_model_streamer

        streamer_version = importlib.metadata.version("runai-model-streamer")
    except Exception as exc:
        traceback.print_exc()
        emit(type="fatal", error=describe(exc))
        return 3
    import_seconds = round(time.monotonic() - started, 3)
    loaders = {name: stream_with_streamer for name in plan["loaders"] if name == "streamer"}
    vllm_version = vllm_error = vllm_iterator = vllm_seconds = None
    if "vllm" in plan["loaders"]:
        started = time.monotonic()
        try:
            iterator, vllm_iterator = load_vllm_iterator()
            vllm_version = importlib.metadata.version("vllm")
            loaders["vllm"] = stream_with_vllm(iterator)
        except Exception as exc:
            traceback.print_exc()
            vllm_error = describe(exc)
        vllm_seconds = round(time.monotonic() - started, 3)
    emit(
        type="hello", python=sys.executable, streamer_version=streamer_version,
        streamer_path=os.path.dirname(runai_model_streamer.__file__), torch_version=torch.__version__,
        vllm_version=vllm_version, vllm_error=vllm_error, vllm_iterator=vllm_iterator,
        import_seconds=import_seconds, vllm_seconds=vllm_seconds,
    )
    for run in plan["runs"]:
        for loader in (name for name in plan["loaders"] if name in loaders):
            emit(type="begin", order=run["order"], loader=loader)
            started = time.monotonic()
            error = unsupported = None
            try:
                for name, tensor in loaders[loader](list(run["files"])):
                    emit(**tensor_line(torch, run["order"], loader, name, tensor))
            except Unsupported as exc:
                unsupported = str(exc)
            except Exception as exc:
                # A loader that raised is what the audit is looking for: report it and go on.
                traceback.print_exc()
                error = describe(exc)
            emit(type="end", order=run["order"], loader=loader, error=error, unsupported=unsupported,
                 seconds=round(time.monotonic() - started, 3))
    emit(type="done", streamer_version=streamer_version)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # Everything is written: skip the interpreter's teardown, ~0.5 s of unloading torch on 2 cores.
    _out.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
