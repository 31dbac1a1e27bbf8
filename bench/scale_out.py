#!/usr/bin/env python3
"""Figures for docs/SCALE-OUT.md: kvserve router over local workers.

Starts `kvserve serve` workers and `kvserve router` on free loopback ports and
runs the issue's workload: P distinct system prompts (~300 tokens) x Q
questions each, streamed, closed loop at concurrency C. Per run it prints one
JSON line: prefix hit rate (cached / prompt tokens, from each stream's usage),
TTFT p50/p99, output tok/s, status counts.

  python3 bench/scale_out.py --binary build/kvserve --model ../shared/models/stories260K/stories260K.gguf

Phases: one worker alone; 2 workers behind the router with --policy cache and
with round-robin; kill -9 of one worker mid-run and its restart; router
overhead (TTFT of one worker direct vs behind the router). Standard library
only.
"""
import argparse, json, os, random, re, signal, socket, statistics, subprocess, tempfile, threading, time

WORDS = ("the cat dog sun tree house river small big happy sad run jump play red blue green park ball friend "
         "mom dad little girl boy bird fish cake rain star moon day night box stone sea kite block bread duck").split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


STARTED = []  # every process started, stopped at exit whatever happened


class Proc:
    def __init__(self, args, ready):
        self.args = args
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        STARTED.append(self)
        t0 = time.time()
        self.line = ""
        while time.time() - t0 < 60:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"{args[1]} exited before ready")
            self.line += line
            if re.search(ready, line):
                return
        raise RuntimeError("not ready")

    def port(self):
        return int(re.search(r"listening on http://[0-9.]+:([0-9]+)", self.line).group(1))

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            self.p.wait(30)


def worker(a, secret, port):
    ev, rp = free_port(), free_port()
    p = Proc([a.binary, "serve", "-m", a.model, "--port", str(port), "--threads", str(a.threads),
              "--cache-secret-file", secret, "--kv-events", f"tcp://127.0.0.1:{ev}",
              "--kv-events-replay", f"tcp://127.0.0.1:{rp}"], "kv events on")
    return p, f"http://127.0.0.1:{port},tcp://127.0.0.1:{ev},tcp://127.0.0.1:{rp}"


def router(a, secret, specs, policy):
    args = [a.binary, "router", "-m", a.model, "--port", "0", "--cluster-secret", secret, "--policy", policy,
            "--health-interval", "0.2"] + (["--load-weight", str(a.load_weight)] if a.load_weight is not None else [])
    for s in specs:
        args += ["--worker", s]
    return Proc(args, "router: listening on")


def workload(a, seed=1):
    rng = random.Random(seed)
    systems = [" ".join(rng.choice(WORDS) for _ in range(a.system_words)) for _ in range(a.prompts)]
    reqs = []
    for q in range(a.questions):
        for p in range(a.prompts):
            reqs.append(systems[p] + f"\nQuestion {q}: " + " ".join(rng.choice(WORDS) for _ in range(12)))
    # Arrival order mixed: in prompt order, round robin over an even number
    # of workers would keep each prompt on one worker by accident.
    rng.shuffle(reqs)
    return reqs


def one(port, prompt, max_tokens, timeout=60):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    rec = {"status": None, "ttft": None, "tokens": 0, "prompt": 0, "cached": 0, "error": None}
    t0 = time.perf_counter()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        buf = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            if rec["ttft"] is None and b"data: {" in buf + d and b'"text"' in buf + d:
                rec["ttft"] = time.perf_counter() - t0
            buf += d
        s.close()
        rec["status"] = int(buf[9:12])
        text = buf.decode(errors="replace")
        for m in re.finditer(r"data: (\{.*?\})\r?\n", text):
            j = json.loads(m.group(1))
            if "error" in j:
                rec["error"] = j["error"].get("code")
            for c in j.get("choices", []):
                rec["tokens"] += 1 if c.get("text") is not None else 0
            u = j.get("usage")
            if u:
                rec["prompt"] = u["prompt_tokens"]
                rec["cached"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if rec["status"] == 200 and "data: [DONE]" not in text:
            rec["error"] = "no [DONE]"
    except Exception as e:  # noqa: BLE001 - counted as a failure
        rec["error"] = type(e).__name__
    rec["e2e"] = time.perf_counter() - t0
    return rec


def run(port, prompts, a, on_progress=None, concurrency=None, until=None):
    """Sends `prompts` in order (cycling while `until` is given and false)."""
    out, lock = [], threading.Lock()
    it = iter(list(enumerate(prompts))) if until is None else ((i, prompts[i % len(prompts)]) for i in range(10**9))

    def loop():
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None or (until is not None and until()):
                return
            r = one(port, nxt[1], a.max_tokens)
            with lock:
                out.append(r)
                if on_progress:
                    on_progress(len(out))

    t0 = time.perf_counter()
    ts = [threading.Thread(target=loop) for _ in range(concurrency or a.concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in out if r["ttft"] is not None)
    q = lambda p: round(1000 * ttft[min(len(ttft) - 1, int(p * len(ttft)))], 2) if ttft else None
    codes = {}
    for r in out:
        k = str(r["status"]) + ("+" + r["error"] if r["error"] else "")
        codes[k] = codes.get(k, 0) + 1
    prompt = sum(r["prompt"] for r in out)
    return {"requests": len(out), "status": codes, "hit_rate": round(sum(r["cached"] for r in out) / prompt, 3)
            if prompt else None, "ttft_ms_p50": q(0.5), "ttft_ms_p99": q(0.99),
            "output_tok_per_s": round(sum(r["tokens"] for r in out) / wall, 1), "wall_s": round(wall, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/kvserve")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--system-words", type=int, default=115)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--load-weight", type=float, default=None, help="the router's --load-weight (default: its own)")
    a = ap.parse_args()
    secret = os.path.join(tempfile.mkdtemp(), "secret")
    open(secret, "wb").write(os.urandom(32))
    reqs = workload(a)

    def line(name, d):
        print(json.dumps({"run": name, **d}), flush=True)

    w, _ = worker(a, secret, free_port())
    line("one worker alone", run(w.port(), reqs, a))
    w.stop()
    for policy in ("cache", "round-robin"):
        ws = [worker(a, secret, free_port()) for _ in range(2)]
        r = router(a, secret, [s for _, s in ws], policy)
        line(f"2 workers, router --policy {policy}", run(r.port(), reqs, a))
        r.stop()
        for p, _ in ws:
            p.stop()

    # kill -9 one worker after a third of the requests, restart it 2 s later.
    ports = [free_port(), free_port()]
    ws = [worker(a, secret, p) for p in ports]
    r = router(a, secret, [s for _, s in ws], "cache")
    state = {"killed": False}
    def progress(n):
        if n == len(reqs) // 2 and not state["killed"]:
            state["killed"] = True
            ws[1][0].stop(signal.SIGKILL)
            threading.Thread(target=restart).start()
    def restart():
        time.sleep(2)
        ev = ws[1][1].split(",")
        args = [a.binary, "serve", "-m", a.model, "--port", str(ports[1]), "--threads", str(a.threads),
                "--cache-secret-file", secret, "--kv-events", ev[1], "--kv-events-replay", ev[2]]
        url = ev[0]
        ready = time.time()
        state["w1"] = Proc(args, "kv events on")
        ready = time.time()
        key = f'kvserve_router_requests_total{{worker="{url}",status="200"}} '
        up_key = f'kvserve_router_worker_up{{worker="{url}"}} 1'
        def routed():
            text = urlget(r.port(), "/metrics")
            if "up_s" not in state and up_key in text:
                state["up_s"] = round(time.time() - ready, 2)
            m = [l for l in text.splitlines() if l.startswith(key)]
            return float(m[0].split()[-1]) if m else 0
        before = routed()
        while time.time() - ready < 30:
            if routed() > before:
                state["back_s"] = round(time.time() - ready, 2)
                return
            time.sleep(0.05)
        state["gave_up"] = True
    res = run(r.port(), reqs, a, progress, until=lambda: "back_s" in state or state.get("gave_up"))
    res["hangs"] = sum(1 for v in res["status"] if "timeout" in v)
    res["restarted_worker_up_after_s"] = state.get("up_s")
    res["restarted_worker_takes_traffic_after_s"] = state.get("back_s")
    line("kill -9 one of 2 workers mid-run, restart after 2 s", res)
    r.stop()
    ws[0][0].stop()
    if "w1" in state:
        state["w1"].stop()

    # Router overhead: one worker, direct vs behind the router, concurrency 1.
    w, spec = worker(a, secret, free_port())
    r = router(a, secret, [spec], "cache")
    short = [f"Once upon a time {i}" for i in range(200)]
    line("one worker direct (overhead baseline)", run(w.port(), short, a, concurrency=1))
    line("one worker behind the router", run(r.port(), short, a, concurrency=1))
    r.stop()
    w.stop()


def urlget(port, path):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    return buf.decode(errors="replace")


if __name__ == "__main__":
    try:
        main()
    finally:
        for proc in STARTED:
            if proc.p.poll() is None:
                proc.p.kill()
                proc.p.wait()
