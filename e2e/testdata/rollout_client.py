"""Runs through a Service while the pods behind it are replaced (e2e/tests/serving.sh: a rolling
restart under load loses no request). WORKERS threads, each on its own keep-alive connection,
send a kiln fixture's inputs as an Open Inference Protocol v2 infer request (the binary tensor
extension, built by tritonclient[http] as v2_check.py sends it) again and again, and check every
answer against the fixture's golden outputs within atol + rtol * |golden|. Runs until STOP-FILE
exists or MAX-SECONDS have passed; then prints one JSON line and exits 0 whatever it saw (the
test asserts on the line).

    python rollout_client.py HOST:PORT MODEL FIXTURE.safetensors ATOL RTOL STOP-FILE MAX-SECONDS \
        [--workers 4] [--pause 0.05] [--progress FILE]

Each attempt is one of:

* ok: HTTP 200 whose outputs all match the golden ones (every answer is checked).
* wrong: HTTP 200 that parses but does not match: the model name, an output missing, its shape,
  or a value outside the tolerance (NaN included). Never allowed.
* refused: the server did not take the request, said so, and a retry is safe (the request is
  retried after a pause; see `refused` below for exactly which cases and why).
* failed: anything else: another status (a 503 without Retry-After included), a timeout once the
  request was written, a connection closed or reset after the request was written and before any
  byte of an answer, an answer cut short or that does not parse, a connect that times out or
  fails otherwise than refused.

The JSON line: the counts per class (`ok`, `wrong`, `refused`, `failed`), `attempts`, `refusedBy`
(per kind of refusal), `requests` (requests that ended: ok, wrong or failed), `retried`
(requests that needed a retry), `maxAttemptsOfOne`, `abandoned` (requests still being retried at
the stop), `longestGapMs` (the longest time between two successes, or from the last success to
the stop, over all workers) with `longestGapFromS` (when it began, seconds since the start),
`firstOkMs`, `seconds`, `stoppedBy`, and `examples`: the first few non-ok attempts of each class
(class, seconds since the start, worker, what happened). With --progress FILE, the counts per
class are rewritten there as JSON every half second (the test waits on them before it restarts
the Deployment).
"""
import argparse
import http.client
import json
import os
import select
import socket
import sys
import threading
import time

import numpy as np
import tritonclient.http as triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from v2_check import read_fixture  # noqa: E402  (the same reading of the fixture)

CONNECT_TIMEOUT = 3.0  # seconds for the TCP connect through the Service
ANSWER_TIMEOUT = 15.0  # seconds for the answer once the request is written (squeezenet: ms)
RETRY_AFTER_CAP = 1.0  # a Retry-After is honoured up to this many seconds
RETRY_PAUSE = 0.1  # seconds before retrying a refused connect or a connection closed early
GIVE_UP = 30.0  # a request refused for this long is failed
EXAMPLES = 4  # the first few non-ok attempts of each class are shown

OK, WRONG, REFUSED, FAILED = "ok", "wrong", "refused", "failed"


class Outcome:
    def __init__(self, kind, what="", refused_by=None, delay=0.0):
        self.kind, self.what, self.refused_by, self.delay = kind, what, refused_by, delay


def refused(refused_by, what, delay=RETRY_PAUSE):
    # What is retryable, exactly, and why each is safe to retry (the server ran nothing):
    #
    # * "retryAfter503": HTTP 503 carrying a Retry-After header. kiln-agent serve answers so when
    #   it drains after SIGTERM or its queue is full: it says it did not run the request and when
    #   to come back. Honoured up to RETRY_AFTER_CAP. A 503 without Retry-After (e.g. "the model
    #   is still loading", which a pod the Service routes to must never say) is failed.
    # * "connectionRefused": ECONNREFUSED on connect: nothing listened, not a byte was delivered.
    # * "closedBeforeWritten": the server's FIN or RST seen before our request was completely
    #   written, on any connection: a kept-alive connection found closed (FIN or RST already
    #   there, no byte of an answer) just before we write (the race every HTTP client retries:
    #   the server closed it while it was idle), or the write
    #   failing with EPIPE/ECONNRESET (and no answer readable after it). The server reads the whole
    #   body before it parses and runs an infer request, so a request it never fully received
    #   cannot have run.
    #
    # Not retryable, on purpose: a connection closed or reset after the request was completely
    # written and before any byte of an answer, even on a reused keep-alive connection. Such a
    # request may have been taken and then dropped, which is exactly what a drain must not do
    # (in-flight requests finish); counting it as refused would let a server that exits at once
    # on SIGTERM pass this test. It is failed.
    return Outcome(REFUSED, what, refused_by, delay)


def retry_after_seconds(value):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return RETRY_AFTER_CAP  # an HTTP-date or garbage: wait the cap
    return min(max(seconds, 0.05), RETRY_AFTER_CAP)


def peer_state(sock, timeout):
    """What the server sent on SOCK within TIMEOUT, without consuming it: "data" (an answer's
    first byte), "eof" (its FIN), "reset" (its RST), "quiet" (nothing yet) or "error: ..." (any
    other socket error, e.g. an ICMP error reported on the socket)."""
    if sock is None:
        return "eof"
    try:
        readable, _, _ = select.select([sock], [], [], timeout)
        if not readable:
            return "quiet"
        return "data" if sock.recv(1, socket.MSG_PEEK) else "eof"
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    except (TimeoutError, socket.timeout):
        return "quiet"
    except OSError as e:
        return f"error: {e}"


class Run:
    def __init__(self, args):
        self.args = args
        self.host, _, port = args.url.rpartition(":")
        self.port = int(port)
        self.path = f"/v2/models/{args.model}/infer"
        tensors = read_fixture(args.fixture)
        inputs, self.golden = [], {}
        for name, arr in sorted(tensors.items()):
            if name.startswith("input/"):
                i = triton.InferInput(name[len("input/"):], list(arr.shape),
                                      triton.np_to_triton_dtype(arr.dtype))
                i.set_data_from_numpy(arr)
                inputs.append(i)
            elif name.startswith("output/"):
                self.golden[name[len("output/"):]] = arr.astype(np.float64)
        if not inputs or not self.golden:
            raise ValueError(f"{args.fixture}: no input/ or no output/ tensors")
        # No outputs named: every output in binary, as tritonclient's infer() asks by default.
        self.body, json_size = triton.InferenceServerClient.generate_request_body(inputs)
        # The headers tritonclient's infer() sends (http.client adds Host and Content-Length).
        self.headers = {}
        if json_size is not None:
            self.headers["Inference-Header-Content-Length"] = str(json_size)
        self.lock = threading.Lock()
        self.counts = {OK: 0, WRONG: 0, REFUSED: 0, FAILED: 0}
        self.refused_by = {}
        self.requests = self.retried = self.max_attempts = self.abandoned = 0
        self.successes = []
        self.examples = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def record(self, worker, outcome):
        now = time.monotonic()
        with self.lock:
            self.counts[outcome.kind] += 1
            if outcome.kind == OK:
                self.successes.append(now)
            else:
                if outcome.refused_by:
                    self.refused_by[outcome.refused_by] = self.refused_by.get(outcome.refused_by, 0) + 1
                if sum(e["class"] == outcome.kind for e in self.examples) < EXAMPLES:
                    self.examples.append({"class": outcome.kind, "t": round(now - self.t0, 3),
                                          "worker": worker, "what": outcome.what[:300]})

    def judge(self, status, headers, body):
        if status == 503 and headers.get("Retry-After") is not None:
            return refused("retryAfter503", f"503 Retry-After {headers['Retry-After']}: {body[:120]!r}",
                           retry_after_seconds(headers["Retry-After"]))
        if status != 200:
            return Outcome(FAILED, f"HTTP {status}: {body[:200]!r}")
        try:
            length = headers.get("Inference-Header-Content-Length")
            result = triton.InferenceServerClient.parse_response_body(
                body, header_length=int(length) if length is not None else None,
                content_encoding=headers.get("Content-Encoding"))
            response = result.get_response()
            got = {name: result.as_numpy(name) for name in self.golden}
        except Exception as e:  # noqa: BLE001 (any way the answer fails to parse)
            return Outcome(FAILED, f"malformed answer: {type(e).__name__}: {e}")
        if response.get("model_name") != self.args.model:
            return Outcome(WRONG, f"model_name {response.get('model_name')!r}, asked {self.args.model!r}")
        for name, want in self.golden.items():
            g = got[name]
            if g is None or g.shape != want.shape:
                return Outcome(WRONG, f"output {name}: got {None if g is None else g.shape}, "
                                      f"golden {want.shape}")
            err = np.abs(g.astype(np.float64) - want)
            bad = ~(err <= self.args.atol + self.args.rtol * np.abs(want))  # NaN is outside
            if bad.any():
                nan = int(np.isnan(err).sum())
                worst = float(np.nanmax(err)) if nan < err.size else float("nan")
                return Outcome(WRONG, f"output {name}: {int(bad.sum())} values outside atol {self.args.atol} "
                                      f"rtol {self.args.rtol} ({nan} NaN), max |error| {worst:.3e}")
        return Outcome(OK)


class Worker(threading.Thread):
    def __init__(self, run, n):
        super().__init__(name=f"worker-{n}", daemon=True)
        self.run_, self.n, self.conn = run, n, None

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def attempt(self):
        run = self.run_
        reused = self.conn is not None and self.conn.sock is not None
        if reused:
            # A kept-alive connection the server has closed since its last answer: not written to.
            state = peer_state(self.conn.sock, 0)
            if state in ("eof", "reset"):
                self.close()
                return refused("closedBeforeWritten",
                               f"kept-alive connection found closed ({state}) before writing", delay=0.0)
            if state != "quiet":
                self.close()
                return Outcome(FAILED, f"kept-alive connection before writing: {state}"
                                       + (" (bytes nobody asked for)" if state == "data" else ""))
        else:
            self.close()
            self.conn = http.client.HTTPConnection(run.host, run.port, timeout=CONNECT_TIMEOUT)
            try:
                self.conn.connect()
            except ConnectionRefusedError:
                self.close()
                return refused("connectionRefused", "connection refused")
            except (TimeoutError, socket.timeout):
                self.close()
                return Outcome(FAILED, f"connect timed out after {CONNECT_TIMEOUT} s")
            except OSError as e:
                self.close()
                return Outcome(FAILED, f"connect: {e}")
            self.conn.sock.settimeout(ANSWER_TIMEOUT)
            try:
                self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass  # not TCP (a test's socket pair)
        kind = "reused" if reused else "new"
        written = True
        try:
            self.conn.request("POST", run.path, body=run.body, headers=run.headers)
        except (BrokenPipeError, ConnectionResetError) as e:
            written = False
            write_error = e
        except (TimeoutError, socket.timeout):
            self.close()
            return Outcome(FAILED, f"writing the request timed out ({kind} connection)")
        except OSError as e:
            self.close()
            return Outcome(FAILED, f"writing the request ({kind} connection): {e}")
        # Wait for the first byte of an answer without consuming it: whether one came decides the
        # class of a close or reset (see refused()).
        state = peer_state(self.conn.sock, ANSWER_TIMEOUT if written else 0.5)
        if state != "data":
            self.close()
            if not written:
                return refused("closedBeforeWritten", f"{kind} connection closed while writing "
                                                      f"({type(write_error).__name__}), no answer")
            if state == "quiet":
                return Outcome(FAILED, f"no answer within {ANSWER_TIMEOUT} s of the request "
                                       f"({kind} connection)")
            how = {"eof": "closed", "reset": "reset"}.get(state, state)
            return Outcome(FAILED, f"{kind} connection {how} after the request was written, before any "
                                   "byte of an answer")
        try:
            response = self.conn.getresponse()
            body = response.read()
            headers = {k.title(): v for k, v in response.getheaders()}
            status = response.status
            if response.will_close:
                self.close()
        except Exception as e:  # noqa: BLE001 (an answer begun and not finished, in any way)
            self.close()
            return Outcome(FAILED, f"answer cut short or unreadable ({kind} connection): "
                                   f"{type(e).__name__}: {e}")
        if not written:
            # The server answered before it had the whole request (an early refusal): its answer
            # decides; the connection is gone.
            self.close()
        return run.judge(status, headers, body)

    def run(self):
        run = self.run_
        while not run.stop.is_set():
            started, attempts = time.monotonic(), 0
            while True:
                attempts += 1
                try:
                    outcome = self.attempt()
                except Exception as e:  # noqa: BLE001 (a bug here must show, not hang the test)
                    self.close()
                    outcome = Outcome(FAILED, f"client error: {type(e).__name__}: {e}")
                if outcome.kind == REFUSED and time.monotonic() - started > GIVE_UP:
                    outcome = Outcome(FAILED, f"refused for {GIVE_UP} s, last: {outcome.what}")
                run.record(self.n, outcome)
                if outcome.kind != REFUSED:
                    break
                if run.stop.wait(outcome.delay):
                    with run.lock:
                        run.abandoned += 1
                        run.max_attempts = max(run.max_attempts, attempts)
                    self.close()
                    return
            with run.lock:
                run.requests += 1
                run.retried += attempts > 1
                run.max_attempts = max(run.max_attempts, attempts)
            if run.args.pause > 0 and run.stop.wait(run.args.pause):
                break
        self.close()


def write_progress(path, run):
    with run.lock:
        snapshot = dict(run.counts)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(snapshot, f)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="HOST:PORT of the Service")
    p.add_argument("model")
    p.add_argument("fixture")
    p.add_argument("atol", type=float)
    p.add_argument("rtol", type=float)
    p.add_argument("stop_file", help="runs until this file exists")
    p.add_argument("max_seconds", type=float, help="and at most this long")
    p.add_argument("--workers", type=int, default=4)
    # Between one worker's requests: 4 workers stay well under the 2-core CI machine's capacity,
    # so the rollout's own work (the new pod's start, the agent's check of it) is not starved.
    p.add_argument("--pause", type=float, default=0.05, help="seconds between one worker's requests")
    p.add_argument("--progress", help="rewrites the counts here every 0.5 s")
    args = p.parse_args()
    report = {OK: 0, WRONG: 0, REFUSED: 0, FAILED: 0}
    try:
        run = Run(args)
    except Exception as e:  # noqa: BLE001 (say it on the one line the test reads)
        report["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(report), flush=True)
        return
    workers = [Worker(run, n) for n in range(args.workers)]
    for w in workers:
        w.start()
    stopped_by, written = "max-seconds", 0.0
    while time.monotonic() - run.t0 < args.max_seconds:
        if os.path.exists(args.stop_file):
            stopped_by = "stop-file"
            break
        if args.progress and time.monotonic() - written >= 0.5:
            write_progress(args.progress, run)
            written = time.monotonic()
        if not any(w.is_alive() for w in workers):
            stopped_by = "workers ended"
            break
        time.sleep(0.1)
    run.stop.set()
    t_end = time.monotonic()
    for w in workers:
        w.join(ANSWER_TIMEOUT + CONNECT_TIMEOUT + 5)
    with run.lock:
        successes = sorted(s for s in run.successes if s <= t_end)
        marks = successes + [t_end]
        gap, gap_from = 0.0, None
        for a, b in zip(marks, marks[1:]):
            if b - a > gap:
                gap, gap_from = b - a, a
        report = dict(run.counts)
        report.update({
            "attempts": sum(run.counts.values()),
            "refusedBy": run.refused_by,
            "requests": run.requests,
            "retried": run.retried,
            "maxAttemptsOfOne": run.max_attempts,
            "abandoned": run.abandoned,
            "longestGapMs": round(gap * 1000, 1) if successes else None,
            "longestGapFromS": round(gap_from - run.t0, 3) if gap_from is not None else None,
            "firstOkMs": round((successes[0] - run.t0) * 1000, 1) if successes else None,
            "seconds": round(t_end - run.t0, 3),
            "workers": args.workers,
            "stoppedBy": stopped_by,
            "examples": run.examples,
        })
    if args.progress:
        write_progress(args.progress, run)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
