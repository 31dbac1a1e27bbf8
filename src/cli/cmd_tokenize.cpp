// `kvserve tokenize`: text -> token ids with a model's vocabulary. Reads only
// the vocabulary (GgufFile + vocab_from_gguf, or a llama2.c tokenizer file),
// never the weights, so vocab-only GGUF files work too.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/gguf.h"
#include "model/vocab_loaders.h"
#include "tokenizer/special.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace kvs::cli {

namespace {

struct TokenizeArgs {
  std::string model, tokenizer, prompt, file;
  bool json = false, no_bos = false, special = false;
};

// A llama2.c checkpoint starts with 7 int32s; the 6th is the vocabulary size
// (negative when the classifier is not shared with the embedding).
int llama2c_vocab_size(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  int32_t h[7];
  if (!f.read(reinterpret_cast<char*>(h), sizeof h))
    throw std::runtime_error("'" + path + "' is neither GGUF nor a llama2.c checkpoint (file too short)");
  const int64_t n = h[5] < 0 ? -static_cast<int64_t>(h[5]) : h[5];
  if (n <= 0 || n > (1 << 24))
    throw std::runtime_error("'" + path + "' is neither GGUF nor a llama2.c checkpoint (vocab_size " +
                             std::to_string(h[5]) + ")");
  return static_cast<int>(n);
}

Vocab load_vocab(const TokenizeArgs& a) {
  char magic[4] = {};
  {
    std::ifstream f(a.model, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open model '" + a.model + "'");
    f.read(magic, 4);
  }
  if (std::string(magic, 4) == "GGUF") return vocab_from_gguf(*GgufFile::open(a.model));

  const int n_vocab = llama2c_vocab_size(a.model);
  std::string tok = a.tokenizer;
  if (tok.empty()) {
    const auto dir = std::filesystem::path(a.model).parent_path();
    for (const std::string& name : {"tok" + std::to_string(n_vocab) + ".bin", std::string("tokenizer.bin")}) {
      if (std::filesystem::exists(dir / name)) {
        tok = (dir / name).string();
        break;
      }
    }
    if (tok.empty())
      throw std::runtime_error("llama2.c model '" + a.model + "': no tok" + std::to_string(n_vocab) +
                               ".bin or tokenizer.bin beside it; pass --tokenizer FILE");
  }
  return read_llama2c_vocab(tok, n_vocab);
}

int run_tokenize(const TokenizeArgs& a) {
  const std::unique_ptr<Tokenizer> tok = Tokenizer::create(load_vocab(a));
  const std::string text = a.file.empty() ? a.prompt : read_text_file(a.file);
  const std::vector<int> ids = tok->encode(text, !a.no_bos, a.special);
  if (!a.json) {
    std::string line;
    for (int id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", line.c_str());
    return 0;
  }
  nlohmann::json pieces = nlohmann::json::array();
  for (int id : ids) {
    // Control tokens show their name ("<s>") rather than nothing.
    const bool control = token_attr(tok->vocab(), id) == TokenAttr::Control;
    pieces.push_back(control ? tok->vocab().tokens[static_cast<size_t>(id)] : tok->token_bytes(id, -1));
  }
  const nlohmann::json j{{"tokens", ids}, {"pieces", pieces}};
  // A byte token may be half a character: replace rather than throw.
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app, Runner& run) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* c = app.add_subcommand("tokenize", "Print the token ids of a text (vocabulary only; BOS as the model adds it)");
  c->add_option("-m,--model", a->model, "GGUF file (vocab-only is fine) or llama2.c .bin checkpoint")->required();
  c->add_option("--tokenizer", a->tokenizer, "llama2.c tokenizer file for .bin models (default: tok<N>.bin or tokenizer.bin beside it)");
  auto* p = c->add_option("-p,--prompt", a->prompt, "Text to tokenize");
  auto* f = c->add_option("-f,--file", a->file, "File whose contents to tokenize")->check(CLI::ExistingFile);
  p->excludes(f);
  f->excludes(p);
  c->add_flag("--json", a->json, "Print {\"tokens\":[...],\"pieces\":[...]}");
  c->add_flag("--no-bos", a->no_bos, "Do not add BOS even if the model does");
  c->add_flag("--special", a->special, "Recognise special-token text such as <|im_start|>");
  c->callback([a, p, f, &run] {
    if (p->count() == 0 && f->count() == 0) throw CLI::RequiredError("-p TEXT or -f FILE");
    run = [a] { return run_tokenize(*a); };
  });
}

}  // namespace kvs::cli
