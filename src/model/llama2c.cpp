// llama2.c checkpoints (.bin) and tokenizers (tok512.bin / tokenizer.bin).
// A checkpoint is a 7 x int32 header and float32 arrays in a fixed order; it
// has no magic, so the file size must match the header exactly before any
// weight is trusted. Weights are copied into one owned float buffer.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/loaders.h"
#include "model/vocab_loaders.h"

namespace kvs {

namespace {

std::string read_all(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open " + what);
  in.seekg(0, std::ios::end);
  const std::streamoff n = in.tellg();
  if (n < 0) throw ModelError(path + ": cannot read " + what);
  in.seekg(0);
  std::string s(static_cast<size_t>(n), '\0');
  if (!in.read(s.data(), n)) throw ModelError(path + ": cannot read " + what);
  return s;
}

bool is_byte_piece(const std::string& s) {
  // "<0xNN>" with two upper- or lower-case hex digits.
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && std::isxdigit(static_cast<unsigned char>(s[3])) &&
         std::isxdigit(static_cast<unsigned char>(s[4]));
}

std::string pick_tokenizer(const std::string& bin, int n_vocab) {
  const std::filesystem::path dir = std::filesystem::path(bin).parent_path();
  // Small llama2.c models ship tok<N>.bin (tok512.bin) beside them; the
  // Llama 2 vocabulary is tokenizer.bin.
  const std::vector<std::string> names = {"tok" + std::to_string(n_vocab) + ".bin", "tokenizer.bin"};
  for (const auto& n : names) {
    const auto p = dir / n;
    if (std::filesystem::exists(p)) return p.string();
  }
  throw ModelError(bin + ": llama2.c checkpoint needs its tokenizer: no tok" + std::to_string(n_vocab) + ".bin or tokenizer.bin in '" +
                   (dir.empty() ? std::string(".") : dir.string()) + "'; pass --tokenizer PATH");
}

}  // namespace

Vocab read_llama2c_vocab(const std::string& path, int n_vocab) {
  if (n_vocab <= 0) throw ModelError(path + ": invalid vocabulary size " + std::to_string(n_vocab));
  const std::string data = read_all(path, "llama2.c tokenizer");
  size_t pos = 0;
  auto take = [&](void* dst, size_t n, const std::string& what) {
    if (n > data.size() - pos)
      throw ModelError(path + ": truncated llama2.c tokenizer: " + what + " needs " + std::to_string(n) +
                       " bytes at offset " + std::to_string(pos) + " (file size " + std::to_string(data.size()) + ")");
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
  };
  int32_t max_len = 0;
  take(&max_len, 4, "max_token_length");
  if (max_len <= 0 || max_len > (1 << 20))
    throw ModelError(path + ": max_token_length " + std::to_string(max_len) + " is not plausible (not a llama2.c tokenizer?)");

  Vocab v;
  v.kind = VocabKind::Spm;
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = true;
  v.llama2c = true;
  v.tokens.reserve(n_vocab);
  v.scores.reserve(n_vocab);
  v.types.reserve(n_vocab);
  static const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  for (int i = 0; i < n_vocab; ++i) {
    const std::string tok = "token " + std::to_string(i);
    float score;
    int32_t len;
    take(&score, 4, tok + " score");
    take(&len, 4, tok + " length");
    if (len < 0 || len > max_len)
      throw ModelError(path + ": " + tok + " has length " + std::to_string(len) + " (max_token_length " +
                       std::to_string(max_len) + ")");
    std::string raw(static_cast<size_t>(len), '\0');
    take(raw.data(), raw.size(), tok + " bytes");
    // llama2.c's exporter writes BOS/EOS as "\n<s>\n" / "\n</s>\n"; GGUF and
    // SentencePiece call them "<s>" / "</s>".
    if (i == 1 || i == 2) {
      const size_t b = raw.find_first_not_of('\n'), e = raw.find_last_not_of('\n');
      if (b != std::string::npos) raw = raw.substr(b, e - b + 1);
    }
    std::string piece;
    piece.reserve(raw.size() + 8);
    for (char c : raw) {
      if (c == ' ') piece += kSpace;
      else piece += c;
    }
    TokenAttr type = TokenAttr::Normal;
    if (i == 0) type = TokenAttr::Unknown;
    else if (i == 1 || i == 2) type = TokenAttr::Control;
    else if (is_byte_piece(piece)) type = TokenAttr::Byte;
    v.tokens.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(static_cast<int32_t>(type));
  }
  if (pos != data.size())
    throw ModelError(path + ": llama2.c tokenizer has data after token " + std::to_string(n_vocab - 1) +
                     " (more tokens than the model's vocabulary of " + std::to_string(n_vocab) + "?)");
  return v;
}

namespace detail {

void load_llama2c(Model& m, const std::string& path, const std::string& tok) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open model file");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  int32_t h[7] = {};
  if (file_size < sizeof h || !in.read(reinterpret_cast<char*>(h), sizeof h))
    throw ModelError(path + ": not a GGUF file, and too short (" + std::to_string(file_size) +
                     " bytes) for a llama2.c checkpoint header");
  const int64_t dim = h[0], hidden = h[1], L = h[2], nh = h[3], nkv = h[4], seq = h[6];
  const bool tied = h[5] > 0;
  const int64_t vocab = h[5] < 0 ? -int64_t(h[5]) : h[5];
  auto bad = [&](const std::string& why) {
    throw ModelError(path + ": not a GGUF file, and not a valid llama2.c checkpoint: " + why +
                     " (header dim=" + std::to_string(dim) + " hidden_dim=" + std::to_string(hidden) +
                     " n_layers=" + std::to_string(L) + " n_heads=" + std::to_string(nh) + " n_kv_heads=" +
                     std::to_string(nkv) + " vocab_size=" + std::to_string(h[5]) + " seq_len=" + std::to_string(seq) + ")");
  };
  // Bounds keep every product below in int64 range.
  if (dim <= 0 || dim > (1 << 16)) bad("dim out of range");
  if (hidden <= 0 || hidden > (1 << 18)) bad("hidden_dim out of range");
  if (L <= 0 || L > 1024) bad("n_layers out of range");
  if (nh <= 0 || nh > dim || dim % nh != 0) bad("n_heads does not divide dim");
  if (nkv <= 0 || nkv > nh || nh % nkv != 0) bad("n_kv_heads does not divide n_heads");
  if (vocab <= 0 || vocab > (1 << 22)) bad("vocab_size out of range");
  if (seq <= 0 || seq > (1 << 22)) bad("seq_len out of range");
  const int64_t hs = dim / nh, kv_dim = nkv * hs;
  if (hs % 2 != 0) bad("head size is odd");

  // Float offsets of each array, in file order.
  int64_t off = 0;
  auto take = [&](int64_t n) {
    const int64_t o = off;
    off += n;
    return o;
  };
  const int64_t o_emb = take(vocab * dim);       // [vocab, dim]
  const int64_t o_rms_att = take(L * dim);       // [L, dim]
  const int64_t o_wq = take(L * dim * dim);      // [L, dim, dim]
  const int64_t o_wk = take(L * kv_dim * dim);   // [L, kv_dim, dim]
  const int64_t o_wv = take(L * kv_dim * dim);   // [L, kv_dim, dim]
  const int64_t o_wo = take(L * dim * dim);      // [L, dim, dim]
  const int64_t o_rms_ffn = take(L * dim);       // [L, dim]
  const int64_t o_w1 = take(L * hidden * dim);   // [L, hidden, dim]
  const int64_t o_w2 = take(L * dim * hidden);   // [L, dim, hidden]
  const int64_t o_w3 = take(L * hidden * dim);   // [L, hidden, dim]
  const int64_t o_rms_final = take(dim);         // [dim]
  take(seq * hs);                                // freq_cis_real + freq_cis_imag [seq, hs/2] each: unused
  const int64_t o_wcls = tied ? o_emb : take(vocab * dim);  // [vocab, dim]
  const uint64_t expect = sizeof h + static_cast<uint64_t>(off) * 4;
  if (file_size != expect)
    bad("file size " + std::to_string(file_size) + " bytes, the header implies " + std::to_string(expect) +
        (tied ? " (tied classifier)" : " (untied classifier)"));

  // Load all floats except the 28-byte header into one owned buffer.
  auto& buf = m.owned_f32_.emplace_back(static_cast<size_t>(off));
  if (!in.read(reinterpret_cast<char*>(buf.data()), off * 4)) throw ModelError(path + ": read failed");
  const float* base = buf.data();

  ModelConfig& c = m.cfg_;
  c.arch = "llama";
  c.name = std::filesystem::path(path).stem().string();
  c.n_vocab = static_cast<int>(vocab);
  c.dim = static_cast<int>(dim);
  c.n_layers = static_cast<int>(L);
  c.n_heads = static_cast<int>(nh);
  c.n_kv_heads = static_cast<int>(nkv);
  c.head_dim = static_cast<int>(hs);
  c.ffn_dim = static_cast<int>(hidden);
  c.n_ctx_train = static_cast<int>(seq);
  c.n_rot = static_cast<int>(hs);  // run.c rotates every pair (2i, 2i+1) of each head
  c.rope_theta = 10000.f;
  c.rms_eps = 1e-5f;
  c.rope = RopeStyle::Normal;
  c.has_qkv_bias = false;
  c.tied_output = tied;
  c.sliding_window = 0;
  c.ropes = {RopeConfig{}};
  c.n_ctx_orig = c.n_ctx_train;
  c.layer_window.assign(size_t(L), 0);
  c.layer_rope.assign(size_t(L), 0);
  c.weight_bytes = static_cast<size_t>(off - seq * hs) * 4;  // everything but the RoPE tables

  auto mat = [&](int64_t o, int64_t rows, int64_t cols) {
    WeightView w;
    w.type = GgmlType::F32;
    w.data = base + o;
    w.rows = rows;
    w.cols = cols;
    w.row_stride = static_cast<size_t>(cols) * 4;
    return w;
  };
  ModelWeights& w = m.w_;
  w.tok_embd = mat(o_emb, vocab, dim);
  w.output = mat(o_wcls, vocab, dim);
  w.output_norm = base + o_rms_final;
  w.layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights& Lw = w.layers[l];
    Lw.attn_norm = base + o_rms_att + l * dim;
    Lw.wq = mat(o_wq + l * dim * dim, dim, dim);
    Lw.wk = mat(o_wk + l * kv_dim * dim, kv_dim, dim);
    Lw.wv = mat(o_wv + l * kv_dim * dim, kv_dim, dim);
    Lw.wo = mat(o_wo + l * dim * dim, dim, dim);
    Lw.ffn_norm = base + o_rms_ffn + l * dim;
    Lw.w_gate = mat(o_w1 + l * hidden * dim, hidden, dim);  // w1
    Lw.w_down = mat(o_w2 + l * dim * hidden, dim, hidden);  // w2
    Lw.w_up = mat(o_w3 + l * hidden * dim, hidden, dim);    // w3
  }

  m.path_ = path;
  m.vocab_ = read_llama2c_vocab(tok.empty() ? pick_tokenizer(path, c.n_vocab) : tok, c.n_vocab);
  m.identity_ = model_identity(c, file_size, path);
}

}  // namespace detail

}  // namespace kvs
