#!/usr/bin/env python3
"""Resume vs recompute: time to first token after `kvserve chat --resume`
against a fresh chat that has to prefill the same conversation.

1. A chat talks until its KV holds about --tokens tokens, then `/save`s.
2. `--resume` restores that session and asks one more question: its KV comes
   back from the encrypted file, so only the new turn is prefilled.
3. A fresh chat gets the whole conversation's text in one message followed by
   the same question: everything is prefilled.

Each of 2 and 3 runs --reps times, interleaved; the table gives medians.
Prints a Markdown table (docs/ON-DEVICE.md).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

WORDS = ("the little robot walked along the river and found a shiny stone that it gave to "
         "a friendly fox who lived under an old oak tree near the village market").split()


def message(i, n_words):
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(n_words))


def run_chat(binary, model, args, lines, timeout):
    cmd = [binary, "chat", "-m", model, "--temp", "0", "--no-device-monitor", "--no-summary"] + args
    p = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"chat failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def last_stats(out):
    ttft = re.findall(r"last reply: ([0-9.]+) ms to the first token, (\d+) tokens prefilled", out)
    kv = re.findall(r"kv: \d+ of \d+ blocks in use \([^)]*\), peak \d+, (\d+) tokens", out)
    if not ttft or not kv:
        sys.exit("no /stats in the chat's output:\n" + out[-2000:])
    return float(ttft[-1][0]), int(ttft[-1][1]), int(kv[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvserve", default="build/kvserve")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=1500, help="KV tokens the saved conversation holds (about)")
    ap.add_argument("--words", type=int, default=120, help="words per message")
    ap.add_argument("--reply", type=int, default=32, help="most tokens per reply")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kv-type", default="f32")
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()

    common = ["-c", str(a.ctx), "-n", str(a.reply), "--kv-type", a.kv_type]
    if a.threads:
        common += ["-t", str(a.threads)]
    work = tempfile.mkdtemp(prefix="kvs-resume-")
    try:
        sdir = os.path.join(work, "sessions")
        sess = common + ["--session-dir", sdir]
        # Grow the conversation one message at a time until it holds enough tokens.
        msgs, kv_tokens = [], 0
        while kv_tokens < a.tokens:
            msgs.append(message(len(msgs), a.words))
            out, _ = run_chat(a.kvserve, a.model, common, msgs + ["/stats", "/quit"], a.timeout)
            kv_tokens = last_stats(out)[2]
            if len(msgs) > 64:
                sys.exit("the conversation does not grow; is --ctx too small?")
        out, _ = run_chat(a.kvserve, a.model, sess, msgs + ["/stats", "/save long", "/quit"], a.timeout)
        saved_tokens = last_stats(out)[2]
        # The replies are part of what a recompute must prefill.
        # The replies are part of what a recompute must prefill; each follows the ">>> " prompt.
        replies = [r for r in re.findall(r"^>>> (.*)$", out, re.M) if r and not r.startswith(("kv:", "("))]
        history = " ".join(msgs) + " " + " ".join(replies)
        question = "what did the fox do with the stone"
        resumed, fresh, restore_ms = [], [], []
        for _ in range(a.reps):
            out, err = run_chat(a.kvserve, a.model, sess + ["--resume", "long"], [question, "/stats", "/quit"], a.timeout)
            m = re.search(r"restored in ([0-9.]+) ms", err)
            restore_ms.append(float(m.group(1)) if m else float("nan"))
            resumed.append(last_stats(out))
            out, _ = run_chat(a.kvserve, a.model, common, ['"""', history, question, '"""', "/stats", "/quit"], a.timeout)
            fresh.append(last_stats(out))
        med = lambda xs: statistics.median(xs)
        print(f"saved conversation: {len(msgs)} turns, {saved_tokens} KV tokens; model {os.path.basename(a.model)}, "
              f"kv {a.kv_type}, {a.reps} runs each, interleaved\n")
        print("| start | restore (ms) | tokens prefilled | TTFT p50 (ms) | each run (ms) |")
        print("|---|---|---|---|---|")
        print(f"| `--resume` | {med(restore_ms):.1f} | {resumed[0][1]} | {med([r[0] for r in resumed]):.1f} | "
              + ", ".join(f"{r[0]:.1f}" for r in resumed) + " |")
        print(f"| recompute (fresh chat, whole text) | — | {fresh[0][1]} | {med([r[0] for r in fresh]):.1f} | "
              + ", ".join(f"{r[0]:.1f}" for r in fresh) + " |")
        ratio = med([r[0] for r in fresh]) / max(1e-9, med(restore_ms) + med([r[0] for r in resumed]))
        print(f"\nrecompute TTFT / (restore + resumed TTFT) = {ratio:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
