#!/usr/bin/env python3
"""Transfer cost of disaggregated serving, measured on one P/D pair.

Starts a decode worker, a prefill worker (each pinned to its own core with
taskset when the machine has two) and a router pairing them, all on free
loopback ports, sends --prompts long prompts through the router, then a
second request sharing the first prompt's prefix, and prints from the
workers' /metrics: bytes moved per prompt token (to compare with
2 x layers x kv_heads x head_dim x bytes per element, `kvserve plan`),
transfer seconds per prompt next to the prefill's time to first token, and
the blocks skipped because the decode side already had them.

With --decode-load N, N other requests (short prompts, --load-tokens each)
are sent through the router first and keep the decode worker's engine
thread busy decoding while the measured prompts arrive: a transfer's
reservation then waits for a step boundary, which is what transfer_s shows
next to an idle decode worker's.

  python3 bench/disagg_transfer.py --model /tmp/bench-1.1b-q8_0.gguf --binary build/kvserve
  python3 bench/disagg_transfer.py --model /tmp/bench-1.1b-q8_0.gguf --decode-load 4 --prompts 4
"""
import argparse, http.client, json, os, re, shutil, socket, subprocess, tempfile, threading, time

WORDS = "the small fox found a red ball under the old oak tree and ran to show it to the owl by the river".split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def text(n, seed):
    return " ".join(WORDS[(i * 5 + seed * 11 + i // 7) % len(WORDS)] for i in range(n))


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    c.close()
    return out


def start(args, ready, log):
    f = open(log, "w")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=f, text=True)
    t0 = time.time()
    while time.time() - t0 < 300:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("exited: " + open(log).read()[-1500:])
        if ready in line:
            m = re.search(r"listening on http://[0-9.]+:(\d+)", line)
            return p, int(m.group(1)) if m else None
    raise RuntimeError("not ready: " + log)


def complete(port, prompt, max_tokens=8):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    body = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {body}")
    return time.perf_counter() - t0, body


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--binary", default="build/kvserve")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--ctx", type=int, default=2560)
    ap.add_argument("--prompt-words", type=int, default=1500)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--decode-load", type=int, default=0, help="requests decoding on the decode worker meanwhile")
    ap.add_argument("--load-tokens", type=int, default=400, help="tokens each load request generates")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvs-pd-")
    secret = os.path.join(tmp, "pd.secret")
    with open(secret, "w") as f:
        f.write("0123456789abcdef0123456789abcdef")
    pin = (lambda c: ["taskset", "-c", str(c)]) if os.cpu_count() >= 2 and shutil.which("taskset") else (lambda c: [])
    kv_port = free_port()
    common = ["serve", "-m", a.model, "--port", "0", "--threads", "1", "--kv-type", a.kv_type, "--ctx", str(a.ctx),
              "--cache-secret-file", secret, "--max-request-share", "1"]
    procs = []
    try:
        dec, dport = start(pin(1) + [a.binary] + common + ["--role", "decode", "--kv-listen", f"127.0.0.1:{kv_port}"],
                           "listening on", os.path.join(tmp, "decode.log"))
        procs.append(dec)
        pre, pport = start(pin(0) + [a.binary] + common + ["--role", "prefill", "--decode-peer", f"127.0.0.1:{kv_port}"],
                           "listening on", os.path.join(tmp, "prefill.log"))
        procs.append(pre)
        rt, rport = start([a.binary, "router", "-m", a.model, "--port", "0", "--cluster-secret", secret,
                           "--prefill-worker", f"http://127.0.0.1:{pport}", "--decode-worker", f"http://127.0.0.1:{dport}"],
                          "listening on", os.path.join(tmp, "router.log"))
        procs.append(rt)
        def background(k):
            try:
                complete(rport, text(40, 100 + k), a.load_tokens)
            except (OSError, http.client.HTTPException, RuntimeError):
                pass  # cut short when the workers stop at the end

        load = [threading.Thread(target=background, args=(k,), daemon=True) for k in range(a.decode_load)]
        for t in load:
            t.start()
        if load:
            deadline = time.time() + 120  # until every load request decodes on the decode worker
            while time.time() < deadline and metrics(dport).get("kvserve_running_requests", 0) < a.decode_load:
                time.sleep(0.1)
        rows = []
        for i in range(a.prompts):
            prompt = text(a.prompt_words, i)
            before = metrics(pport)
            secs, body = complete(rport, prompt)
            after = metrics(pport)
            d = lambda k: after.get(k, 0) - before.get(k, 0)
            P = body["usage"]["prompt_tokens"]
            rows.append({"prompt_tokens": P, "request_s": round(secs, 3),
                         "decode_running": metrics(dport).get("kvserve_running_requests", 0),
                         "bytes": d('kvserve_kv_transfer_bytes_total{role="prefill"}'),
                         "bytes_per_prompt_token": round(d('kvserve_kv_transfer_bytes_total{role="prefill"}') / P, 1),
                         "blocks": d('kvserve_kv_transfer_blocks_total{role="prefill"}'),
                         "transfer_s": round(d('kvserve_kv_transfer_seconds_total{role="prefill"}'), 4)})
            print(json.dumps(rows[-1]), flush=True)
        # Same prefix, new question: the decode side has the prefix blocks already.
        before = metrics(pport)
        complete(rport, text(a.prompt_words, 0) + " and then what happened next")
        after = metrics(pport)
        skipped = after.get('kvserve_kv_transfer_skipped_blocks_total{role="prefill"}', 0) - before.get(
            'kvserve_kv_transfer_skipped_blocks_total{role="prefill"}', 0)
        sent = after.get('kvserve_kv_transfer_blocks_total{role="prefill"}', 0) - before.get(
            'kvserve_kv_transfer_blocks_total{role="prefill"}', 0)
        print(json.dumps({"shared_prefix": {"blocks_sent": sent, "blocks_skipped": skipped},
                          "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
                          "load": os.getloadavg()[0]}))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        if not os.environ.get("KVS_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("logs in", tmp)


if __name__ == "__main__":
    main()
