"""Sends a kiln language-model fixture's first sample to llama.cpp's llama-server as a client
would (POST /completion with the prompt's token ids, greedy: temperature 0) and compares the
continuation with the fixture's golden greedy tokens, the first K exactly. Reads the safetensors
fixture itself (8-byte header length, JSON header, little-endian data); standard library only.
Prints one JSON line: the tokens compared, whether they match, and the request's latency in
seconds; exit status 1 when they differ.

    python3 llama_check.py HOST:PORT FIXTURE.safetensors K
"""
import json
import struct
import sys
import time
import urllib.request


def read_i32(path, names):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name in names:
        t = header[name]
        if t["dtype"] != "I32":
            sys.exit(f"{name} is {t['dtype']}, not I32")
        start, end = t["data_offsets"]
        data = raw[8 + n + start:8 + n + end]
        out[name] = list(struct.unpack(f"<{len(data) // 4}i", data))
    return out


def main():
    host, fixture, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = read_i32(fixture, ["input/prompt", "input/generate", "output/tokens"])
    body = json.dumps({"prompt": t["input/prompt"], "n_predict": t["input/generate"][0],
                       "temperature": 0, "cache_prompt": False, "return_tokens": True}).encode()
    request = urllib.request.Request(f"http://{host}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as r:
        answer = json.load(r)
    seconds = time.perf_counter() - started
    got, want = answer["tokens"][:k], t["output/tokens"][:k]
    print(json.dumps({"compared": len(want), "match": got == want, "got": got, "want": want,
                      "text": answer.get("content", ""), "seconds": seconds}))
    sys.exit(0 if got == want else 1)


if __name__ == "__main__":
    main()
