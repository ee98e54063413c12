"""A small Kubernetes API client for the benchmarks (Python standard library only): the
kubeconfig's current context through `kubectl config view --raw`, client-certificate or token
auth, one keep-alive HTTPS connection per thread, and watch streams read line by line (so an
observer costs the apiserver one watch, not a list per poll). Not a product part."""

import base64
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import threading
import urllib.parse


class Api:
    def __init__(self):
        cfg = json.loads(
            subprocess.check_output(["kubectl", "config", "view", "--raw", "--minify", "-o", "json"])
        )
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        url = urllib.parse.urlparse(cluster["server"])
        self.host, self.port = url.hostname, url.port or 443
        self.ctx = ssl.create_default_context()
        self._dir = tempfile.mkdtemp(prefix="kiln-bench-api.")

        def written(name, data_key, file_key, where):
            if data_key in where:
                path = os.path.join(self._dir, name)
                with open(path, "wb") as f:
                    f.write(base64.b64decode(where[data_key]))
                return path
            return where.get(file_key)

        ca = written("ca.crt", "certificate-authority-data", "certificate-authority", cluster)
        if ca:
            self.ctx.load_verify_locations(ca)
        cert = written("client.crt", "client-certificate-data", "client-certificate", user)
        key = written("client.key", "client-key-data", "client-key", user)
        if cert:
            self.ctx.load_cert_chain(cert, key)
        self.headers = {"Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = "Bearer " + user["token"]
        self.local = threading.local()

    def connection(self, timeout=60):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method, path, body=None, content_type="application/json"):
        """(status, parsed body) of one request on this thread's connection."""
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = self.connection()
            headers = dict(self.headers)
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.HTTPException, OSError):
                self.local.conn = None
                if attempt:
                    raise
                continue
            return resp.status, (json.loads(raw) if raw else None)

    def apply_status(self, path, body, manager):
        """Server-side apply of a status subresource, forced, as kiln's components send it."""
        query = urllib.parse.urlencode({"fieldManager": manager, "force": "true"})
        return self.request("PATCH", f"{path}/status?{query}", body, "application/apply-patch+yaml")

    def watch(self, path, resource_version="0"):
        """Yields (type, object) of a watch on `path` from `resource_version` (0: every object
        as ADDED first, then changes), until the server ends it."""
        conn = self.connection(timeout=None)
        sep = "&" if "?" in path else "?"
        conn.request(
            "GET",
            f"{path}{sep}watch=1&allowWatchBookmarks=false&resourceVersion={resource_version}",
            headers=self.headers,
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"watch {path}: HTTP {resp.status} {resp.read()[:300]!r}")
        while True:
            line = resp.readline()
            if not line:
                return
            event = json.loads(line)
            yield event["type"], event["object"]
