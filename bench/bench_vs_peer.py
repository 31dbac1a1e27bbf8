#!/usr/bin/env python3
"""kvserve against llama.cpp, side by side on this machine, interleaved.

Makes the bench models (kvserve writes the F16 1.1B random Llama; the peer's
llama-quantize makes Q4_0, Q8_0 and Q4_K_M from it, so both programs read the
same bytes), then for every type and thread count runs `kvserve bench` and
`llama-bench` one after the other, PAIRS times (A B A B ...), and prints one
markdown table: median tok/s of each, and the ratio of the medians. Both
run a prompt in forwards of 512 tokens (kvserve --ubatch, llama-bench -ub,
each one's default: serve's --max-batch-tokens). With
--batched it also runs `kvserve batched-bench` and `llama-batched-bench` on
--batched-type (Q8_0 by default) at B = 1, 4, 16. The CPU (lscpu: name, family / model, SIMD level)
heads the table.

Run through scripts/bench-vs-peer.sh PEER_BIN_DIR.
"""
import argparse, json, os, statistics, subprocess, sys


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench-vs-peer: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def cpu_model():
    """lscpu's model name with family / model and the SIMD level: in these VMs
    the name alone ("AMD EPYC") does not tell Zen 3 from Zen 5."""
    fields = {}
    for line in run(["lscpu"]).splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("Flags", "").split())
    if {"avx512f", "avx512_vnni"} <= flags:
        isa = "AVX-512 VNNI" + (" BF16" if "avx512_bf16" in flags else "") + (" + AMX" if "amx_int8" in flags else "")
    elif "avx2" in flags:
        isa = "AVX2, no AVX-512"
    else:
        isa = "no AVX2"
    name = fields.get("Model name", "unknown CPU")
    return f"{name} (family {fields.get('CPU family', '?')} model {fields.get('Model', '?')}, {isa})"


def make_models(a):
    os.makedirs(a.models, exist_ok=True)
    f16 = os.path.join(a.models, "bench-1.1b-f16.gguf")
    if not os.path.exists(f16):
        run([a.kvserve, "make-model", "--preset", "1.1b", "--type", "f16", "-q", "-o", f16])
    paths = {"f16": f16}
    for t in ("q4_0", "q8_0", "q4_k_m"):
        out = os.path.join(a.models, f"bench-1.1b-{t}.gguf")
        if not os.path.exists(out):
            run([os.path.join(a.peer, "llama-quantize"), f16, out, t.upper()])
        paths[t] = out
    return paths


def kvs_bench(a, model, threads):
    out = run([a.kvserve, "bench", "-m", model, "-p", str(a.pp), "-n", str(a.tg), "-r", str(a.reps),
               "-t", str(threads), "--kv-type", "f16", "--prefill-precision", a.precision, "--ubatch", "512", "--json"])
    j = json.loads(out)
    return j["pp_tokens_per_s"], j["tg_tokens_per_s"]


def peer_bench(a, model, threads):
    out = run([os.path.join(a.peer, "llama-bench"), "-m", model, "-p", str(a.pp), "-n", str(a.tg),
               "-r", str(a.reps), "-t", str(threads), "-ub", "512", "-o", "json"])
    pp = tg = None
    for row in json.loads(out):
        if row["n_prompt"] > 0 and row["n_gen"] == 0:
            pp = row["avg_ts"]
        elif row["n_gen"] > 0 and row["n_prompt"] == 0:
            tg = row["avg_ts"]
    return pp, tg


def kvs_batched(a, model, threads, npl):
    out = run([a.kvserve, "batched-bench", "-m", model, "-p", "128", "-n", "32", "--npl", npl, "--kv-type", "f16",
               "-t", str(threads), "--prefill-precision", a.precision, "--json"])
    return {r["b"]: r["s_tg"] for r in json.loads(out)["rows"]}


def peer_batched(a, model, threads, npl):
    out = run([os.path.join(a.peer, "llama-batched-bench"), "-m", model, "-c", "8192", "-b", "2048",
               "-ub", "512", "-npp", "128", "-ntg", "32", "-npl", npl, "-t", str(threads),
               "--output-format", "jsonl"])
    return {r["pl"]: r["speed_tg"] for r in (json.loads(l) for l in out.splitlines() if l.startswith("{"))}


def cell(xs):
    """The median, then every pair's value in run order."""
    xs = [x for x in xs if x is not None]
    return f"{med(xs):.1f} ({', '.join(f'{x:.1f}' for x in xs)})" if xs else "—"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", required=True, help="the peer's bin/ folder (llama-bench, llama-quantize, ...)")
    ap.add_argument("--kvserve", default="./build/kvserve")
    ap.add_argument("--models", default="/tmp/kvs-peer-models")
    ap.add_argument("--types", default="q4_0,q8_0,q4_k_m,f16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="repetitions inside each run")
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--batched", action="store_true", help="also batched-bench --batched-type at --npl concurrencies")
    ap.add_argument("--batched-type", default="q8_0", help="the weight type batched-bench runs")
    ap.add_argument("--npl", default="1,4,16", help="batched: concurrent sequences, comma-separated")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="kvserve's --prefill-precision (F16 rows: bf16 matmuls and attention; quantized rows: bf16 attention, exact matmuls; needs AMX-BF16)")
    a = ap.parse_args()
    models = make_models(a)
    print(f"CPU: {cpu_model()}; {a.pairs} interleaved pairs per row, median (each pair); KV f16 on both sides; "
          f"kvserve --prefill-precision {a.precision}\n")
    print("| type | threads | test | kvserve tok/s | llama.cpp tok/s | ratio of medians |")
    print("|---|---|---|---|---|---|")
    for t in filter(None, a.types.split(",")):  # --types "": batched only
        for th in (int(x) for x in a.threads.split(",")):
            k_pp, k_tg, p_pp, p_tg = [], [], [], []
            for _ in range(a.pairs):
                pp, tg = kvs_bench(a, models[t], th)
                k_pp.append(pp)
                k_tg.append(tg)
                pp, tg = peer_bench(a, models[t], th)
                p_pp.append(pp)
                p_tg.append(tg)
            for name, k, p in ((f"pp{a.pp}", k_pp, p_pp), (f"tg{a.tg}", k_tg, p_tg)):
                if name in ("pp0", "tg0"):  # --pp 0 / --tg 0: that test was not run
                    continue
                print(f"| {t.upper()} | {th} | {name} | {cell(k)} | {cell(p)} | {med(k) / med(p):.2f}x |",
                      flush=True)
    if a.batched:
        th = max(int(x) for x in a.threads.split(","))
        k_rows, p_rows = [], []
        for _ in range(a.pairs):
            k_rows.append(kvs_batched(a, models[a.batched_type], th, a.npl))
            p_rows.append(peer_batched(a, models[a.batched_type], th, a.npl))
        for b in (int(x) for x in a.npl.split(",")):
            k = [r.get(b) for r in k_rows]
            p = [r.get(b) for r in p_rows]
            print(f"| {a.batched_type.upper()} | {th} | batched B={b} S_TG | {cell(k)} | {cell(p)} | {med(k) / med(p):.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
