"""A stand-in *process* for launcher tests: it tests process handling, not what vLLM does.

usage: python fakeproc.py PORT MODE   (MODE: ok, exit-during-boot, never-healthy, ignore-term,
children, noisy-exit)
"""

import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

port, mode = int(sys.argv[1]), sys.argv[2]
print(f"fakeproc {mode} pid={os.getpid()}", flush=True)
if mode == "exit-during-boot":
    time.sleep(0.5)
    print("OSError: model path missing", flush=True)
    sys.exit(3)
if mode == "never-healthy":
    time.sleep(3600)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "children":
    # A grandchild in the same process group, like vLLM's engine core and workers.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    print(f"child pid={child.pid}", flush=True)
if mode == "noisy-exit":
    def on_term(*a):
        print("Traceback (most recent call last):\nUnicodeDecodeError: 'utf-8' codec can't decode", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)


class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


time.sleep(0.3)
HTTPServer(("127.0.0.1", port), H).serve_forever()
