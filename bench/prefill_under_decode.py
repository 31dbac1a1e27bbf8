#!/usr/bin/env python3
"""A long prompt arriving while streams decode: its time to first token, and
what it costs the streams' TPOT, per prefill chunk budget.

For each --budgets value B, starts `kvserve serve --max-batch-tokens B` on a
free 127.0.0.1 port and runs two phases with --streams clients, each
streaming one completion after another (short prompt, --stream-tokens
tokens, ignore_eos, temperature 0):

  solo    the streams alone for --solo-seconds: their TPOT (the gaps between
          a stream's successive tokens as the client sees them)
  loaded  the same streams; after --warmup seconds one client sends a prompt
          of exactly --prompt-tokens tokens (sized with the server's
          /tokenize) with max_tokens 1, --long-prompts times in a row.
          TTFT of each long prompt; the streams' TPOT gaps that overlap a
          long prompt's prefill (from its send to its first token)

Prints one Markdown row per budget: TTFT of the long prompt (each run), the
streams' TPOT p50 / p99 solo and under the prefill, and p99 loaded / solo.
The issue's goal: TTFT <= 3 s for 2,000 tokens with 8 streams, and the
streams' TPOT p99 <= 2x solo.

  python3 bench/prefill_under_decode.py --model /tmp/bench-1.1b-q8_0.gguf --budgets 128,256,512
"""
import argparse, http.client, json, os, statistics, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from disagg_transfer import free_port, start, text  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else float("nan")


def post(port, path, body, timeout=900):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {data[:300]!r}")
    return json.loads(data)


def sized_prompt(port, n_tokens, seed):
    """Words from the bench text, cut so the prompt is exactly n_tokens tokens
    (each seed starts differently: no prefix-cache hit between them)."""
    words = n_tokens
    while True:
        t = f"Document {seed}. " + text(words, seed)
        ids = post(port, "/tokenize", {"content": t})["tokens"]
        if len(ids) >= n_tokens:
            break
        words = words * 3 // 2
    return post(port, "/detokenize", {"tokens": ids[:n_tokens]})["content"]


def stream(port, prompt, n, stamps, stop):
    """One client: completions back to back until stop is set; token arrival
    times appended to stamps (one list per completion)."""
    while not stop.is_set():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True}
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        times = []
        stamps.append(times)  # filled as tokens arrive: a phase may end mid-completion
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
        c.close()


def gaps(stamps, lo=None, hi=None):
    out = []
    for times in list(stamps):
        for a, b in zip(times, times[1:]):
            if lo is None or (b > lo and a < hi):
                out.append(b - a)
    return out


def run_budget(args, budget):
    log = os.path.join(tempfile.gettempdir(), f"kvs-pud-{budget}.log")
    cmd = [args.kvserve, "serve", "-m", args.model, "--port", str(free_port()), "-t", str(args.threads),
           "--ctx", str(args.ctx), "--max-seqs", str(args.streams + 2), "--max-batch-tokens", str(budget),
           "--prefill-precision", args.precision]
    proc, port = start(cmd, "listening on", log)
    try:
        long_prompts = [sized_prompt(port, args.prompt_tokens, 3 + i) for i in range(args.long_prompts)]
        stamps, stop = [], threading.Event()
        clients = [threading.Thread(target=stream, args=(port, text(12, 100 + i), args.stream_tokens, stamps, stop))
                   for i in range(args.streams)]
        for t in clients:
            t.start()
        time.sleep(args.warmup)
        t0 = time.perf_counter()
        time.sleep(args.solo_seconds)
        solo = gaps(stamps, t0, time.perf_counter())
        ttfts, windows = [], []
        for i in range(args.long_prompts):
            s = time.perf_counter()
            post(port, "/v1/completions", {"prompt": long_prompts[i], "max_tokens": 1, "temperature": 0})
            e = time.perf_counter()
            ttfts.append(e - s)
            windows.append((s, e))
            time.sleep(args.gap)
        stop.set()
        for t in clients:
            t.join()
        loaded = [g for lo, hi in windows for g in gaps(stamps, lo, hi)]
        return ttfts, solo, loaded
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kvserve", default="build/kvserve")
    ap.add_argument("--budgets", default="128,256,512", help="--max-batch-tokens values, comma-separated")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--stream-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--long-prompts", type=int, default=2)
    ap.add_argument("--gap", type=float, default=2.0, help="seconds between long prompts")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--solo-seconds", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="the server's --prefill-precision (bf16 needs AMX-BF16)")
    a = ap.parse_args()
    print(f"{a.streams} streams, a {a.prompt_tokens}-token prompt x {a.long_prompts}, {a.threads} threads, "
          f"{os.path.basename(a.model)}")
    print("| --max-batch-tokens | long prompt TTFT s | TPOT solo p50 / p99 ms | TPOT under prefill p50 / p99 ms | p99 ratio |")
    print("|---|---|---|---|---|")
    for b in [int(x) for x in a.budgets.split(",")]:
        ttfts, solo, loaded = run_budget(a, b)
        ratio = pct(loaded, 99) / pct(solo, 99) if solo and loaded else float("nan")
        print(f"| {b} | {', '.join(f'{t:.2f}' for t in ttfts)} | {pct(solo, 50):.1f} / {pct(solo, 99):.1f} | "
              f"{pct(loaded, 50):.1f} / {pct(loaded, 99):.1f} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
