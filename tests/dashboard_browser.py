#!/usr/bin/env python3
"""Browser test of GET /dashboard (ctest: test_dashboard_browser).

Starts `kvserve serve` on a free 127.0.0.1 port with a small KV pool and API
keys for three tenants and one admin, runs a burst that fills the pool and
the queue (so some requests are turned away), loads the page in headless
Chromium through the DevTools protocol (python3-websocket) with the admin
key, and checks from the DOM that:
  - free + used + cached = total, each equal to what /metrics reports;
  - the queue chart has points and saw a non-empty queue;
  - at least one rejection is shown.
It also checks that the event stream refuses a missing or non-admin key, and
saves a screenshot taken during the burst. Every wait is bounded.
"""
import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import websocket  # Debian python3-websocket

TENANTS = {"alice": "key-alice", "bob": "key-bob", "carol": "key-carol"}
ADMIN_KEY = "key-admin"


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def http(port, path, body=None, key=None, timeout=30):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=body)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics(port):
    status, text = http(port, "/metrics")
    if status != 200:
        fail("/metrics answered %d" % status)
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(kvserve_kv_blocks_(?:total|free|used|cached)) (\S+)$", line)
        if m:
            out[m.group(1)[len("kvserve_kv_blocks_"):]] = int(float(m.group(2)))
    return out


def write_keys(path):
    keys = [{"key_sha256": hashlib.sha256(k.encode()).hexdigest(), "tenant": t} for t, k in TENANTS.items()]
    keys.append({"key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest(), "tenant": "ops", "admin": True})
    with open(path, "w") as f:
        json.dump({"keys": keys}, f)


def start_server(args, tmp):
    keys = os.path.join(tmp, "keys.json")
    write_keys(keys)
    log = open(os.path.join(tmp, "serve.log"), "w")
    cmd = [args.kvserve, "serve", "-m", args.model, "--port", "0", "--kv-memory", "2MiB", "--max-seqs", "4", "--max-request-share", "0.5",
           "--max-queue", "2", "--api-keys", keys, "--tenant-share", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1))
    p.kill()
    fail("kvserve serve did not start:\n" + open(os.path.join(tmp, "serve.log")).read())


def burst(port, waves, per_wave, results):
    """Waves of requests from three tenants at once, for a few seconds; each
    tenant repeats a long prefix so its blocks are shared and cached."""
    def one(i):
        tenant = list(TENANTS)[i % 3]
        prompt = ("Once upon a time %s had a little red ball and a big dog. " % tenant) * 2 + "Story %d:" % i
        body = json.dumps({"prompt": prompt, "max_tokens": 300, "ignore_eos": True, "temperature": 0}).encode()
        status, _ = http(port, "/v1/completions", body, TENANTS[tenant], timeout=120)
        results.append(status)

    threads = []
    for w in range(waves):
        for i in range(per_wave):
            t = threading.Thread(target=one, args=(w * per_wave + i,))
            t.start()
            threads.append(t)
        time.sleep(0.6)
    return threads


class Browser:
    """Headless Chromium driven over the DevTools protocol."""

    def __init__(self, chromium, tmp):
        self.profile = os.path.join(tmp, "profile")
        cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
               "--user-data-dir=" + self.profile, "--window-size=1400,1800", "about:blank"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = None
        deadline = time.time() + 60
        while time.time() < deadline and url is None:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                url = m.group(1)
        if url is None:
            self.close()
            fail("chromium did not start its DevTools endpoint")
        threading.Thread(target=lambda: self.proc.stderr.read(), daemon=True).start()
        port = int(re.search(r":(\d+)/", url).group(1))
        pages = []
        while time.time() < deadline and not pages:
            with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10) as r:
                pages = [t for t in json.loads(r.read()) if t.get("type") == "page"]
            if not pages:
                time.sleep(0.2)
        if not pages:
            self.close()
            fail("chromium has no page target")
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    fail("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except Exception:
            pass


DOM_STATE = """(() => {
  const v = id => Number(document.getElementById(id).dataset.value);
  const q = document.querySelector('#chart-queue polyline[data-name="queued"]');
  return {snapshots: Number(document.body.dataset.snapshots),
          total: v("blocks-total"), free: v("blocks-free"), used: v("blocks-used"), cached: v("blocks-cached"),
          running: v("running"), rejected: v("rejected-total"),
          queue_points: q ? Number(q.dataset.n) : 0, queue_max: q ? Number(q.dataset.max) : 0,
          map_cells: (() => { const c = document.getElementById("map"); return c.width * c.height; })(),
          conn: document.getElementById("conn").textContent};
})()"""


def wait_for(what, pred, timeout, show=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = pred()
        if r:
            return r
        time.sleep(0.25)
    fail("timed out waiting for " + what + ("; last seen: %s" % show() if show else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--screenshot", default="")
    args = ap.parse_args()
    if not os.path.exists(args.chromium):
        fail("chromium not found (scripts/deps.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="kvs-dash-")
    server, port = start_server(args, tmp)
    browser = None
    try:
        # The stream is the admin's only.
        if http(port, "/dashboard/snapshot")[0] != 401:
            fail("/dashboard/snapshot without a key was not refused")
        if http(port, "/dashboard/snapshot", key=TENANTS["alice"])[0] != 403:
            fail("/dashboard/snapshot with a tenant key was not refused")
        status, page = http(port, "/dashboard")
        # Self-contained: nothing loaded from another origin.
        if status != 200 or "<canvas" not in page or re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|url\(""", page):
            fail("GET /dashboard is not the self-contained page")

        browser = Browser(args.chromium, tmp)
        browser.call("Page.enable")
        browser.call("Page.navigate", url="http://127.0.0.1:%d/dashboard#key=%s" % (port, ADMIN_KEY))
        wait_for("the first snapshot", lambda: (browser.eval(DOM_STATE) or {}).get("snapshots", 0) >= 1, 30,
                 lambda: browser.eval(DOM_STATE))

        results = []
        threads = []
        burster = threading.Thread(target=lambda: threads.extend(burst(port, 8, 10, results)))
        burster.start()
        # A screenshot of the burst a few seconds in: the pool in use and a
        # rejection shown (or whatever the page shows once the burst is over).
        def burst_on_page():
            s = browser.eval(DOM_STATE)
            busy = s["used"] > 0 and s["rejected"] >= 1 and s["snapshots"] >= 4
            return s if busy or not burster.is_alive() else None
        shot = wait_for("the burst on the page", burst_on_page, 60, lambda: browser.eval(DOM_STATE))
        print("during the burst:", shot)
        if args.screenshot:
            browser.screenshot(args.screenshot)
        # Hovering a cell names the block, its ref count and its tenant hash.
        box = browser.eval("(() => { const r = document.getElementById('map').getBoundingClientRect();"
                           " return {x: r.left + 3, y: r.top + 3}; })()")
        browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=box["x"], y=box["y"])
        tip = browser.eval("document.getElementById('tip').textContent")
        if not tip or "block 0" not in tip or "ref count" not in tip or "tenant" not in tip:
            fail("hovering the first cell shows %r" % tip)
        burster.join(timeout=60)
        deadline = time.time() + 180
        for t in threads:
            t.join(timeout=max(0.1, deadline - time.time()))
        if burster.is_alive() or any(t.is_alive() for t in threads):
            fail("burst requests did not finish")
        codes = {c: results.count(c) for c in set(results)}
        print("burst statuses:", codes)
        if codes.get(200, 0) == 0 or codes.get(429, 0) == 0:
            fail("the burst should both complete and turn requests away: %s" % codes)

        # Idle now: the page must show what /metrics shows.
        m = metrics(port)
        seen = browser.eval(DOM_STATE)["snapshots"]
        s = wait_for("two fresh snapshots", lambda: (lambda s: s if s["snapshots"] >= seen + 2 else None)(browser.eval(DOM_STATE)), 15)
        print("metrics:", m, "\ndom:", s)
        if s["free"] + s["used"] + s["cached"] != s["total"]:
            fail("free + used + cached != total on the page")
        for k in ("total", "free", "used", "cached"):
            if s[k] != m[k]:
                fail("%s: page %s, /metrics %s" % (k, s[k], m[k]))
        if s["queue_points"] < 2 or s["queue_max"] < 1:
            fail("the queue chart is empty or never saw a queue")
        if s["rejected"] < 1:
            fail("no rejection on the page")
        if s["map_cells"] <= 0:
            fail("the pool map was not drawn")
        print("PASS")
    finally:
        if browser:
            browser.close()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
