#!/usr/bin/env bash
# kvserve against the peers on the newer architectures, side by side,
# interleaved (A B A B), same Q8_0 file for both: 1.1B-class random models of
# qwen3, gemma2, gemma3, phi3 and the MoE ones (qwen2moe, qwen3moe, a
# Mixtral-style llama, gpt-oss) made with `kvserve make-model --arch`.
# gemma2, phi3, qwen2moe and the llama MoE run against llama.cpp b4748;
# qwen3, gemma3, qwen3moe and gpt-oss against ik_llama.cpp (the older
# llama.cpp lacks them).
#
#   [ARCHS="qwen3moe mixtral"] bash bench/arch_vs_peer.sh LLAMA_CPP_BIN IK_LLAMA_BIN [MODELS_DIR] [PAIRS]
#
# Prints one Markdown row per (architecture, test): kvserve tok/s, the
# peer's, and the ratio of the medians. CI does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."
llama=${1:?usage: arch_vs_peer.sh LLAMA_CPP_BIN IK_LLAMA_BIN [MODELS_DIR] [PAIRS]}
ik=${2:?usage: arch_vs_peer.sh LLAMA_CPP_BIN IK_LLAMA_BIN [MODELS_DIR] [PAIRS]}
dir=${3:-/tmp/kvs-arch-models}
pairs=${4:-2}
spm=../shared/golden/tokenizer/ggml-vocab-llama-spm.gguf
bpe=../shared/golden/tokenizer/ggml-vocab-gpt-2.gguf
mkdir -p "$dir"
declare -A shape peer vocab arch
shape[qwen3]="--dim 2048 --layers 16 --heads 16 --kv-heads 8 --head-dim 128 --ffn 8192"; peer[qwen3]=$ik; vocab[qwen3]=$bpe
shape[gemma2]="--dim 2048 --layers 26 --heads 8 --kv-heads 4 --head-dim 256 --ffn 5632"; peer[gemma2]=$llama; vocab[gemma2]=$spm
shape[gemma3]="--dim 2048 --layers 18 --heads 8 --kv-heads 4 --head-dim 256 --ffn 8192"; peer[gemma3]=$ik; vocab[gemma3]=$spm
shape[phi3]="--dim 2048 --layers 16 --heads 32 --kv-heads 32 --ffn 8192"; peer[phi3]=$llama; vocab[phi3]=$spm
# MoE: about a billion weights in all, a tenth to a fifth of them per token.
shape[qwen3moe]="--dim 1024 --layers 16 --heads 16 --kv-heads 4 --head-dim 128 --experts 32 --experts-used 4 --expert-ffn 512"
peer[qwen3moe]=$ik; vocab[qwen3moe]=$bpe
shape[qwen2moe]="--dim 1024 --layers 16 --heads 16 --kv-heads 16 --experts 32 --experts-used 4 --expert-ffn 512 --shared-ffn 2048"
peer[qwen2moe]=$llama; vocab[qwen2moe]=$bpe
shape[mixtral]="--dim 1024 --layers 16 --heads 16 --kv-heads 4 --ffn 2816 --experts 8 --experts-used 2"
peer[mixtral]=$llama; vocab[mixtral]=$spm; arch[mixtral]=llama
# gpt-oss: MXFP4 experts (make-model's default, as the published files), the rest Q8_0.
shape[gpt-oss]="--dim 1024 --layers 16 --heads 16 --kv-heads 4 --head-dim 64 --experts 32 --experts-used 4 --expert-ffn 1024"
peer[gpt-oss]=$ik; vocab[gpt-oss]=$bpe
med() { python3 -c 'import statistics,sys; print(f"{statistics.median(map(float, sys.argv[1:])):.1f}")' "$@"; }
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')); 2 threads; $pairs interleaved pairs; KV f16 on both"
echo
echo "| arch | peer | test | kvserve tok/s | peer tok/s | ratio |"
echo "|---|---|---|---|---|---|"
for a in ${ARCHS:-qwen3 gemma2 gemma3 phi3 qwen2moe qwen3moe mixtral gpt-oss}; do
  m="$dir/bench-$a-q8_0.gguf"
  [ -f "$m" ] || ./build/kvserve make-model --arch "${arch[$a]:-$a}" ${shape[$a]} --ctx 4096 --type q8_0 \
      --vocab-from "${vocab[$a]}" -q -o "$m"
  for test in "512 0" "0 64"; do
    set -- $test
    k=(); p=()
    for _ in $(seq "$pairs"); do
      k+=("$(./build/kvserve bench -m "$m" -p "$1" -n "$2" -r 2 -t 2 --kv-type f16 --json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.1f" % (j["pp_tokens_per_s"] or j["tg_tokens_per_s"]))')")
      p+=("$("${peer[$a]}/llama-bench" -m "$m" -p "$1" -n "$2" -r 2 -t 2 -ctk f16 -ctv f16 -o json 2>/dev/null |
        python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["avg_ts"])')")
    done
    name=$([ "$1" != 0 ] && echo "pp$1" || echo "tg$2")
    km=$(med "${k[@]}"); pm=$(med "${p[@]}")
    echo "| $a | $(basename "$(dirname "$(dirname "${peer[$a]}")")") | $name | $km ($(IFS=,; echo "${k[*]}")) | $pm ($(IFS=,; echo "${p[*]}")) | $(python3 -c "print(f'{$km/$pm:.2f}x')") |"
  done
done
