#!/usr/bin/env python3
"""Interference: decode TPOT of interactive streams while long prompts arrive,
disaggregated (1 prefill + 1 decode worker) against two colocated replicas.

Each mode starts its workers on 127.0.0.1 free ports, each pinned to its own
core (taskset, where there are two), plus `kvserve router` in front:

  pd          a `--role prefill` worker (core 0) and a `--role decode`
              worker (core 1)
  colocated   two `--role both` replicas (cores 0 and 1), router least-load
  pd-N,       the same with `--max-batch-tokens N` (on the prefill worker,
  colocated-N on both replicas): smaller prefill chunks, what one would
              tune first to protect interactive requests

Workload, the same in every mode, for --duration seconds: --streams
interactive clients, each streaming one short completion after another
(--stream-tokens tokens, ignore_eos), and one client sending a long prompt
(--prompt-words words, max_tokens 1, SLO class batch) again --long-gap
seconds after the previous one finished. TPOT samples are the gaps between a stream's
successive tokens as the client sees them (the first token is TTFT, kept
apart). Prints one Markdown row per mode.

  python3 bench/disagg_interference.py --model /tmp/kvs-peer-models/bench-1.1b-q4_0.gguf
"""
import argparse, http.client, json, os, shutil, statistics, subprocess, tempfile, threading, time

from disagg_transfer import free_port, start, text


ERRORS = []  # the first few error answers, printed at the end


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else float("nan")


def stream_once(port, prompt, n, gaps, ttfts, stop_at):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        body = r.read()
        c.close()
        if len(ERRORS) < 5:
            ERRORS.append(f"{r.status} {body[:200]!r}")
        time.sleep(min(5.0, float(r.getheader("Retry-After") or 0.5)))
        return False
    last = None
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: {"):
            continue
        now = time.perf_counter()
        if last is None:
            ttfts.append(now - t0)
        elif now < stop_at:
            gaps.append(now - last)
        last = now
    c.close()
    return True


def long_once(port, prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    # Document work: the batch class, so interactive requests go first where
    # they share a worker.
    c.request("POST", "/v1/completions",
              json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0, "slo_class": "batch"}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    if r.status != 200 and len(ERRORS) < 5:
        ERRORS.append(f"long prompt: {r.status} {body[:200]!r}")
    return r.status, time.perf_counter() - t0


def workload(port, a):
    gaps, ttfts, longs, errors = [], [], [], [0]
    t_end = time.perf_counter() + a.duration

    def interactive(i):
        k = 0
        while time.perf_counter() < t_end:
            ok = stream_once(port, f"Stream {i} turn {k}: " + text(12, 100 + i), a.stream_tokens, gaps, ttfts, t_end)
            errors[0] += not ok
            k += 1

    def long_prompts():
        k = 0
        while time.perf_counter() < t_end:
            st, secs = long_once(port, text(a.prompt_words, 7 + k))  # a new prompt each time: no prefix hit
            if st == 200:
                longs.append(secs)
            else:
                errors[0] += 1
                time.sleep(1)
            k += 1
            time.sleep(a.long_gap)

    th = [threading.Thread(target=interactive, args=(i,)) for i in range(a.streams)]
    th.append(threading.Thread(target=long_prompts))
    for t in th:
        t.start()
    for t in th:
        t.join()
    return gaps, ttfts, longs, errors[0]


def run_mode(mode, a, tmp, secret):
    pin = (lambda c: ["taskset", "-c", str(c)]) if os.cpu_count() >= 2 and shutil.which("taskset") else (lambda c: [])
    common = ["serve", "-m", a.model, "--port", "0", "--threads", "1", "--kv-type", a.kv_type, "--ctx", str(a.ctx),
              "--cache-secret-file", secret]
    procs = []
    try:
        extra = ["--max-batch-tokens", mode.split("-")[1]] if "-" in mode else []
        if mode.startswith("pd"):
            kv = free_port()
            dec, dport = start(pin(1) + [a.binary] + common + ["--role", "decode", "--kv-listen", f"127.0.0.1:{kv}"],
                               "listening on", os.path.join(tmp, "decode.log"))
            procs.append(dec)
            pre, pport = start(pin(0) + [a.binary] + common + extra +
                               ["--role", "prefill", "--decode-peer", f"127.0.0.1:{kv}"],
                               "listening on", os.path.join(tmp, "prefill.log"))
            procs.append(pre)
            workers = ["--prefill-worker", f"http://127.0.0.1:{pport}", "--decode-worker", f"http://127.0.0.1:{dport}"]
        else:
            workers = ["--policy", "least-load"]
            for core in (0, 1):
                p, port = start(pin(core) + [a.binary] + common + extra, "listening on",
                                os.path.join(tmp, f"replica{core}.log"))
                procs.append(p)
                workers += ["--worker", f"http://127.0.0.1:{port}"]
        rt, rport = start([a.binary, "router", "-m", a.model, "--port", "0", "--cluster-secret", secret] + workers,
                          "listening on", os.path.join(tmp, "router.log"))
        procs.append(rt)
        stream_once(rport, "warm up", 4, [], [], 0)
        return workload(rport, a)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--binary", default="build/kvserve")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--modes", default="pd,pd-128,colocated,colocated-128")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--stream-tokens", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=1700, help="words per long prompt (about 1.2 tokens each)")
    ap.add_argument("--long-gap", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=150)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvs-interf-")
    secret = os.path.join(tmp, "pd.secret")
    with open(secret, "w") as f:
        f.write("0123456789abcdef0123456789abcdef")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{os.path.basename(a.model)}, kv {a.kv_type}, {a.streams} streams x {a.stream_tokens} tokens, "
          f"long prompts of {a.prompt_words} words every {a.long_gap} s after the last, {a.duration:.0f} s per mode; "
          f"CPU {cpu}\n")
    print("| mode | TPOT p50 (ms) | TPOT p90 (ms) | TPOT p99 (ms) | TPOT max (ms) | stream tokens | TTFT p50 (ms) "
          "| long prompts done | long prompt latency p50 (s) | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    try:
        for mode in a.modes.split(","):
            gaps, ttfts, longs, errors = run_mode(mode, a, tmp, secret)
            med = statistics.median(longs) if longs else float("nan")
            print(f"| {mode} | {pct(gaps, 50):.1f} | {pct(gaps, 90):.1f} | {pct(gaps, 99):.1f} | {pct(gaps, 100):.1f} "
                  f"| {len(gaps)} | {pct(ttfts, 50):.1f} | {len(longs)} | {med:.1f} | {errors} |", flush=True)
        for e in ERRORS:
            print("error:", e)
    finally:
        if not os.environ.get("KVS_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("logs in", tmp)


if __name__ == "__main__":
    main()
