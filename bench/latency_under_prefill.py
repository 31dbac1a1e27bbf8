#!/usr/bin/env python3
"""Latency of GET /metrics and of a 429 while a long prefill runs.

Against a running `kvserve serve` started with `--max-seqs 1 --max-queue 0`
(so that any second request is turned away at once with 429 queue_full):
one thread sends a completion with a long prompt (--prompt-words words,
max_tokens 1), while this process polls /metrics every --interval seconds and
sends a short completion every --interval seconds, timing each answer. Prints
one JSON line: p50/p99/max in ms for both, and how many 429s were seen.

  kvserve serve -m MODEL --port 8080 --max-seqs 1 --max-queue 0 &
  python3 bench/latency_under_prefill.py --url http://127.0.0.1:8080
"""
import argparse, http.client, json, threading, time, urllib.parse


def request(u, method, path, body=None):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    hdr = {"Content-Type": "application/json"} if body is not None else {}
    t0 = time.perf_counter()
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=hdr)
    r = c.getresponse()
    r.read()
    dt = time.perf_counter() - t0
    c.close()
    return r.status, dt


def pct(xs, p):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000, 2) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--prompt-words", type=int, default=1500)
    ap.add_argument("--interval", type=float, default=0.02)
    ap.add_argument("--max-polls", type=int, default=5000)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    words = ("the cat sat on a mat and looked at the big red ball near the old tree ").split()
    prompt = " ".join(words[i % len(words)] for i in range(a.prompt_words))
    done = threading.Event()
    long_result = {}

    def long_prefill():
        t0 = time.perf_counter()
        st, _ = request(u, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
        long_result.update(status=st, seconds=round(time.perf_counter() - t0, 3))
        done.set()

    th = threading.Thread(target=long_prefill)
    th.start()
    time.sleep(0.2)  # let the prefill start
    metrics, rejects, statuses = [], [], {}
    polls = 0
    while not done.is_set() and polls < a.max_polls:
        _, dt = request(u, "GET", "/metrics")
        metrics.append(dt)
        st, dt = request(u, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 1})
        statuses[st] = statuses.get(st, 0) + 1
        if st == 429:
            rejects.append(dt)
        polls += 1
        time.sleep(a.interval)
    th.join()
    print(json.dumps({
        "long_request": long_result, "polls": polls,
        "metrics_ms_p50": pct(metrics, 50), "metrics_ms_p99": pct(metrics, 99), "metrics_ms_max": pct(metrics, 100),
        "reject429_ms_p50": pct(rejects, 50), "reject429_ms_p99": pct(rejects, 99), "reject429_ms_max": pct(rejects, 100),
        "statuses": statuses,
    }))


if __name__ == "__main__":
    main()
