#!/usr/bin/env python3
"""Peer goldens for the architectures of tests/test_golden_arch.cpp.

For each model of tests/data/arch_goldens.json ("make_model": kvserve
make-model's arguments), writes the model with this build's kvserve, runs
the peer named in "peer" once (llama-perplexity at the file's ctx on
../shared/eval/stories-eval.txt; llama-server /completion, greedy, with the
top-2 log-probabilities, on each prompt) and stores what the peer printed
back into the JSON: perplexity, prompt and generated token ids, top-2 logit
margins, the file's sha256 and the commands. Run by hand, on a machine with
the peers (../shared/peer/README.md); CI only reads the numbers.

  python3 scripts/arch-goldens.py --kvserve build/kvserve \
      --llama-cpp /tmp/peer/llama.cpp/build/bin --ik-llama /tmp/peer/ik_llama/build/bin [--only NAME]
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "arch_goldens.json")
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


def shared_args(args):
    # "../shared/..." in the stored arguments is relative to the project root.
    return [a.replace("../shared/", SHARED + "/") for a in args]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def perplexity(bin_dir, model, text, ctx, extra=()):
    cmd = [os.path.join(bin_dir, "llama-perplexity"), "-m", model, "-f", text, "-c", str(ctx), "-b", str(ctx), "-t", "2"]
    cmd += list(extra)
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = run.stdout
    if run.returncode != 0:
        sys.exit("arch-goldens: " + " ".join(cmd) + " failed:\n" + out[-2000:])
    # llama.cpp: "Final estimate: PPL = X"; ik_llama.cpp: "... PPL over N chunks for n_ctx=C = X".
    m = re.search(r"Final estimate: PPL(?: over \d+ chunks for n_ctx=\d+)? = ([0-9.]+)", out)
    if not m:
        sys.exit("no perplexity in the output of " + " ".join(cmd) + ":\n" + out[-2000:])
    return float(m.group(1)), cmd


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def greedy(bin_dir, model, prompts, n_predict, ctx, extra=(), port=18977):
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "-c", str(ctx), "-t", "2", "--port", str(port)]
    cmd += list(extra)
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        results = []
        for p in prompts:
            toks = post(port, "/tokenize", {"content": p, "add_special": True})["tokens"]
            # llama.cpp's /completion gives token ids and top-2 log-probabilities;
            # ik_llama.cpp's gives them only through /v1/completions' logprobs.
            # ik_llama.cpp's /completion fails (HTTP 500, a JSON exception) on a
            # byte token that leaves incomplete UTF-8; /v1/completions does not.
            try:
                d = post(port, "/completion", {"prompt": p, "n_predict": n_predict, "temperature": 0, "top_k": 1,
                                               "n_probs": 2, "cache_prompt": False, "return_tokens": True,
                                               "ignore_eos": True})
            except urllib.error.HTTPError:
                d = {}
            if "tokens" in d:
                steps, ids = d["completion_probabilities"], d["tokens"]
            else:
                d = post(port, "/v1/completions", {"prompt": p, "max_tokens": n_predict, "temperature": 0, "top_k": 1,
                                                   "logprobs": 2, "cache_prompt": False, "ignore_eos": True})
                steps = d["choices"][0]["logprobs"]["content"]
                ids = [c["id"] for c in steps]
            # A log-probability difference is the logit difference. The server
            # gives no probabilities for a token that leaves its text an
            # incomplete UTF-8 character (a byte token): its margin is null.
            margins, k = [], 0
            for t in ids:
                if k < len(steps) and steps[k]["id"] == t:
                    tl = steps[k]["top_logprobs"]
                    margins.append(round(tl[0]["logprob"] - tl[1]["logprob"], 5))
                    k += 1
                else:
                    margins.append(None)
            results.append({"prompt_tokens": toks, "tokens": ids, "top2_margin": margins})
        return results, cmd
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvserve", required=True)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp's bin/ folder")
    ap.add_argument("--ik-llama", required=True, help="ik_llama.cpp's bin/ folder")
    ap.add_argument("--only", help="one model's name")
    a = ap.parse_args()
    if not os.access(a.kvserve, os.X_OK):
        sys.exit(f"arch-goldens: {a.kvserve} is not an executable kvserve (build it first: scripts/build.sh)")
    if not any(os.path.exists(os.path.join(d, "llama-perplexity")) for d in (a.llama_cpp, a.ik_llama)):
        sys.exit(f"arch-goldens: no llama-perplexity in {a.llama_cpp} or {a.ik_llama}; build the peers with "
                 "../shared/peer/build-llama-cpp.sh (../shared/peer/README.md)")
    data = json.load(open(DATA))
    bins = {"llama.cpp": a.llama_cpp, "ik_llama.cpp": a.ik_llama}
    text = os.path.join(SHARED, data["eval"])
    with tempfile.TemporaryDirectory() as tmp:
        for m in data["models"]:
            if a.only and m["name"] != a.only:
                continue
            path = os.path.join(tmp, m["name"] + ".gguf")
            subprocess.run([a.kvserve, "make-model", "-q", "-o", path] + shared_args(m["make_model"]), check=True)
            m["sha256"] = sha256(path)
            for peer in m["peers"]:
                if not os.path.exists(os.path.join(bins[peer], "llama-perplexity")):
                    print(f"{m['name']}: {peer} is not built in {bins[peer]}; left as it was", file=sys.stderr)
                    continue
                # "peer_args": extra flags for this model's peer runs (e.g. -no-fa: see the JSON's about).
                extra = m.get("peer_args", {}).get(peer, [])
                ppl, pcmd = perplexity(bins[peer], path, text, data["ctx"], extra)
                gen, gcmd = greedy(bins[peer], path, data["prompts"], data["n_predict"], data["ctx"], extra)
                def show(cmd):  # the binary's name, the model's file name, the text under ../shared
                    return " ".join(os.path.basename(c) if i == 0 else m["name"] + ".gguf" if c == path
                                    else c.replace(SHARED + "/", "../shared/") for i, c in enumerate(cmd))
                m["peers"][peer] = {"ppl": ppl, "greedy": gen,
                                    "commands": [show(pcmd), show(gcmd) + "; POST /completion {prompt, n_predict, "
                                                 "temperature 0, top_k 1, n_probs 2, return_tokens, ignore_eos} "
                                                 "(ik_llama.cpp: /v1/completions with logprobs 2)"]}
                if m.get("peer_f32_kv") and peer == m["reference"]:
                    # The same with an f32 KV cache, for kvserve's f32 KV run (MoE: a KV rounding can flip routing).
                    # "peer_f32_kv_args": that cache's flags where the default pair is refused
                    # (ik_llama.cpp without flash attention keeps V in f16: -ctk f32 only).
                    f32 = list(extra) + m.get("peer_f32_kv_args", ["-ctk", "f32", "-ctv", "f32"])
                    ppl32, _ = perplexity(bins[peer], path, text, data["ctx"], f32)
                    gen32, _ = greedy(bins[peer], path, data["prompts"], data["n_predict"], data["ctx"], f32)
                    m["peers"][peer]["f32_kv"] = {"ppl": ppl32, "greedy": gen32,
                                                  "commands": "the above with " + " ".join(f32[len(extra):])}
                print(f"{m['name']}: {peer} PPL {ppl}", file=sys.stderr)
    with open(DATA, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
