#!/usr/bin/env python3
"""Time to first token of one long shared prefix served four ways, and the
cost of write-behind on decode.

Starts everything itself on free loopback ports: a redis-server (no
persistence), replica A (`--kv-disk` + `--kv-redis`) and replica B (`--kv-redis`
only), both with the same master key, and a small KV pool so that another
long prompt evicts the prefix from RAM. Per round, with a fresh prefix P of
--prefix-words words and a short question Q:

  cold   A, P+Q: nothing cached anywhere (full prefill)
  ram    A, P+Q again: the prefix is in A's RAM pool
  disk   A, P+Q after another long prompt evicted P from RAM: loaded from disk
  redis  B, P+Q: B never saw P; loaded from what A wrote to Redis

and checks that the four completions are identical (temperature 0).

Write-behind: --streams streams each decode --decode-tokens tokens (each new
full block is written behind) on a server with the disk tier and on one
without, alternately, --rounds times; prints TPOT p50/p99 of both.

  python3 bench/kv_tiers.py --model /tmp/bench-1.1b-q8_0.gguf --binary build/kvserve
"""
import argparse, http.client, json, os, re, shutil, socket, statistics, subprocess, tempfile, threading, time

WORDS = ("once upon a time a small fox found a red ball under the old oak tree and ran to show it to "
         "his friend the owl who lived by the river near the quiet village where children played ").split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def text(n, seed):
    return " ".join(WORDS[(i * 7 + seed * 13 + (i // 5) * seed) % len(WORDS)] for i in range(n))


def stream(port, prompt, max_tokens, timeout=600):
    """Returns (ttft s, tpot list s, text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]}")
    times, out = [], []
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("choices"):
            times.append(time.perf_counter())
            out.append(ev["choices"][0].get("text", ""))
    c.close()
    tpot = [b - a for a, b in zip(times, times[1:])]
    return times[0] - t0, tpot, "".join(out)


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return -1.0


class Proc:
    def __init__(self, args, ready, log):
        self.log = open(log, "w")
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        t0 = time.time()
        self.lines = []
        while time.time() - t0 < 300:
            line = self.p.stdout.readline()
            if not line:
                self.log.flush()
                raise RuntimeError(f"{args[0]} exited: " + open(log).read()[-2000:])
            self.lines.append(line)
            if ready in line:
                break
        m = re.search(r"listening on http://[0-9.]+:(\d+)", "".join(self.lines))
        self.port = int(m.group(1)) if m else None

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()


def serve(a, tmp, name, extra):
    args = [a.binary, "serve", "-m", a.model, "--port", "0", "--threads", str(a.threads), "--kv-type", a.kv_type,
            "--kv-memory", a.kv_memory, "--max-request-share", "1"] + (["--ctx", str(a.ctx)] if a.ctx else []) + [ "--kv-key-file", os.path.join(tmp, "master.key")]
    return Proc(args + extra, "kv tiers" if any(e.startswith("--kv-disk") or e.startswith("--kv-redis") for e in extra)
                else "listening on", os.path.join(tmp, name + ".log"))


def ttft_table(a, tmp, redis_url):
    A = serve(a, tmp, "A", ["--kv-disk", os.path.join(tmp, "disk"), "--kv-redis", redis_url])
    B = serve(a, tmp, "B", ["--kv-redis", redis_url])
    rows = []
    try:
        for r in range(a.rounds):
            P = text(a.prefix_words, 100 + r)
            Q = " question: " + text(a.question_words, 900 + r)
            res = {}
            res["cold"] = stream(A.port, P + Q, a.answer_tokens)
            res["ram"] = stream(A.port, P + Q, a.answer_tokens)
            # Let write-behind finish, then evict P from A's RAM with another long prompt.
            time.sleep(1.0)
            for e in range(2):
                stream(A.port, text(a.prefix_words, 500 + 10 * r + e), 1)
            d0 = metric(A.port, 'kvserve_kv_tier_hits_total{tier="disk"}')
            res["disk"] = stream(A.port, P + Q, a.answer_tokens)
            d1 = metric(A.port, 'kvserve_kv_tier_hits_total{tier="disk"}')
            r0 = metric(B.port, 'kvserve_kv_tier_hits_total{tier="redis"}')
            res["redis"] = stream(B.port, P + Q, a.answer_tokens)
            r1 = metric(B.port, 'kvserve_kv_tier_hits_total{tier="redis"}')
            same = len({v[2] for v in res.values()}) == 1
            # Blocks each tier row really loaded (0 would mean RAM still held P: pool too big).
            rows.append({k: round(v[0] * 1000, 1) for k, v in res.items()} |
                        {"identical": same, "disk_blocks": d1 - d0, "redis_blocks": r1 - r0})
            print(json.dumps(rows[-1]), flush=True)
        hits = {"disk": metric(A.port, 'kvserve_kv_tier_hits_total{tier="disk"}'),
                "redis": metric(B.port, 'kvserve_kv_tier_hits_total{tier="redis"}')}
    finally:
        A.stop()
        B.stop()
    return rows, hits


def tpot_run(a, tmp, with_tier, r):
    extra = ["--kv-disk", os.path.join(tmp, f"wb-{r}")] if with_tier else []
    s = serve(a, tmp, f"wb-{'on' if with_tier else 'off'}-{r}", extra + ["--max-seqs", str(a.streams)])
    out = []
    try:
        def one(i):
            _, tpot, _ = stream(s.port, text(40, 300 + i + 10 * r), a.decode_tokens)
            out.extend(tpot)
        ths = [threading.Thread(target=one, args=(i,)) for i in range(a.streams)]
        [t.start() for t in ths]
        [t.join() for t in ths]
        stores = metric(s.port, 'kvserve_kv_tier_stores_total{tier="disk"}') if with_tier else 0
    finally:
        s.stop()
    return out, stores


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--binary", default="build/kvserve")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--kv-memory", default="100MiB")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=0, help="context per request (0: the model's)")
    ap.add_argument("--prefix-words", type=int, default=1500)
    ap.add_argument("--question-words", type=int, default=15)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-tpot", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvs-tier-bench-")
    os.chmod(tmp, 0o700)
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    result = {"cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")}
    try:
        if not a.skip_ttft:
            rows, hits = ttft_table(a, tmp, f"redis://127.0.0.1:{redis_port}")
            med = {k: statistics.median(r[k] for r in rows) for k in ("cold", "ram", "disk", "redis")}
            result["ttft_ms_median"] = med
            result["speedup_vs_cold"] = {k: round(med["cold"] / med[k], 1) for k in ("ram", "disk", "redis")}
            result["identical_all_rounds"] = all(r["identical"] for r in rows)
            result["tier_hits"] = hits
        if not a.skip_tpot:
            on, off = [], []
            stores = 0
            for r in range(a.rounds):
                x, _ = tpot_run(a, tmp, False, r)
                off += x
                y, st = tpot_run(a, tmp, True, r)
                on += y
                stores += st
            result["tpot_ms"] = {"off": {"p50": round(pct(off, 50), 2), "p99": round(pct(off, 99), 2)},
                                 "on": {"p50": round(pct(on, 50), 2), "p99": round(pct(on, 99), 2)},
                                 "blocks_written": stores}
            result["tpot_p50_cost"] = round(pct(on, 50) / pct(off, 50) - 1, 4)
    finally:
        redis.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
