// `kvserve convert`: llama2.c checkpoint + tokenizer -> GGUF (llama arch),
// giving the same logits when loaded.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "tools/make_model.h"

namespace kvs::cli {

namespace {

struct ConvertArgs {
  std::string bin, tokenizer, out, type = "f32";
};

}  // namespace

void add_convert(CLI::App& app, Runner& run) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* c = app.add_subcommand("convert", "Convert a llama2.c checkpoint (.bin + tokenizer) to GGUF");
  c->add_option("--bin", a->bin, "llama2.c checkpoint (.bin)")->required();
  c->add_option("--tokenizer", a->tokenizer,
                "llama2.c tokenizer file (default: tok<N>.bin or tokenizer.bin next to the checkpoint)");
  c->add_option("-o,--out", a->out, "Output .gguf path")->required();
  c->add_option("--type", a->type, "Tensor type of the 2-D weights: f32 (exact), f16, bf16, q8_0, q4_0, q4_1, "
                                   "q5_0, q5_1, q4_k, q5_k, q6_k, mxfp4; rows that do not fit the block size stay f16")->capture_default_str();
  c->callback([a, &run] {
    run = [a] {
      convert_llama2c(a->bin, a->tokenizer, a->out, parse_tensor_type(a->type));
      std::fprintf(stderr, "wrote %s\n", a->out.c_str());
      return 0;
    };
  });
}

}  // namespace kvs::cli
