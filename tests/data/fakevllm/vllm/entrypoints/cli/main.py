"""A stand-in for `python -m vllm.entrypoints.cli.main serve ...`, put first on an image's
PYTHONPATH by tests about the bench's own handling (results writing, secrets in logs), never
about what vLLM does. It serves the tests' fake OpenAI wire server on the given port as a real
process, prints the lines of FAKE_VLLM_PRINT ($NAME expanded from its environment), prints
"request received" as each request arrives (tests wait for that line, never for a while), appends
a line to FAKE_VLLM_COUNT per workload answer sent (the reference text's score is recorded with
its run, not as a request), and exits 0 on SIGTERM like vLLM does."""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))  # tests/, for fakeserver

from fakeserver import FakeServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
for line in os.environ.get("FAKE_VLLM_PRINT", "").split("|"):
    if line:
        print(os.path.expandvars(line), flush=True)
count_file = os.environ.get("FAKE_VLLM_COUNT")


class Counting(FakeServer):
    def handle(self, h, body):
        print("request received", flush=True)
        super().handle(h, body)
        if count_file and not body.get("echo"):
            with open(count_file, "a") as f:
                f.write("1\n")


def on_term(*_):
    print("shutting down", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
server = Counting(os.environ.get("FAKE_VLLM_MODE", "ok"), int(os.environ.get("FAKE_VLLM_TOKENS", "128")), port)
print(f"serving on 127.0.0.1:{port}", flush=True)
server.httpd.serve_forever()
