// Mixture-of-experts feed-forward layer over a batch of token rows (Mixtral-
// style llama, qwen2moe, qwen3moe, gpt-oss), as llama.cpp computes it:
//
//   logits [T, n_expert] = xn · router^T (+ router bias)
//   per token: k experts and their weights (MoeGating; optionally rescaled
//     to sum 1), in descending order of the routing score, ties to the lower
//     expert id
//   per chosen expert e: h = act(xn · gate_e^T + bg_e, xn · up_e^T + bu_e)
//                        d_e = h · down_e^T + bd_e
//   out = w_0 d_0 + w_1 d_1 + ... (in that order, each product rounded)
//         + sigmoid(xn · sh_gate_inp) * shared(xn)   (shared expert, if any)
//
// Scheduling (MoeFfn::forward): tokens are grouped by expert, so each
// expert's matrices are read once per step for all the rows routed to it;
// the gate/up products of every active expert (and of the shared expert) run
// as one pool dispatch (matmul_grouped), then the down products as another.
// A row's products do not depend on the other rows of its group
// (kernels/matmul.h), and each token sums its experts in its own fixed
// order, so a token's output is bit-identical alone or in any batch.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/huge_pages.h"
#include "kernels/matmul.h"
#include "model/model.h"

namespace kvs {

class ThreadPool;

// One token's routing: ids [k] and weights [k] (k = c.n_used) from its
// logits [n_expert]. scratch: [n_expert] floats.
void moe_route(const MoeConfig& c, const float* logits, int32_t* ids, float* weights, float* scratch);

// In place over one row: g[i] = act(g[i], u[i]) (MoeActivation).
void moe_activation(const MoeConfig& c, float* g, const float* u, int n);

// The layer's scratch buffers, kept across steps (one per engine).
class MoeFfn {
 public:
  // out [T, dim]: the MoE output for the normalized rows xn [T, dim] (the
  // residual add is the caller's). `exact`: quantized weights multiply float
  // activations against exactly dequantized rows (EngineOptions::exact).
  void forward(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, float* out,
               ThreadPool& pool, bool exact = false);

 private:
  void route(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, ThreadPool& pool,
             bool exact);
  void group(const MoeConfig& c, const float* xn, int64_t T, int dim, ThreadPool& pool);
  void experts(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, ThreadPool& pool,
               bool exact);
  void combine(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, float* out,
               ThreadPool& pool);

  std::vector<float> logits_;          // [T, n_expert]
  std::vector<int32_t> ids_;           // [T, k] chosen experts
  std::vector<float> weights_;         // [T, k] their weights
  std::vector<float> route_scratch_;   // [threads, n_expert]
  std::vector<int64_t> first_;         // [n_expert + 1] first sorted row of each expert
  std::vector<int64_t> cursor_;        // [n_expert] next free sorted row while sorting
  std::vector<int64_t> row_of_;        // [T, k] sorted row of (token, j)
  std::vector<int32_t> token_of_;      // [P] token of each sorted row (P = T k)
  std::vector<int32_t> expert_of_;     // [P] expert of each sorted row
  LargeVec<float> xg_;                 // [P, dim] gathered inputs, grouped by expert
  LargeVec<float> hg_, ug_;            // [P, ffn_exp] gate / up
  LargeVec<float> dg_;                 // [P, dim] down outputs
  LargeVec<float> sg_, su_, sd_;       // shared expert: [T, shared_ffn] x2, [T, dim]
  std::vector<MatmulGroup> groups_;    // the products of one dispatch
};

// Scalar reference: token by token, each product by matmul_q8_reference
// (the algorithm every fast path computes bit for bit), routing re-derived
// with a full sort. MoeFfn::forward must equal it bitwise.
void moe_ffn_reference(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, float* out);

}  // namespace kvs
