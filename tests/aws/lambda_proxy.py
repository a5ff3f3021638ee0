"""The bridge between moto's Step Functions interpreter and cargo-lambda.

moto calls Lambda at http://localhost:$MOTO_PORT; start moto with MOTO_PORT
set to this proxy's port. The proxy
  - maps a function ARN in an Invoke path to the bare name cargo-lambda wants,
  - turns cargo-lambda's HTTP 500 for a handler error into what Lambda sends:
    200 with `X-Amz-Function-Error: Unhandled` and the error body, so a Retry
    or Catch sees the error name,
  - can inject function errors for the tests (POST /_proxy/faults with
    {"function": NAME, "error": "Sluice.Retryable", "count": 1}): the next
    `count` invocations of NAME fail with that error without reaching it;
    or hold them ({"function": NAME, "delay_s": 3, "count": 1}) for that
    long before passing them on (a slow task, to cancel a run under),
  - counts invocations per function (GET /_proxy/stats),
  - forwards every other request to moto unchanged, counting the S3
    requests among them by what S3 bills them as (stats "s3": get, head,
    list, put, delete, post): point a client's S3 endpoint here to count
    its requests from the server's side.

Usage: lambda_proxy.py PORT MOTO_PORT LAMBDA_PORT  (listens on 127.0.0.1).
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MOTO, LAMBDA = (int(a) for a in sys.argv[1:4])
S3_LOG = __import__("os").environ.get("SLUICE_PROXY_S3_LOG")
INVOKE = "/2015-03-31/functions/"
lock = threading.Lock()
faults = {}  # name -> {"error" or "delay_s", "count"}
stats = {}  # name -> {"invocations": n, "injected": n, "errors": n}


def function_name(quoted):
    """`arn:aws:lambda:REGION:ACCOUNT:function:NAME[:QUALIFIER]` or NAME."""
    name = urllib.parse.unquote(quoted)
    if name.startswith("arn:"):
        parts = name.split(":")
        name = parts[6]
    return name


def s3_kind(method, path):
    """An S3 request's billing class from its method and path (path-style
    `/bucket[/key][?query]`): a GET of a bucket is a LIST."""
    base, _, query = path.partition("?")
    if method == "GET":
        bucket_only = base.strip("/").count("/") == 0
        return "list" if bucket_only or "list-type=" in query else "get"
    return {"HEAD": "head", "PUT": "put", "DELETE": "delete"}.get(method, "post")


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet; moto and cargo-lambda log
        pass

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def reply(self, status, body, headers=(), length=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        # A HEAD's length is the object's, not its (empty) body's.
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def forward(self, port, path, body):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", data=body if body else None, method=self.command
        )
        for k, v in self.headers.items():
            if k.lower() not in ("host", "content-length", "connection"):
                req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=900) as r:
                return r.status, r.read(), r.getheaders()
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers.items()

    def handle_any(self):
        body = self.body()
        path = self.path
        if path == "/_proxy/faults" and self.command == "POST":
            f = json.loads(body)
            with lock:
                faults[f["function"]] = {
                    "error": f.get("error"),
                    "delay_s": float(f.get("delay_s", 0)),
                    "count": int(f.get("count", 1)),
                }
            return self.reply(200, b"{}")
        if path == "/_proxy/stats":
            with lock:
                return self.reply(200, json.dumps(stats).encode())
        if path.startswith(INVOKE) and path.endswith("/invocations"):
            name = function_name(path[len(INVOKE) : -len("/invocations")])
            with lock:
                s = stats.setdefault(name, {"invocations": 0, "injected": 0, "delayed": 0, "errors": 0})
                s["invocations"] += 1
                fault = faults.get(name)
                active = fault is not None and fault["count"] > 0
                if active:
                    fault["count"] -= 1
                    s["injected" if fault["error"] else "delayed"] += 1
            inject = active and fault["error"]
            if active and not inject:
                time.sleep(fault["delay_s"])
            if inject:
                err = {"errorType": fault["error"], "errorMessage": f"injected by the test proxy into {name}"}
                return self.reply(
                    200,
                    json.dumps(err).encode(),
                    [("Content-Type", "application/json"), ("X-Amz-Function-Error", "Unhandled")],
                )
            status, out, _ = self.forward(LAMBDA, f"{INVOKE}{name}/invocations", body)
            if status >= 500:
                with lock:
                    stats[name]["errors"] += 1
                return self.reply(
                    200,
                    out,
                    [("Content-Type", "application/json"), ("X-Amz-Function-Error", "Unhandled")],
                )
            return self.reply(status, out, [("Content-Type", "application/json")])
        if "X-Amz-Target" not in self.headers:
            with lock:
                s3 = stats.setdefault("s3", {})
                kind = s3_kind(self.command, path)
                s3[kind] = s3.get(kind, 0) + 1
                if S3_LOG:
                    with open(S3_LOG, "a") as f:
                        f.write(f"{time.time():.3f} {self.command} {path}\n")
        status, out, headers = self.forward(MOTO, path, body)
        keep = [(k, v) for k, v in headers if k.lower() not in ("content-length", "connection", "transfer-encoding")]
        length = None
        if self.command == "HEAD":
            length = next((v for k, v in headers if k.lower() == "content-length"), "0")
        return self.reply(status, out, keep, length)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), Proxy).serve_forever()
