// Forward pass of a decoder-only transformer (llama / mistral / qwen2 /
// qwen3 / gemma2 / gemma3 / phi3, their mixture-of-experts kin, gpt-oss)
// over a batch of sequence chunks. All
// tokens of the batch go through each weight matrix together (weights are
// read once per step); attention runs per (query block, kv-head group)
// through each sequence's block table. The batch is flattened once per step
// into a BatchPlan; the layer loop reads it. What differs between the
// architectures is data (ModelConfig flags and per-layer facts, optional
// tensors in LayerWeights), read once per layer, never per element.
#include "kvserve/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <thread>

#include "engine/batch_plan.h"
#include "engine/moe_ffn.h"
#include "kernels/attention.h"
#include "kernels/huge_pages.h"
#include "kernels/kv_codec.h"
#include "kernels/kv_layout.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "kernels/threadpool.h"
#include "model/model.h"

namespace kvs {

struct Engine::Impl {
  std::shared_ptr<const Model> model;
  std::unique_ptr<ThreadPool> pool;
  ForwardStats stats;
  bool exact = false;
  bool op_timing = false;
  std::chrono::steady_clock::time_point lap_t0;  // end of the last timed phase
  BatchPlan plan;
  LargeVec<float> x, xn;            // [T, dim]
  LargeVec<float> q, k, v;          // [T, q_ld], [T, n_kv*hd], [T, n_kv*hd] (q: n_heads*hd used)
  LargeVec<float> att;              // [T, q_ld]: n_heads*hd used
  LargeVec<float> proj;             // [T, proj_ld]: dim used
  LargeVec<float> gate, up;         // [T, ffn_ld]: ffn used
  int64_t q_ld = 0, proj_ld = 0, ffn_ld = 0;  // row strides (padded_ld); q_ld: att's too
  MoeFfn moe;                       // mixture-of-experts layers: routing and expert buffers
  // Per kind of RoPE (ModelConfig::ropes): its frequencies and tables.
  struct RopeKind {
    RopeFreqs freqs;
    std::vector<float> cos, sin;    // [T, n_rot/2]: each query's RoPE position
    std::vector<float> kcos, ksin;  // [positions, n_rot/2]: keys stored before RoPE
  };
  std::vector<RopeKind> ropes;
  std::vector<std::vector<float>> attn_scratch;  // per thread: a query block's row state + one K/V tile
  std::vector<float> stage_k, stage_v;  // quantized cache: [stage_rows, kvdim] float rows of each chunk's open groups
  std::vector<float> out_rows;      // [n_out, dim]
  std::vector<int32_t> row_tokens;  // [T] each row's token id

  const ModelConfig& cfg() const { return model->config(); }
  // The per-op timer: lap(p) charges the time since the previous lap to p.
  void lap_start() {
    if (op_timing) lap_t0 = std::chrono::steady_clock::now();
  }
  void lap(OpPhase p) {
    if (!op_timing) return;
    const auto now = std::chrono::steady_clock::now();
    stats.ops.seconds[int(p)] += std::chrono::duration<double>(now - lap_t0).count();
    lap_t0 = now;
  }
  void mm(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy);
  void mm_multi(std::initializer_list<MatmulOut> outs, const float* x, int64_t ldx, int64_t n);
  // Row-wise work (norms, RoPE + K/V stores, SwiGLU, residual adds) is per
  // token, so any split gives the same bits: spread a prefill's tokens over
  // the pool. Serial, these loops left a core idle for a noticeable share of
  // a prefill step.
  template <class Fn>
  void per_token(const Fn& fn) {
    const int64_t T = plan.n_tokens;
    if (T > 1) pool->parallel_for(T, [&](int64_t t, int) { fn(t); });
    else fn(0);
  }
  void prepare(const KvLayout& layout);
  void rope_tables();
  void qkv(int l);
  void attention_block(const KvStorage& kv, int l);
  void store_quantized(const KvStorage& kv, int l);
  void attend(const KvStorage& kv, int l);
  void ffn_block(int l);
  void residual(const float* post_norm, const float* next_norm);
  void output(std::vector<float>& logits);
};

Engine::Engine(std::shared_ptr<const Model> model, const EngineOptions& opts) : impl_(std::make_unique<Impl>()) {
  if (!model) throw std::invalid_argument("Engine: null model");
  impl_->model = std::move(model);
  const int nt = opts.n_threads > 0 ? opts.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  impl_->pool = std::make_unique<ThreadPool>(nt);
  impl_->exact = opts.exact;
  impl_->attn_scratch.resize(nt);
  const ModelConfig& c = impl_->cfg();
  const float* factors = impl_->model->weights().rope_factors_for(c, opts.n_ctx);
  for (const RopeConfig& rc : c.ropes) impl_->ropes.push_back({RopeFreqs(rc, c.n_rot, factors), {}, {}, {}, {}});
}

Engine::~Engine() = default;

const Model& Engine::model() const { return *impl_->model; }
std::shared_ptr<const Model> Engine::model_ptr() const { return impl_->model; }
ThreadPool& Engine::pool() { return *impl_->pool; }
int Engine::n_threads() const { return impl_->pool->size(); }
const ForwardStats& Engine::stats() const { return impl_->stats; }
void Engine::set_op_timing(bool on) { impl_->op_timing = on; }
void Engine::reset_op_times() { impl_->stats.ops = {}; }

const char* op_phase_name(OpPhase p) {
  static const char* const names[kOpPhases] = {"embed",  "norm",     "qkv",    "rope_kv",  "attention", "attn_out",
                                               "ffn_up", "ffn_act",  "ffn_down", "moe",    "residual",  "output"};
  const int i = int(p);
  return i >= 0 && i < kOpPhases ? names[i] : "?";
}

double OpTimes::total() const {
  double t = 0;
  for (double s : seconds) t += s;
  return t;
}

// Weights whose products read the activations as floats (the others are
// quantized: exact mode takes them through the reference instead).
static bool float_weights(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

void Engine::Impl::mm(const WeightView& w, const float* xs, int64_t ldx, int64_t n, float* y, int64_t ldy) {
  if (exact && !float_weights(w.type))
    matmul_reference(w, xs, ldx, n, y, ldy);
  else
    matmul(w, xs, ldx, n, y, ldy, *pool);
}

void Engine::Impl::mm_multi(std::initializer_list<MatmulOut> outs, const float* xs, int64_t ldx, int64_t n) {
  if (exact) {
    for (const MatmulOut& o : outs) mm(*o.w, xs, ldx, n, o.y, o.ldy);
    return;
  }
  matmul_multi(outs.begin(), int(outs.size()), xs, ldx, n, *pool);
}

static void add_bias(float* y, int64_t ldy, const float* b, int64_t rows, int64_t cols) {
  if (!b) return;
  for (int64_t i = 0; i < rows; ++i) add_inplace(y + i * ldy, b, int(cols));
}

// Per kind of RoPE: each row's cos/sin at its query position (keys are
// rotated at their own), and, when keys are stored before RoPE and rotated
// at attention time, cos/sin of every position a key can take (grown on
// demand, kept across calls).
void Engine::Impl::rope_tables() {
  const int64_t T = plan.n_tokens;
  const int half = cfg().n_rot / 2;
  for (RopeKind& rk : ropes) {
    rk.cos.resize(T * half);
    rk.sin.resize(T * half);
    per_token([&](int64_t t) {
      rk.freqs.compute(plan.pos[t] - plan.view[t].shift, &rk.cos[t * half], &rk.sin[t * half]);
    });
    if (plan.max_key_pos >= 0 && int64_t(rk.kcos.size()) < int64_t(plan.max_key_pos + 1) * half) {
      const int n_pos = std::max(plan.max_key_pos + 1, int(rk.kcos.size() / std::max(1, half)) * 2);
      rk.kcos.resize(size_t(n_pos) * half);
      rk.ksin.resize(size_t(n_pos) * half);
      for (int p = 0; p < n_pos; ++p) rk.freqs.compute(p, &rk.kcos[size_t(p) * half], &rk.ksin[size_t(p) * half]);
    }
  }
}

// Buffers sized for the plan, RoPE tables, and each row's embedding.
void Engine::Impl::prepare(const KvLayout& layout) {
  const ModelConfig& c = cfg();
  const int64_t T = plan.n_tokens;
  const int dim = c.dim, qdim = c.n_heads * c.head_dim, kvdim = c.n_kv_heads * c.head_dim;
  proj_ld = c.moe.n_expert > 0 ? dim : padded_ld(dim);
  ffn_ld = padded_ld(c.ffn_dim);
  for (auto* b : {&x, &xn}) b->resize(T * dim);
  proj.resize(T * proj_ld);
  q_ld = padded_ld(qdim);
  for (auto* b : {&q, &att}) b->resize(T * q_ld);
  for (auto* b : {&k, &v}) b->resize(T * kvdim);
  if (c.moe.n_expert == 0)
    for (auto* b : {&gate, &up}) b->resize(T * ffn_ld);
  const int r = c.n_heads / c.n_kv_heads;
  for (auto& a : attn_scratch)
    a.resize(attention_scratch_floats(r * plan.max_block_rows, c.head_dim, model->bf16_attention()));
  rope_tables();
  stage_k.resize(size_t(plan.stage_rows) * kvdim);
  stage_v.resize(size_t(plan.stage_rows) * kvdim);
  // Each row's embedding on the pool: a long prompt's rows are cache misses
  // spread over the whole table, and one thread left the other idle.
  row_tokens.resize(size_t(T));
  for (const ChunkPlan& ch : plan.chunks)
    std::copy(ch.tokens, ch.tokens + ch.n_tokens, row_tokens.begin() + ch.row0);
  const WeightView& embd = model->weights().tok_embd;
  per_token([&](int64_t t) {
    float* xt = &x[t * dim];  // [dim]
    dequantize_weight_row(embd, row_tokens[size_t(t)], xt);
    if (c.embd_scale > 0.f)
      for (int i = 0; i < dim; ++i) xt[i] *= c.embd_scale;
  });
}

// Quantized cache, layer l: per chunk, assemble its open groups' float rows
// (residual rows of the first group, then the chunk's tokens), store every
// group that is now complete, and keep the new last group's rows as the
// residual. Token rows are in k / v ([T, kvdim], batch order).
void Engine::Impl::store_quantized(const KvStorage& kv, int l) {
  const KvLayout& L = kv.layout;
  const int G = L.group_tokens, bs = L.block_size;
  const size_t kvdim = L.row_floats(), gfl = size_t(G) * kvdim;
  const int slot = L.slot_of(l);
  for (const ChunkPlan& ch : plan.chunks) {
    const int32_t* table = ch.tables[L.table_of(l)];
    const int r0 = ch.pos0 % G, start = ch.pos0 - r0, end = ch.pos0 + ch.n_tokens;
    float* sk = &stage_k[size_t(ch.stage_row0) * kvdim];  // [r0 + n_tokens, kvdim]
    float* sv = &stage_v[size_t(ch.stage_row0) * kvdim];
    float* rk = ch.residual + size_t(l) * 2 * gfl;  // [G, kvdim]
    float* rv = rk + gfl;
    std::memcpy(sk, rk, size_t(r0) * kvdim * sizeof(float));
    std::memcpy(sv, rv, size_t(r0) * kvdim * sizeof(float));
    std::memcpy(sk + size_t(r0) * kvdim, &k[size_t(ch.row0) * kvdim], size_t(ch.n_tokens) * kvdim * sizeof(float));
    std::memcpy(sv + size_t(r0) * kvdim, &v[size_t(ch.row0) * kvdim], size_t(ch.n_tokens) * kvdim * sizeof(float));
    int p = start;
    for (; p + G <= end; p += G)
      kvc::store_group(kv, table[p / bs], slot, p % bs, sk + size_t(p - start) * kvdim, sv + size_t(p - start) * kvdim);
    const int rest = end - p;  // the new residual group
    std::memcpy(rk, sk + size_t(p - start) * kvdim, size_t(rest) * kvdim * sizeof(float));
    std::memcpy(rv, sv + size_t(p - start) * kvdim, size_t(rest) * kvdim * sizeof(float));
  }
}

// Attention of every query block over the keys its window shows, one task
// per (kv head, query block), head by head: a thread's consecutive tasks
// read the same head's keys and values, which stay in its cache.
void Engine::Impl::attend(const KvStorage& kv, int l) {
  const ModelConfig& c = cfg();
  const int nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim, kvdim = nkv * hd;
  const float scale = c.attn_scale > 0.f ? c.attn_scale : 1.0f / std::sqrt(float(hd));
  // gpt-oss: the layer's learned sinks [n_heads] (null elsewhere).
  AttnShape shape{nh, nkv, hd, scale, c.attn_softcap, model->weights().layers[size_t(l)].attn_sinks};
  shape.bf16 = model->bf16_attention();
  const bool quant = kv.layout.quantized(), neox = c.rope == RopeStyle::Neox;
  const int G = kv.layout.group_tokens, window = c.layer_window[size_t(l)];
  const int tbl = kv.layout.table_of(l), slot = kv.layout.slot_of(l);
  const RopeKind& rk = ropes[size_t(c.layer_rope[size_t(l)])];
  const int64_t n_blocks = int64_t(plan.attn_blocks.size());
  // Later blocks of a chunk see more keys: they go first, so the tasks
  // left at the end are short ones and the threads finish together.
  pool->parallel_for(n_blocks * nkv, [&](int64_t task, int thread) {
    const auto [t0, tb] = plan.attn_blocks[size_t(n_blocks - 1 - task % n_blocks)];
    const int64_t t = t0 + tb - 1;  // the block's last token describes the block (attention.h)
    const int g = int(task / n_blocks);
    const ChunkPlan& ch = plan.chunks[size_t(plan.chunk_of[t])];
    const WindowView& wv = plan.view[t];
    AttnSeq as{ch.tables[tbl], plan.pos[t] + 1, plan.pos[t] + 1, nullptr, nullptr};
    as.sink_end = wv.sink_end;
    as.win_start = wv.win_start;
    as.window = window;
    if (ch.rotates) {
      as.rope_cos = rk.kcos.data();
      as.rope_sin = rk.ksin.data();
      as.shift = wv.shift;
      as.n_rot = c.n_rot;
      as.neox = neox;
    }
    if (quant) {
      // Complete groups from the cache, the token's own group in full precision.
      as.n_stored = plan.pos[t] / G * G;
      const int64_t row = ch.stage_row0 + (as.n_stored - ch.pos0 / G * G);  // [kvdim] row of n_stored
      as.own_k = &stage_k[size_t(row) * kvdim];
      as.own_v = &stage_v[size_t(row) * kvdim];
    }
    attention_group_block(&q[t0 * q_ld], size_t(q_ld), tb, kv, slot, as, g, shape, &att[t0 * q_ld], size_t(q_ld),
                          attn_scratch[thread].data());
  });
}

// RMSNorm (layer 0; the others' ran in the residual pass before them), then
// q [T, q_ld], k and v [T, kvdim] (one dispatch for the three) with their
// biases.
void Engine::Impl::qkv(int l) {
  const ModelConfig& c = cfg();
  const LayerWeights& L = model->weights().layers[l];
  const int64_t T = plan.n_tokens;
  const int dim = c.dim, qdim = c.n_heads * c.head_dim, kvdim = c.n_kv_heads * c.head_dim;
  if (l == 0) {  // later layers' input norms ran in the residual pass before them
    per_token([&](int64_t t) { rmsnorm(&x[t * dim], L.attn_norm, &xn[t * dim], dim, c.rms_eps); });
    lap(OpPhase::Norm);
  }
  mm_multi({{&L.wq, q.data(), q_ld}, {&L.wk, k.data(), kvdim}, {&L.wv, v.data(), kvdim}}, xn.data(), dim, T);
  add_bias(q.data(), q_ld, L.bq, T, qdim);
  add_bias(k.data(), kvdim, L.bk, T, kvdim);
  add_bias(v.data(), kvdim, L.bv, T, kvdim);
  lap(OpPhase::Qkv);
}

// Q/K/V, QK norms, RoPE, K/V into their slots, attention, output
// projection, post-attention norm, residual add with the FFN norm.
void Engine::Impl::attention_block(const KvStorage& kv, int l) {
  const ModelConfig& c = cfg();
  const LayerWeights& L = model->weights().layers[l];
  const int dim = c.dim, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads;
  const int kvdim = nkv * hd, n_rot = c.n_rot, bs = kv.layout.block_size;
  const bool quant = kv.layout.quantized(), neox = c.rope == RopeStyle::Neox;
  const RopeKind& rk = ropes[size_t(c.layer_rope[size_t(l)])];
  const int tbl = kv.layout.table_of(l), slot = kv.layout.slot_of(l);  // where layer l's K/V live
  qkv(l);
  per_token([&](int64_t t) {
    const float* cs = &rk.cos[t * (n_rot / 2)];
    const float* sn = &rk.sin[t * (n_rot / 2)];
    const ChunkPlan& ch = plan.chunks[size_t(plan.chunk_of[t])];
    // Per-head RMSNorm of q and k before RoPE (q_norm / k_norm: [head_dim]).
    if (L.q_norm)
      for (int h = 0; h < nh; ++h) rmsnorm(&q[t * q_ld + h * hd], L.q_norm, &q[t * q_ld + h * hd], hd, c.rms_eps);
    if (L.k_norm)
      for (int h = 0; h < nkv; ++h) rmsnorm(&k[t * kvdim + h * hd], L.k_norm, &k[t * kvdim + h * hd], hd, c.rms_eps);
    rope_apply(&q[t * q_ld], nh, hd, n_rot, neox, cs, sn);
    // Keys of a shifting window policy are stored before RoPE.
    if (!ch.rotates) rope_apply(&k[t * kvdim], nkv, hd, n_rot, neox, cs, sn);
    // Store this token's K/V in its slot (each token its own slot) before
    // any query reads it: the attention below starts after this barrier.
    if (!quant) {
      const int p = plan.pos[t];
      kvc::store_rows(kv, ch.tables[tbl][p / bs], slot, p % bs, 1, &k[t * kvdim], &v[t * kvdim]);
    }
  });
  if (quant) store_quantized(kv, l);
  lap(OpPhase::RopeKv);
  attend(kv, l);
  lap(OpPhase::Attention);
  mm(L.wo, att.data(), q_ld, plan.n_tokens, proj.data(), proj_ld);  // [T, dim]
  add_bias(proj.data(), proj_ld, L.bo, plan.n_tokens, dim);
  lap(OpPhase::AttnOut);
  residual(L.attn_post_norm, L.ffn_norm);
}

// proj (after its post-norm, where the model has one) into the residual
// stream x; then, where the next block's input norm is given, that norm of
// x into xn while the token's row is still cached (one pass, not two).
void Engine::Impl::residual(const float* post_norm, const float* next_norm) {
  const ModelConfig& c = cfg();
  const int dim = c.dim;
  per_token([&](int64_t t) {
    float* pt = &proj[t * proj_ld];
    if (post_norm) rmsnorm(pt, post_norm, pt, dim, c.rms_eps);
    add_inplace(&x[t * dim], pt, dim);
    if (next_norm) rmsnorm(&x[t * dim], next_norm, &xn[t * dim], dim, c.rms_eps);
  });
  lap(OpPhase::Residual);
}

// Gate/up of xn (the FFN norm, made in the attention's residual pass),
// SwiGLU or GeGLU, down projection (or the mixture of experts), post-FFN
// norm, residual add with the next layer's input norm.
void Engine::Impl::ffn_block(int l) {
  const ModelConfig& c = cfg();
  const LayerWeights& L = model->weights().layers[l];
  const int64_t T = plan.n_tokens;
  const int dim = c.dim, ffn = c.ffn_dim;
  const bool gelu = c.ffn_act == FfnAct::GeluTanh;
  if (c.moe.n_expert > 0) {  // xn: the FFN norm of x (the attention's residual pass)
    moe.forward(c.moe, L.moe, xn.data(), T, dim, proj.data(), *pool, exact);  // [T, dim]
    lap(OpPhase::Moe);
  } else {
    mm_multi({{&L.w_gate, gate.data(), ffn_ld}, {&L.w_up, up.data(), ffn_ld}}, xn.data(), dim, T);  // [T, ffn] each
    lap(OpPhase::FfnUp);
    if (exact || float_weights(L.w_down.type)) {
      per_token([&](int64_t t) {
        if (gelu) geglu_inplace(&gate[t * ffn_ld], &up[t * ffn_ld], ffn);
        else swiglu_inplace(&gate[t * ffn_ld], &up[t * ffn_ld], ffn);
      });
      lap(OpPhase::FfnAct);
      mm(L.w_down, gate.data(), ffn_ld, T, proj.data(), proj_ld);  // [T, dim]
    } else {
      // Quantized weights quantize the activation as it is made: its
      // time counts in ffn_down.
      matmul_glu(L.w_down, gate.data(), up.data(), ffn_ld, gelu ? Glu::GeGlu : Glu::SwiGlu, T, proj.data(), proj_ld,
                 *pool);  // [T, dim]
    }
    lap(OpPhase::FfnDown);
  }
  residual(L.ffn_post_norm, l + 1 < c.n_layers ? model->weights().layers[size_t(l) + 1].attn_norm : nullptr);
}

// Final norm and classifier only for the rows whose logits are wanted.
void Engine::Impl::output(std::vector<float>& logits) {
  const ModelConfig& c = cfg();
  const ModelWeights& w = model->weights();
  const int dim = c.dim;
  const int64_t n_out = int64_t(plan.out_rows.size());
  out_rows.resize(n_out * dim);  // [n_out, dim]
  for (int64_t o = 0; o < n_out; ++o) rmsnorm(&x[plan.out_rows[o] * dim], w.output_norm, &out_rows[o * dim], dim, c.rms_eps);
  logits.resize(size_t(n_out) * c.n_vocab);
  mm(w.output, out_rows.data(), dim, n_out, logits.data(), c.n_vocab);  // [n_out, n_vocab]
  if (c.final_softcap > 0.f)
    for (int64_t o = 0; o < n_out; ++o) softcap_inplace(&logits[size_t(o) * c.n_vocab], c.n_vocab, c.final_softcap);
}

void Engine::forward(const std::vector<SeqChunk>& batch, const KvStorage& kv, std::vector<float>& logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.cfg();
  if (kv.layout.n_layers != c.n_layers || kv.layout.n_kv_heads != c.n_kv_heads || kv.layout.head_dim != c.head_dim)
    throw std::invalid_argument("Engine::forward: KV layout does not match the model");
  // A table frees what its window hides: each of its layers must see no
  // further back than that (a full-size table fits every layer).
  for (int l = 0; l < c.n_layers && kv.layout.groups.hybrid(); ++l) {
    const int tw = kv.layout.groups.tables[size_t(kv.layout.table_of(l))].window;
    if (tw > 0 && c.layer_window[size_t(l)] != tw)
      throw std::invalid_argument("Engine::forward: KV table of layer " + std::to_string(l) + " keeps a " +
                                  std::to_string(tw) + "-token window, the layer's is " +
                                  std::to_string(c.layer_window[size_t(l)]));
  }
  m.lap_start();
  plan_batch(batch, c, kv.layout, m.plan);
  if (m.plan.n_tokens == 0) {
    logits.clear();
    return;
  }
  m.prepare(kv.layout);
  m.lap(OpPhase::Embed);
  m.stats.tokens += m.plan.n_tokens;
  for (int l = 0; l < c.n_layers; ++l) {
    m.attention_block(kv, l);
    m.ffn_block(l);
  }
  m.output(logits);
  m.lap(OpPhase::Output);
}

}  // namespace kvs
