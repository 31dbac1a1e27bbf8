#!/usr/bin/env python3
"""Runs the peers on the MoE golden models and writes moe_golden.json (tests/data/).

Not run by the tests (CI has no peers). Usage, from the repository root:
  KVSERVE=build/kvserve SHARED=../shared LLAMA_CPP=/path/llama.cpp IK_LLAMA=/path/ik_llama OUT=/tmp/moe \
  GREEDY=/path/peer_greedy GREEDY_IK=/path/peer_greedy_ik \
  python3 tests/data/make_moe_golden.py LLAMA_SEED QWEN2MOE_SEED Q8_0_TOLERANCE QWEN3MOE_SEED
(peer_greedy: tests/data/peer_greedy.cpp built against each peer, see its header.)"""
import hashlib, json, os, re, subprocess, sys

K = os.environ.get("KVSERVE", "build/kvserve")
SHARED = os.environ.get("SHARED", "../shared")
LP = os.environ["LLAMA_CPP"] + "/build/bin/llama-perplexity"
IKP = os.environ["IK_LLAMA"] + "/build/bin/llama-perplexity"
GREEDY = os.environ["GREEDY"]
GREEDY_IK = os.environ["GREEDY_IK"]
OUT = os.environ.get("OUT", "/tmp")
EVAL = SHARED + "/eval/stories-eval.txt"
PROMPTS = ["Once upon a time", "The little dog ran to the park and",
           "Paged attention splits the KV cache into blocks of 16 tokens."]
N_PREDICT = 16
seeds = {"llama": int(sys.argv[1]), "qwen2moe": int(sys.argv[2]), "qwen3moe": int(sys.argv[4])}
q8_tol = float(sys.argv[3])

def shape(arch, seed, t):
    if arch == "llama":
        return ["--arch", "llama", "--experts", "8", "--experts-used", "2", "--dim", "256", "--layers", "2",
                "--heads", "8", "--kv-heads", "4", "--ffn", "256", "--type", t, "--seed", str(seed),
                "--vocab-from", "shared:golden/tokenizer/ggml-vocab-llama-spm.gguf"]
    if arch == "qwen3moe":
        return ["--arch", "qwen3moe", "--experts", "8", "--experts-used", "2", "--dim", "256", "--layers", "2",
                "--heads", "8", "--kv-heads", "2", "--ffn", "256", "--expert-ffn", "128", "--type", t, "--seed", str(seed),
                "--vocab-from", "shared:golden/tokenizer/ggml-vocab-gpt-2.gguf"]
    return ["--arch", "qwen2moe", "--experts", "8", "--experts-used", "2", "--dim", "256", "--layers", "2",
            "--heads", "8", "--kv-heads", "2", "--ffn", "256", "--expert-ffn", "128", "--shared-ffn", "256",
            "--type", t, "--seed", str(seed), "--vocab-from", "shared:golden/tokenizer/ggml-vocab-gpt-2.gguf"]

def ppl(binary, model, kv):
    out = subprocess.run(["nice", "-n", "19", binary, "-m", model, "-f", EVAL, "-c", "256", "-b", "256", "-t", "2",
                          "-ctk", kv, "-ctv", kv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    chunks = re.findall(r"\[(\d+)\]([0-9.]+),", out)
    return float(chunks[-1][1]), int(chunks[-1][0])

def make(arch, t):
    name = f"{'llama-moe' if arch == 'llama' else arch}-{t}"
    args = shape(arch, seeds[arch], t)
    path = f"{OUT}/{name}.gguf"
    real = [a.replace("shared:", SHARED + "/") for a in args]
    subprocess.run([K, "make-model", "-o", path, "-q"] + real, check=True)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return name, args, path, {"name": name, "make_model": args, "sha256": sha,
                              "ppl_rel_tolerance": 0.0005 if t == "f16" else q8_tol,
                              "margin_tolerance": 0.02 if t == "f16" else 0.2}

def greedy(binary, path, kv):
    g = subprocess.run(["nice", "-n", "19", binary, path, str(N_PREDICT), kv] + PROMPTS, capture_output=True,
                       text=True, check=True).stdout
    return json.loads(g)

models = []
for arch in ["llama", "qwen2moe"]:
    for t in ["f16", "q8_0"]:
        name, args, path, entry = make(arch, t)
        entry["peer_name"] = "llama.cpp b4748"
        entry["peer"], entry["ik_llama"] = {}, {}
        for kv in ["f32", "f16"]:
            p, n = ppl(LP, path, kv)
            entry["peer"][kv + "_kv"] = {"ppl": p, "chunks": n, "greedy": greedy(GREEDY, path, kv)}
            if kv == "f16":  # ik_llama.cpp has no f32 V cache on the CPU
                entry["ik_llama"][kv + "_kv"] = {"ppl": ppl(IKP, path, kv)[0]}
        models.append(entry)
        print(name, json.dumps({k: v["ppl"] for k, v in entry["peer"].items()}),
              json.dumps({k: v["ppl"] for k, v in entry["ik_llama"].items()}), file=sys.stderr)
pending = []
for t in ["f16"]:
    name, args, path, entry = make("qwen3moe", t)
    entry["peer_name"] = "ik_llama.cpp 8337e4cd3"
    p, n = ppl(IKP, path, "f16")
    entry["peer"] = {"f16_kv": {"ppl": p, "chunks": n, "greedy": greedy(GREEDY_IK, path, "f16")}}
    pending.append(entry)
    print(name, p, file=sys.stderr)

doc = {
    "about": [
        "Peer goldens of tests/test_golden_moe.cpp. Each model is made at test time by `kvserve make-model -o M -q "
        "<make_model>` ('shared:' = ../shared/); sha256 is of that file, so the numbers below belong to it "
        "(regenerate with a new sha256 only together with new peer numbers).",
        "peer (llama.cpp b4748, commit c392e5094, CPU build): `llama-perplexity -m M -f ../shared/eval/stories-eval.txt "
        "-c 256 -b 256 -t 2 -ctk KV -ctv KV` (the last running estimate = Final estimate; chunks = its chunk count), and "
        "greedy tokens from tests/data/peer_greedy.cpp built against its library: `peer_greedy M 16 KV PROMPT...` "
        "(one token at a time through the KV cache, n_ctx 256; top2_margin = best minus second-best logit per step).",
        "ik_llama (ik_llama.cpp, Aug 2026, commit 8337e4cd3; the same command, f16 KV only: it has no f32 V cache on "
        "the CPU): recorded, not checked. Its numbers for the llama MoE files are not comparable: its build_llama MoE "
        "branch (src/graphs/build_llama.cpp) normalizes the FFN input before llm_build_moe_ffn(..., add_input = true), "
        "which adds the normalized input back, and the residual add is commented out, so each MoE layer drops the "
        "residual stream (kvserve with that change reproduces its 48975.50 on seed 3's F16 file to 0.001%). On "
        "qwen2moe (and dense) files the two peers agree.",
        "ppl_rel_tolerance: F16 weights 0.05% (the issue's bound). Q8_0: the two peers' mutual gap on Q8_0 MoE files "
        "(q8_0_tolerance; llama.cpp b4748 is the reference, as the issue says where it has the architecture).",
        "margin_tolerance: a greedy step may differ only where the peer's top-2 margin is below it (F16: 0.02; "
        "Q8_0: 0.2, llama.cpp's measured logit gap to kvserve on quantized files, ../shared/golden/peer/README.md); "
        "after such a step the continuation differs legitimately and is not compared.",
        "Routing near-ties: a token whose k-th and (k+1)-th router scores nearly tie can pick another expert in "
        "another engine (llama.cpp rounds activations to F16 before F16 weights and quantizes them differently for "
        "Q8_0; kvserve multiplies in F32), which moves that token's logits a lot and the perplexity by 0.05-0.7% on "
        "these tiny random models. Of llama seeds 1-12 and qwen2moe seeds 1-5, 8 and 2 are the ones where kvserve and "
        "llama.cpp agree on F16 to 0.002% at both KV types and on Q8_0 within the tolerance; a failure after an engine "
        "change may be such a flip (compare chunk by chunk before suspecting the MoE layer)."],
    "q8_0_tolerance": {
        "value": q8_tol,
        "measured (llama.cpp vs ik_llama.cpp, f16 KV, perplexity gap)": [
            "qwen2moe seeds 2..5 (the shapes below): -0.293%, -0.323%, +0.180%, -0.150%",
            "dense llama dim 256 ffn 512 seeds 2..4: +0.056%, -0.017%, +0.001%",
            "dense qwen2 dim 256 ffn 512 seeds 2..4: +0.043%, -0.006%, +0.128%",
            "rounded up from the largest MoE gap (0.323%) to 0.4%"]},
    "prompts": PROMPTS,
    "models": models,
    "pending_qwen3_attention": {
        "about": "qwen3moe (peer: ik_llama.cpp, the only one with the architecture; f16 KV only). kvserve refuses the "
                 "file until qwen3 attention (per-head q/k RMSNorm) is in; then move these entries to models. The seed "
                 "was not screened for routing near-ties (kvserve could not run it yet).",
        "models": pending},
}
for i, m in enumerate(models + pending):
    m["make_model"] = "@@MM%d@@" % i
text = json.dumps(doc, indent=1)
# Number lists on one line each.
text = re.sub(r"\[\s*([-0-9.,\s]+?)\s*\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
for i, m in enumerate(models + pending):
    text = text.replace('"@@MM%d@@"' % i, json.dumps(shape({"llama-moe": "llama"}.get(m["name"].rsplit("-", 1)[0], m["name"].rsplit("-", 1)[0]),
                                                        seeds[{"llama-moe": "llama"}.get(m["name"].rsplit("-", 1)[0], m["name"].rsplit("-", 1)[0])],
                                                        m["name"].rsplit("-", 1)[1])))
open(f"{OUT}/moe_golden.json", "w").write(text + "\n")
