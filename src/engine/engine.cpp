// Forward pass of a decoder-only transformer (llama / mistral / qwen2) over a
// batch of sequence chunks. All tokens of the batch go through each weight
// matrix together (weights are read once per step); attention runs per
// (token, kv-head group) through each sequence's block table.
#include "kvserve/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "kernels/attention.h"
#include "kernels/kv_codec.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/threadpool.h"
#include "kv/kv_layout.h"
#include "model/model.h"

namespace kvs {

struct Engine::Scratch {
  std::vector<float> x, xn;         // [T, dim]
  std::vector<float> q, k, v;       // [T, n_heads*hd], [T, n_kv*hd], [T, n_kv*hd]
  std::vector<float> att;           // [T, n_heads*hd]
  std::vector<float> proj;          // [T, dim]
  std::vector<float> gate, up;      // [T, ffn]
  std::vector<float> rope_cos, rope_sin;  // [T, n_rot/2]
  std::vector<int32_t> pos;         // [T] text index of each token in its sequence
  std::vector<WindowView> view;     // [T] keys each token sees (WindowPolicy::view)
  std::vector<WindowPolicy> policy; // [n_chunks] effective window policy
  std::vector<float> krope_cos, krope_sin;  // [positions, n_rot/2]: keys stored before RoPE
  std::vector<int32_t> seq_of;      // [T] chunk index of each token
  std::vector<std::vector<float>> attn_scratch;  // per thread: scores [block, r, n_ctx] + one tile
  std::vector<std::pair<int64_t, int>> attn_blocks;  // query blocks: (first token, tokens), each within one chunk
  std::vector<float> stage_k, stage_v;  // quantized cache: [Σ rows, kvdim] float rows of each chunk's open groups
  std::vector<int64_t> stage_row0;      // [n_chunks] first stage row of a chunk (its first group's start)
  std::vector<float> out_rows;      // [n_out, dim]
};

Engine::Engine(std::shared_ptr<const Model> model, const EngineOptions& opts)
    : model_(std::move(model)), s_(std::make_unique<Scratch>()) {
  if (!model_) throw std::invalid_argument("Engine: null model");
  int nt = opts.n_threads > 0 ? opts.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  pool_ = std::make_unique<ThreadPool>(nt);
  exact_ = opts.exact;
  s_->attn_scratch.resize(nt);
}

Engine::~Engine() = default;

int Engine::n_threads() const { return pool_->size(); }

void Engine::mm(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy) {
  if (exact_ && w.type != GgmlType::F32 && w.type != GgmlType::F16 && w.type != GgmlType::BF16)
    matmul_reference(w, x, ldx, n, y, ldy);
  else
    matmul(w, x, ldx, n, y, ldy, *pool_);
}

static void add_bias(float* y, const float* b, int64_t rows, int64_t cols) {
  if (!b) return;
  for (int64_t i = 0; i < rows; ++i) add_inplace(y + i * cols, b, int(cols));
}

// Quantized cache, layer l: per chunk, assemble its open groups' float rows
// (residual rows of the first group, then the chunk's tokens), store every
// group that is now complete, and keep the new last group's rows as the
// residual. Token rows are in s.k / s.v ([T, kvdim], batch order).
void Engine::store_quantized(const std::vector<SeqChunk>& batch, const KvStorage& kv, int l) {
  Scratch& s = *s_;
  const KvLayout& L = kv.layout;
  const int G = L.group_tokens, bs = L.block_size;
  const size_t kvdim = L.row_floats(), gfl = size_t(G) * kvdim;
  int64_t t0 = 0;
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    const SeqChunk& ch = batch[ci];
    const int r0 = ch.pos0 % G, start = ch.pos0 - r0, end = ch.pos0 + ch.n_tokens;
    float* sk = &s.stage_k[size_t(s.stage_row0[ci]) * kvdim];  // [r0 + n_tokens, kvdim]
    float* sv = &s.stage_v[size_t(s.stage_row0[ci]) * kvdim];
    float* rk = ch.residual + size_t(l) * 2 * gfl;  // [G, kvdim]
    float* rv = rk + gfl;
    std::memcpy(sk, rk, size_t(r0) * kvdim * sizeof(float));
    std::memcpy(sv, rv, size_t(r0) * kvdim * sizeof(float));
    std::memcpy(sk + size_t(r0) * kvdim, &s.k[size_t(t0) * kvdim], size_t(ch.n_tokens) * kvdim * sizeof(float));
    std::memcpy(sv + size_t(r0) * kvdim, &s.v[size_t(t0) * kvdim], size_t(ch.n_tokens) * kvdim * sizeof(float));
    int p = start;
    for (; p + G <= end; p += G)
      kvc::store_group(kv, ch.block_table[p / bs], l, p % bs, sk + size_t(p - start) * kvdim, sv + size_t(p - start) * kvdim);
    const int rest = end - p;  // the new residual group
    std::memcpy(rk, sk + size_t(p - start) * kvdim, size_t(rest) * kvdim * sizeof(float));
    std::memcpy(rv, sv + size_t(p - start) * kvdim, size_t(rest) * kvdim * sizeof(float));
    t0 += ch.n_tokens;
  }
}

void Engine::forward(const std::vector<SeqChunk>& batch, const KvStorage& kv, std::vector<float>& logits) {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  const int dim = c.dim, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, ffn = c.ffn_dim;
  const int qdim = nh * hd, kvdim = nkv * hd, n_rot = c.n_rot, bs = kv.layout.block_size;
  if (kv.layout.n_layers != c.n_layers || kv.layout.n_kv_heads != nkv || kv.layout.head_dim != hd)
    throw std::invalid_argument("Engine::forward: KV layout does not match the model");

  // Flatten the batch: token t belongs to chunk seq_of[t] at position pos[t].
  int64_t T = 0, n_out = 0;
  Scratch& s = *s_;
  s.policy.clear();
  int max_visible = 0, max_key_pos = -1;
  for (const SeqChunk& ch : batch) {
    if (ch.n_tokens < 1 || ch.pos0 < 0 || !ch.block_table || !ch.tokens)
      throw std::invalid_argument("Engine::forward: empty or malformed chunk");
    T += ch.n_tokens;
    n_out += ch.all_logits ? ch.n_tokens : 1;
    const WindowPolicy wp = ch.window.resolve(c.sliding_window);
    wp.validate();
    s.policy.push_back(wp);
  }
  if (T == 0) {
    logits.clear();
    return;
  }
  s.x.resize(T * dim);
  s.xn.resize(T * dim);
  s.q.resize(T * qdim);
  s.k.resize(T * kvdim);
  s.v.resize(T * kvdim);
  s.att.resize(T * qdim);
  s.proj.resize(T * dim);
  s.gate.resize(T * ffn);
  s.up.resize(T * ffn);
  s.rope_cos.resize(T * (n_rot / 2));
  s.rope_sin.resize(T * (n_rot / 2));
  s.pos.resize(T);
  s.seq_of.resize(T);
  s.view.resize(T);
  {
    int64_t t = 0;
    for (size_t ci = 0; ci < batch.size(); ++ci)
      for (int i = 0; i < batch[ci].n_tokens; ++i, ++t) {
        const int p = batch[ci].pos0 + i;
        const WindowView v = s.policy[ci].view(p);
        s.view[t] = v;
        const int nvis = v.sink_end >= v.win_start ? p + 1 : v.sink_end + (p + 1 - v.win_start);
        max_visible = std::max(max_visible, nvis);
        if (s.policy[ci].rotates()) max_key_pos = std::max(max_key_pos, p - v.shift);
      }
  }
  const int r = nh / nkv;
  // Query blocks: consecutive tokens of a chunk share each loaded K/V tile
  // (a long prefill re-read, and for int8/int4 dequantized, the whole cache
  // per token). Only where every token sees all keys before it, unrotated;
  // with a quantized cache a block stays inside one token group, so its
  // tokens share the stored groups and the open group's rows. Else one token
  // per block. The block is capped so its score rows stay within ~4 MB.
  const int kMaxBlock = 16;
  const int tb_max = int(std::clamp<int64_t>((int64_t(1) << 20) / (int64_t(r) * std::max(1, max_visible)), 1, kMaxBlock));
  s.attn_blocks.clear();
  {
    int64_t t = 0;
    for (size_t ci = 0; ci < batch.size(); ++ci) {
      const int n = batch[ci].n_tokens;
      bool whole = !s.policy[ci].rotates();
      for (int i = 0; i < n && whole; ++i) whole = s.view[t + i].sink_end >= s.view[t + i].win_start;
      const int tb = whole ? tb_max : 1;
      const int G = kv.layout.quantized() ? kv.layout.group_tokens : 0;
      for (int i = 0; i < n;) {
        int len = std::min(tb, n - i);
        if (G > 0) len = std::min(len, G - (batch[ci].pos0 + i) % G);  // up to the group's end
        s.attn_blocks.push_back({t + i, len});
        i += len;
      }
      t += n;
    }
  }
  int tb_used = 1;
  for (const auto& b : s.attn_blocks) tb_used = std::max(tb_used, b.second);
  for (auto& a : s.attn_scratch) a.resize(attention_scratch_floats(r * tb_used, max_visible, bs, hd));
  // Keys stored before RoPE are rotated at attention time: cos/sin of every
  // position a key can take (grown on demand, kept across calls).
  if (max_key_pos >= 0 && int64_t(s.krope_cos.size()) < int64_t(max_key_pos + 1) * (n_rot / 2)) {
    const int n_pos = std::max(max_key_pos + 1, int(s.krope_cos.size() / std::max(1, n_rot / 2)) * 2);
    s.krope_cos.resize(size_t(n_pos) * (n_rot / 2));
    s.krope_sin.resize(size_t(n_pos) * (n_rot / 2));
    RopeTable rt;
    for (int p = 0; p < n_pos; ++p)
      rt.compute(p, n_rot, c.rope_theta, &s.krope_cos[size_t(p) * (n_rot / 2)], &s.krope_sin[size_t(p) * (n_rot / 2)]);
  }
  // A quantized cache stores a token group only once it is complete; the
  // chunk's groups are assembled here first ([rows, kvdim] per chunk: the
  // residual rows of its first group, then its own tokens).
  const bool quant = kv.layout.quantized();
  const int G = kv.layout.group_tokens;
  int64_t stage_rows = 0;
  s.stage_row0.resize(batch.size());
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    s.stage_row0[ci] = stage_rows;
    if (quant) {
      if (!batch[ci].residual) throw std::invalid_argument("Engine::forward: a quantized KV cache needs each chunk's residual");
      stage_rows += batch[ci].pos0 % G + batch[ci].n_tokens;
    }
  }
  s.stage_k.resize(size_t(stage_rows) * kvdim);
  s.stage_v.resize(size_t(stage_rows) * kvdim);

  {
    int64_t t = 0;
    RopeTable rt;
    for (size_t ci = 0; ci < batch.size(); ++ci) {
      const SeqChunk& ch = batch[ci];
      for (int i = 0; i < ch.n_tokens; ++i, ++t) {
        const int tok = ch.tokens[i];
        if (tok < 0 || tok >= c.n_vocab)
          throw std::invalid_argument("Engine::forward: token id " + std::to_string(tok) + " out of range");
        s.pos[t] = ch.pos0 + i;
        s.seq_of[t] = int32_t(ci);
        dequantize_weight_row(w.tok_embd, tok, &s.x[t * dim]);  // [dim]
        // The query's RoPE position (keys are rotated at their own).
        rt.compute(s.pos[t] - s.view[t].shift, n_rot, c.rope_theta, &s.rope_cos[t * (n_rot / 2)], &s.rope_sin[t * (n_rot / 2)]);
      }
    }
  }
  stats_.tokens += T;

  const AttnShape shape{nh, nkv, hd, 1.0f / std::sqrt(float(hd))};
  const bool neox = c.rope == RopeStyle::Neox;
  ThreadPool& pool = *pool_;
  // Row-wise work (norms, RoPE + K/V stores, SwiGLU, residual adds) is per
  // token, so any split gives the same bits: spread a prefill's tokens over
  // the pool. Serial, these loops left a core idle for ~15% of a pp128
  // step (side by side: Q4_0 pp128 271/291 -> 322/332 tok/s with SwiGLU alone).
  auto per_token = [&](const auto& fn) {
    if (T > 1) pool.parallel_for(T, [&](int64_t t, int) { fn(t); });
    else fn(0);
  };

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    // --- attention block ---
    per_token([&](int64_t t) { rmsnorm(&s.x[t * dim], L.attn_norm, &s.xn[t * dim], dim, c.rms_eps); });
    mm(L.wq, s.xn.data(), dim, T, s.q.data(), qdim);   // [T, qdim]
    mm(L.wk, s.xn.data(), dim, T, s.k.data(), kvdim);  // [T, kvdim]
    mm(L.wv, s.xn.data(), dim, T, s.v.data(), kvdim);  // [T, kvdim]
    add_bias(s.q.data(), L.bq, T, qdim);
    add_bias(s.k.data(), L.bk, T, kvdim);
    add_bias(s.v.data(), L.bv, T, kvdim);
    per_token([&](int64_t t) {
      const float* cs = &s.rope_cos[t * (n_rot / 2)];
      const float* sn = &s.rope_sin[t * (n_rot / 2)];
      rope_apply(&s.q[t * qdim], nh, hd, n_rot, neox, cs, sn);
      // Keys of a shifting window policy are stored before RoPE.
      if (!s.policy[s.seq_of[t]].rotates()) rope_apply(&s.k[t * kvdim], nkv, hd, n_rot, neox, cs, sn);
      // Store this token's K/V in its slot (each token its own slot) before
      // any query reads it: the attention below starts after this barrier.
      if (!quant) {
        const SeqChunk& ch = batch[s.seq_of[t]];
        const int p = s.pos[t];
        kvc::store_rows(kv, ch.block_table[p / bs], l, p % bs, 1, &s.k[t * kvdim], &s.v[t * kvdim]);
      }
    });
    if (quant) store_quantized(batch, kv, l);
    pool.parallel_for(int64_t(s.attn_blocks.size()) * nkv, [&](int64_t task, int thread) {
      const auto [t0, tb] = s.attn_blocks[size_t(task / nkv)];
      const int64_t t = t0 + tb - 1;  // the block's last token describes the block (attention.h)
      const int g = int(task % nkv);
      const size_t ci = size_t(s.seq_of[t]);
      const SeqChunk& ch = batch[ci];
      AttnSeq as{ch.block_table, s.pos[t] + 1, s.pos[t] + 1, nullptr, nullptr};
      as.sink_end = s.view[t].sink_end;
      as.win_start = s.view[t].win_start;
      if (s.policy[ci].rotates()) {
        as.rope_cos = s.krope_cos.data();
        as.rope_sin = s.krope_sin.data();
        as.shift = s.view[t].shift;
        as.n_rot = n_rot;
        as.neox = neox;
      }
      if (quant) {
        // Complete groups from the cache, the token's own group in full precision.
        as.n_stored = s.pos[t] / G * G;
        const int64_t row = s.stage_row0[ci] + (as.n_stored - ch.pos0 / G * G);  // [kvdim] row of n_stored
        as.own_k = &s.stage_k[size_t(row) * kvdim];
        as.own_v = &s.stage_v[size_t(row) * kvdim];
      }
      attention_group_block(&s.q[t0 * qdim], size_t(qdim), tb, kv, l, as, g, shape, &s.att[t0 * qdim], size_t(qdim),
                            s.attn_scratch[thread].data());
    });
    mm(L.wo, s.att.data(), qdim, T, s.proj.data(), dim);  // [T, dim]
    per_token([&](int64_t t) { add_inplace(&s.x[t * dim], &s.proj[t * dim], dim); });

    // --- feed-forward block (SwiGLU) ---
    per_token([&](int64_t t) { rmsnorm(&s.x[t * dim], L.ffn_norm, &s.xn[t * dim], dim, c.rms_eps); });
    mm(L.w_gate, s.xn.data(), dim, T, s.gate.data(), ffn);  // [T, ffn]
    mm(L.w_up, s.xn.data(), dim, T, s.up.data(), ffn);      // [T, ffn]
    per_token([&](int64_t t) { swiglu_inplace(&s.gate[t * ffn], &s.up[t * ffn], ffn); });
    mm(L.w_down, s.gate.data(), ffn, T, s.proj.data(), dim);  // [T, dim]
    per_token([&](int64_t t) { add_inplace(&s.x[t * dim], &s.proj[t * dim], dim); });
  }

  // Final norm and classifier only for the rows whose logits are wanted.
  s.out_rows.resize(n_out * dim);  // [n_out, dim]
  {
    int64_t t = 0, o = 0;
    for (const SeqChunk& ch : batch) {
      for (int i = 0; i < ch.n_tokens; ++i, ++t) {
        if (ch.all_logits || i == ch.n_tokens - 1) {
          rmsnorm(&s.x[t * dim], w.output_norm, &s.out_rows[o * dim], dim, c.rms_eps);
          ++o;
        }
      }
    }
  }
  logits.resize(size_t(n_out) * c.n_vocab);
  mm(w.output, s.out_rows.data(), dim, n_out, logits.data(), c.n_vocab);  // [n_out, n_vocab]
}

}  // namespace kvs
