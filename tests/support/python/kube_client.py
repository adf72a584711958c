"""The small Kubernetes REST client, polling and process helpers that the Python suites against a
real API server share (tests/chart/chart_real_test.py, tests/node/node_harness.py): standard
library only, so that it also runs under a bare `python3` (node_harness.py's command line).

Import it after putting this folder on sys.path:
    sys.path.insert(0, str(REPO / "tests" / "support" / "python"))
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request


def eventually(what: str, pred, timeout: float, interval: float, fail):
    """Polls pred() every `interval` seconds until it returns a truthy value (returned) or
    `timeout` seconds pass; then calls fail(message), which must raise (pytest.fail, or a
    caller's own error type)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
    raise AssertionError(f"eventually: fail() returned instead of raising for {what}")


def stop_process(proc: subprocess.Popen, grace: float = 60.0):
    """SIGTERM to proc unless it has exited, then SIGKILL when it has not ended within `grace`
    seconds; returns once it is reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ApiError(Exception):
    """An API call answered a status it should not have; the message names the call."""

    def __init__(self, status: int, body: str, what: str):
        super().__init__(f"{what}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class Api:
    """A small REST client: client certificate (admin) or bearer token (a ServiceAccount).
    Failed calls raise `error_type` (a subclass may name its own ApiError subclass)."""

    error_type = ApiError

    def __init__(self, server: str, ca_file: str, cert: tuple[str, str] | None = None,
                 token: str | None = None):
        self.server = server
        self.context = ssl.create_default_context(cafile=ca_file)
        if cert:
            self.context.load_cert_chain(*cert)
        self.token = token
        self._discovery: dict[str, list] = {}

    def request(self, method: str, path: str, body=None,
                content_type: str = "application/json") -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=60) as resp:
                text = resp.read().decode()
                return resp.status, (json.loads(text) if text else {})
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"message": text}

    def call(self, method: str, path: str, body=None, content_type: str = "application/json"):
        status, answer = self.request(method, path, body, content_type)
        if not 200 <= status < 300:
            raise self.error_type(status, json.dumps(answer), f"{method} {path}")
        return answer

    def get(self, path: str) -> dict | None:
        status, answer = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise self.error_type(status, json.dumps(answer), f"GET {path}")
        return answer

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(collection prefix, namespaced) of a kind, through discovery."""
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        if prefix not in self._discovery:
            self._discovery[prefix] = self.call("GET", prefix)["resources"]
        for r in self._discovery[prefix]:
            if r["kind"] == kind and "/" not in r["name"]:
                return f"{prefix}/{{ns}}{r['name']}", r["namespaced"]
        self._discovery.pop(prefix)
        raise LookupError(f"the API server serves no {kind} in {api_version}")

    def apply(self, obj: dict, namespace: str) -> dict:
        """Creates obj, or replaces it when it exists, refusing unknown fields
        (fieldValidation=Strict, as `kubectl apply --validate=strict`). Returns the server's
        object."""
        path, namespaced = self.resource(obj["apiVersion"], obj["kind"])
        ns = obj["metadata"].get("namespace", namespace) if namespaced else ""
        if namespaced:
            obj["metadata"]["namespace"] = ns
        collection = path.format(ns=f"namespaces/{ns}/" if namespaced else "")
        strict = "?fieldValidation=Strict"
        status, answer = self.request("POST", collection + strict, obj)
        if status == 409:
            name = obj["metadata"]["name"]
            current = self.call("GET", f"{collection}/{name}")
            obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            return self.call("PUT", f"{collection}/{name}{strict}", obj)
        if status not in (200, 201):
            raise self.error_type(status, json.dumps(answer),
                                  f"create {obj['kind']} {ns}/{obj['metadata']['name']}")
        return answer
