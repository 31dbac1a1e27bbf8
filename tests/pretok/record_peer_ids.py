#!/usr/bin/env python3
"""Records the peer's token ids for test_pretok_peer into peer_ids.json.

    python3 tests/pretok/record_peer_ids.py BUILD_DIR --llama-cpp BIN_DIR --ik-llama BIN_DIR [--out FILE]

1. Runs BUILD_DIR/test_pretok_peer with KVS_PRETOK_EXPORT set, so the test
   writes its vocabulary variants (the very files it tokenizes) into a
   temporary folder.
2. Tokenizes every input of cases.json (after llama.cpp's vocab test strings
   and the page of eval text, in the test's order) with each peer's
   llama-tokenize on each variant: `plain` inputs without BOS and without
   parsing special text, `special` inputs as llama-tokenize does by default.
3. Writes llama.cpp b4748's ids wherever it knows the pre-type (it predates
   gpt-4o), ik_llama.cpp's elsewhere, with the commands used; every input on
   which the two peers disagree is listed with both peers' ids.

CI has no peers: the test reads only the JSON this writes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared"))


def inputs():
    inp = open(os.path.join(SHARED, "golden/tokenizer/ggml-vocab-gpt-2.gguf.inp"), "rb").read()
    sep = b"\n__ggml_vocab_test__\n"
    plain, pos = [], 0
    while True:
        at = inp.find(sep, pos)
        if at < 0:
            break
        plain.append(inp[pos:at])
        pos = at + len(sep)
    c = json.load(open(os.path.join(HERE, "cases.json")))
    page = open(os.path.join(SHARED, c["shared_text"]["path"]), "rb").read()
    plain.append(page[:c["shared_text"]["bytes"]])
    plain += [t.encode("utf-8") for t in c["texts"]]
    plain += [bytes.fromhex(h) for h in c["hex"]]
    special = [t.encode("utf-8") for t in c["special"]]
    return plain, special


def fingerprint(texts):
    h = 1469598103934665603
    for t in texts:
        for b in t + b"\xff":
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def peer_version(bin_dir):
    src = os.path.normpath(os.path.join(bin_dir, "..", ".."))
    return subprocess.run(["git", "-C", src, "log", "-1", "--format=%H %cs"], capture_output=True,
                          text=True).stdout.strip()


def tokenize(exe, flags, model, text):
    r = subprocess.run(["nice", "-n", "19", exe, "-m", model, "--ids", "--log-disable", "--stdin"] + flags,
                       input=text, capture_output=True)
    if r.returncode != 0:
        return None  # the peer does not know the pre-type (or failed): no ids
    out = r.stdout.decode().strip().splitlines()[-1]
    return json.loads(out)


def compact(result):
    """JSON with one line per input's ids."""
    lines = ["{"]
    keys = list(result)
    for k in keys:
        end = "," if k != keys[-1] else ""
        if k == "disagreements":
            rows = ",\n".join("  " + json.dumps(d, separators=(",", ":")) for d in result[k])
            lines.append(f' "{k}": [\n{rows}\n ]{end}' if rows else f' "{k}": []{end}')
        elif k in ("plain", "special"):
            lines.append(f' "{k}": {{')
            vs = list(result[k])
            for v in vs:
                rows = ",\n".join("   " + json.dumps(ids, separators=(",", ":")) for ids in result[k][v])
                lines.append(f'  "{v}": [\n{rows}\n  ]' + ("," if v != vs[-1] else ""))
            lines.append(" }" + end)
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(result[k])}{end}")
    lines.append("}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--llama-cpp", help="llama.cpp b4748's bin/ folder")
    ap.add_argument("--ik-llama", help="ik_llama.cpp's bin/ folder")
    ap.add_argument("--out", default=os.path.join(HERE, "peer_ids.json"))
    args = ap.parse_args()
    build = args.build
    plain, special = inputs()
    vocab_dir = tempfile.mkdtemp(prefix="pretok-")
    env = dict(os.environ, KVS_PRETOK_EXPORT=vocab_dir)
    subprocess.run([os.path.join(build, "test_pretok_peer"), "--gtest_filter=PretokPeer.EveryVariantLoads"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    variants = sorted(f[:-5] for f in os.listdir(vocab_dir) if f.endswith(".gguf"))

    # b4748 expands escapes unless told not to; ik_llama.cpp never does.
    peers = {}
    if args.llama_cpp:
        peers["llama.cpp"] = (os.path.join(args.llama_cpp, "llama-tokenize"), ["--no-escape"])
    if args.ik_llama:
        peers["ik_llama.cpp"] = (os.path.join(args.ik_llama, "llama-tokenize"), [])
    if not peers:
        sys.exit("name at least one peer")
    modes = {"plain": (plain, ["--no-bos", "--no-parse-special"]), "special": (special, [])}
    result = {
        "comment": "Token ids the peers' llama-tokenize printed for the inputs of test_pretok_peer, "
                   "written by record_peer_ids.py; data, not code.",
        "peers": {name: peer_version(os.path.dirname(exe)) for name, (exe, _) in peers.items()},
        "commands": {
            "plain": "llama-tokenize -m VARIANT.gguf --ids --log-disable --stdin --no-bos --no-parse-special "
                     "[--no-escape: llama.cpp b4748 only] < INPUT",
            "special": "llama-tokenize -m VARIANT.gguf --ids --log-disable --stdin [--no-escape] < INPUT",
        },
        "plain_fnv": fingerprint(plain),
        "special_fnv": fingerprint(special),
        "sources": {},
    }
    pool = ThreadPoolExecutor(max_workers=8)  # each run mostly waits (nice 19)
    result["disagreements"] = []
    for mode, (texts, flags) in modes.items():
        result[mode] = {}
        for v in variants:
            model = os.path.join(vocab_dir, v + ".gguf")
            futures = {name: [pool.submit(tokenize, exe, flags + extra, model, t) for t in texts]
                       for name, (exe, extra) in peers.items()}
            got = {name: [f.result() for f in fs] for name, fs in futures.items()}
            known = [n for n in peers if all(ids is not None for ids in got[n])]
            if not known:
                print(f"warning: no peer tokenizes variant {v}; left out", file=sys.stderr)
                continue
            # llama.cpp b4748 is the reference wherever it knows the pre-type
            # (as for the architectures' goldens); ik_llama.cpp otherwise.
            chosen = "llama.cpp" if "llama.cpp" in known else known[0]
            for i in range(len(texts)):
                if len({json.dumps(got[n][i]) for n in known}) > 1:
                    result["disagreements"].append({"mode": mode, "variant": v, "input": i,
                                                    "ids": {n: got[n][i] for n in known}})
            result[mode][v] = got[chosen]
            result["sources"].setdefault(v, {"ids": chosen, "agree": known})
    with open(args.out, "w") as f:
        f.write(compact(result) + "\n")
    print(f"{len(variants)} variants, {len(plain)} plain and {len(special)} special inputs: {args.out}")


if __name__ == "__main__":
    main()
