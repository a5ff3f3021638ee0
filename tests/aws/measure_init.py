"""Cold start of a Sluice function binary, measured locally.

Starts BINARY against a minimal Lambda runtime API on 127.0.0.1 (this script),
hands it one invocation, and prints, per start, the time from spawn to the
runtime's first `invocation/next` request (init) and to the handler's answer
(first call). The invocation is a planner request for a pipeline that is not
registered, answered from the checkpoint with no input read, so the figure is
start-up plus one checkpoint read.

Usage: measure_init.py BINARY [STARTS] [-- PREFIX...]
  PREFIX (e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu`) runs a foreign binary.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
prefix = []
if "--" in args:
    i = args.index("--")
    args, prefix = args[:i], args[i + 1 :]
binary = args[0]
name = os.path.basename(os.path.dirname(binary)) if os.path.basename(binary) == "bootstrap" else os.path.basename(binary)
starts = int(args[1]) if len(args) > 1 else 10


class Runtime(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = False
    events = None
    answer_path = ""
    start = 0  # each start polls under its own path: a late poll of a killed
    # process never takes the next start's invocation

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.endswith("/invocation/next"):
            if not self.path.startswith(f"/s{Runtime.start}/"):
                time.sleep(30)  # a killed process's late poll
                return
            Runtime.events.append(("next", time.perf_counter()))
            if Runtime.served:  # park the second poll until the process is killed
                time.sleep(30)
                return
            Runtime.served = True
            body = json.dumps({"pipeline": "not-registered", "run": None}).encode()
            self.send_response(200)
            self.send_header("Lambda-Runtime-Aws-Request-Id", "req-1")
            self.send_header("Lambda-Runtime-Deadline-Ms", str(int(time.time() * 1000) + 60000))
            self.send_header("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:1:function:f")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        if not self.path.startswith(f"/s{Runtime.start}/"):
            return
        Runtime.events.append(("answer", time.perf_counter()))
        Runtime.answer_path = self.path
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a killed function resets its parked poll: expected


server = Server(("127.0.0.1", 0), Runtime)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]

inits, firsts = [], []
with tempfile.TemporaryDirectory() as checkpoint:
    env = dict(
        os.environ,
        AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{port}",  # replaced per start below
        AWS_LAMBDA_FUNCTION_NAME="sluice-planner",
        AWS_LAMBDA_FUNCTION_MEMORY_SIZE="1769",
        AWS_LAMBDA_FUNCTION_VERSION="$LATEST",
        SLUICE_CHECKPOINT_URI=checkpoint,
        SLUICE_STATE_MACHINE_ARN="arn:aws:states:us-east-1:123456789012:stateMachine:sluice",
        AWS_REGION="us-east-1",
        RUST_LOG="warn",
    )
    for i in range(starts):
        Runtime.served, Runtime.events, Runtime.start = False, [], i
        env["AWS_LAMBDA_RUNTIME_API"] = f"http://127.0.0.1:{port}/s{i}"
        t0 = time.perf_counter()
        p = subprocess.Popen(prefix + [binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = t0 + 30
        while not any(e == "answer" for e, _ in Runtime.events) and time.perf_counter() < deadline:
            time.sleep(0.0005)
        p.kill()
        p.wait()
        nxt = next((t for e, t in Runtime.events if e == "next"), None)
        ans = next((t for e, t in Runtime.events if e == "answer"), None)
        if nxt is None or ans is None:
            sys.exit(f"{binary}: no invocation answered within 30 s")
        inits.append((nxt - t0) * 1000)
        firsts.append((ans - t0) * 1000)

kind = "an error" if Runtime.answer_path.endswith("/error") else "a response"
print(f"{name}: {starts} starts (the handler answered with {kind})")
print(f"  spawn -> first invocation/next (init): median {statistics.median(inits):.1f} ms, max {max(inits):.1f} ms")
print(f"  spawn -> first answer (init + handler): median {statistics.median(firsts):.1f} ms, max {max(firsts):.1f} ms")
