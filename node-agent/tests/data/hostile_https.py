#!/usr/bin/env python3
"""A hostile HTTPS server for kiln-agent's fetch tests (standard library only).

Usage: hostile_https.py CERT KEY PORT ROOT

  /redirect-http/NAME   302 to http://127.0.0.1:PORT/NAME (a downgrade)
  /loop/N               302 to /loop/N+1, forever
  /hop/N/NAME           302 to /hop/N-1/NAME, then serves ROOT/NAME at /hop/0/NAME
  /stall                headers and 16 bytes of a 1000-byte body, then silence
  /zero                 zeros without a length until the client goes away
  /huge-length          claims a 1 PB body, sends 16 bytes, then silence
  /short                claims a 1000-byte body, sends 16 bytes, then closes the connection
  /drip                 a byte every 0.2 s without a length, forever (never silent for long)
  /status/N             answers status N with an empty body
  /NAME                 ROOT/NAME
"""
import http.server
import os
import ssl
import sys
import time

CERT, KEY, PORT, ROOT = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def redirect(self, location):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def stall(self, length):
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.write(b"\0" * 16)
        self.wfile.flush()
        time.sleep(3600)

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        try:
            if parts[0] == "redirect-http":
                self.redirect(f"http://127.0.0.1:{PORT}/{'/'.join(parts[1:])}")
            elif parts[0] == "loop":
                self.redirect(f"/loop/{int(parts[1]) + 1}")
            elif parts[0] == "hop" and int(parts[1]) > 0:
                self.redirect(f"/hop/{int(parts[1]) - 1}/{'/'.join(parts[2:])}")
            elif parts[0] == "stall":
                self.stall(1000)
            elif parts[0] == "huge-length":
                self.stall(1 << 50)
            elif parts[0] == "short":
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b"\0" * 16)
                self.wfile.flush()
                self.close_connection = True
            elif parts[0] == "drip":
                self.send_response(200)
                self.end_headers()
                while True:
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif parts[0] == "status":
                self.send_response(int(parts[1]))
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif parts[0] == "zero":
                self.send_response(200)
                self.end_headers()
                chunk = b"\0" * (1 << 16)
                while True:
                    self.wfile.write(chunk)
            else:
                name = parts[-1]
                with open(os.path.join(ROOT, name), "rb") as f:
                    body = f.read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        except FileNotFoundError:
            self.send_error(404)


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
server.daemon_threads = True
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(CERT, KEY)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
