// Chat templates without a model: the start-up choice (the model's Jinja
// template, a named variant, a file, a hand-written family, and their
// errors), the BOS rule, content in the form a template reads, template
// errors as a ChatTemplateError, and the rendered prompt of each family.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "server/chat_template.h"
#include "tokenizer/vocab.h"

using namespace kvs::server;
using nlohmann::ordered_json;

namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Tell a story"}};

// A vocabulary with BOS "<s>" (added by the tokenizer) and EOS "</s>".
kvs::Vocab vocab_with(const std::string& chat_template, bool add_bos = true) {
  kvs::Vocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "a"};
  v.bos = 1;
  v.eos = 2;
  v.add_bos = add_bos;
  v.chat_template = chat_template;
  return v;
}

ChatInputs user_says(const ordered_json& content) {
  ChatInputs in;
  in.messages = ordered_json::array({{{"role", "user"}, {"content", content}}});
  return in;
}

const char* kChatml =
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

}  // namespace

TEST(ChatTemplate, NamesRoundTrip) {
  for (ChatFamily f : {ChatFamily::Llama2, ChatFamily::Llama3, ChatFamily::ChatML, ChatFamily::Mistral,
                       ChatFamily::Plain})
    EXPECT_EQ(parse_chat_family(to_string(f)), f);
  EXPECT_EQ(parse_chat_family("qwen"), ChatFamily::ChatML);
  EXPECT_FALSE(parse_chat_family("jinja"));
}

TEST(ChatTemplate, AutoRendersTheModelsOwnTemplate) {
  std::string note;
  const ChatTemplate t = ChatTemplate::choose("auto", vocab_with(kChatml), &note);
  EXPECT_FALSE(t.family());
  EXPECT_NE(note.find("tokenizer.chat_template"), std::string::npos) << note;
  // The tokenizer adds BOS itself: the template's leading "<s>" is dropped
  // from the prompt text, kept in the raw render.
  EXPECT_EQ(t.render(user_says("Hi")), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render_raw(user_says("Hi")), "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const ChatTemplate keep = ChatTemplate::choose("auto", vocab_with(kChatml, false), nullptr);
  EXPECT_EQ(keep.render(user_says("Hi")).rfind("<s><|im_start|>", 0), 0u);
}

TEST(ChatTemplate, AutoWithoutATemplateIsThePlainFallback) {
  std::string note;
  const ChatTemplate t = ChatTemplate::choose("auto", vocab_with(""), &note);
  EXPECT_EQ(t.family(), ChatFamily::Plain);
  EXPECT_NE(note.find("plain"), std::string::npos);
  EXPECT_EQ(t.render(user_says("Hi")), "user: Hi\nassistant:");
}

TEST(ChatTemplate, NamedFamilyVariantAndFile) {
  kvs::Vocab v = vocab_with(kChatml);
  v.chat_template_variants = {{"tool_use", "TOOLS{% for m in messages %}[{{ m.content }}]{% endfor %}"}};
  std::string note;
  EXPECT_EQ(ChatTemplate::choose("llama3", v, &note).family(), ChatFamily::Llama3);
  EXPECT_NE(note.find("--chat-template"), std::string::npos);
  EXPECT_EQ(ChatTemplate::choose("tool_use", v, &note).render(user_says("x")), "TOOLS[x]");
  const std::string path = testing::TempDir() + "kvs_chat_template_test.jinja";
  {
    std::ofstream f(path);
    f << "FILE{{ messages[0].content | upper }}";
  }
  EXPECT_EQ(ChatTemplate::choose(path, v, &note).render(user_says("hi")), "FILEHI");
  std::remove(path.c_str());
  try {
    ChatTemplate::choose("bogus", v, nullptr);
    FAIL() << "an unknown name must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tool_use"), std::string::npos) << "the error lists the file's variants";
  }
}

TEST(ChatTemplate, ATemplateThatDoesNotParseIsRefusedAtStartUp) {
  EXPECT_THROW(ChatTemplate::choose("auto", vocab_with("{% for m in messages %}no end"), nullptr), std::runtime_error);
  EXPECT_THROW(ChatTemplate::jinja("{{ 1 + }}", "t", vocab_with("")), ChatTemplateError);
}

TEST(ChatTemplate, RenderErrorsNameTheLineAndTellRaiseFromBugs) {
  const kvs::Vocab v = vocab_with("");
  const ChatTemplate raising = ChatTemplate::jinja(
      "line one\n{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}", "t", v);
  try {
    raising.render(user_says("x"));
    FAIL();
  } catch (const ChatTemplateError& e) {
    EXPECT_TRUE(e.raised());
    EXPECT_NE(std::string(e.what()).find("system first"), std::string::npos) << e.what();
  }
  const ChatTemplate buggy = ChatTemplate::jinja("a\nb\n{{ messages[0].content + 1 }}", "t", v);
  try {
    buggy.render(user_says("x"));
    FAIL();
  } catch (const ChatTemplateError& e) {
    EXPECT_FALSE(e.raised());
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, ContentArrivesInTheFormTheTemplateReads) {
  const kvs::Vocab v = vocab_with("");
  const ordered_json parts = ordered_json::array({{{"type", "text"}, {"text", "A"}}, {{"type", "text"}, {"text", "B"}}});
  // A template that prints strings gets text parts joined, one line each
  // (as vLLM joins them; glued, "A" "B" read "AB"), as do the hand-written ones.
  const ChatTemplate strings = ChatTemplate::jinja("{{ messages[0].content }}", "t", v);
  EXPECT_EQ(strings.render(user_says(parts)), "A\nB");
  EXPECT_EQ(ChatTemplate::fixed(ChatFamily::Plain).render(user_says(parts)), "user: A\nB\nassistant:");
  // One that only reads parts gets a string as one text part.
  const ChatTemplate reads_parts =
      ChatTemplate::jinja("{% for p in messages[0].content %}<{{ p.text }}>{% endfor %}", "t", v);
  EXPECT_EQ(reads_parts.render(user_says("S")), "<S>");
  EXPECT_EQ(reads_parts.render(user_says(parts)), "<A><B>");
  // A tool-calling assistant turn's null content is empty text (Qwen3's
  // template tests it with `in`, which null would fail).
  const ChatTemplate tests_in = ChatTemplate::jinja("{% if '</think>' in messages[0].content %}T{% endif %}ok", "t", v);
  EXPECT_EQ(tests_in.render(user_says(nullptr)), "ok");
}

TEST(ChatTemplate, ToolsAndExtraVariablesReachTheTemplate) {
  const ChatTemplate t = ChatTemplate::jinja(
      "{% if tools %}{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}"
      "{{ enable_thinking | default(true) }}",
      "t", vocab_with(""));
  ChatInputs in = user_says("x");
  EXPECT_EQ(t.render(in), "True");
  in.tools = ordered_json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}}});
  in.extra = {{"enable_thinking", false}};
  EXPECT_EQ(t.render(in), "get_weather;False");
}

TEST(ChatTemplate, RendersEachFamily) {
  EXPECT_EQ(render_chat(ChatFamily::ChatML, kChat),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFamily::Llama3, {{"user", "Hi"}}),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat(ChatFamily::Llama2, kChat),
            "[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Tell a story [/INST]");
  EXPECT_EQ(render_chat(ChatFamily::Mistral, kChat), "[INST] Be kind.\n\nHi [/INST] Hello! </s><s>[INST] Tell a story [/INST]");
  EXPECT_EQ(render_chat(ChatFamily::Plain, {{"user", "Hi"}}), "user: Hi\nassistant:");
}

TEST(ChatTemplate, SystemTextsJoin) {
  const std::vector<ChatMessage> two_sys = {{"system", "A."}, {"system", "B."}, {"user", "Q"}};
  EXPECT_EQ(render_chat(ChatFamily::Mistral, two_sys), "[INST] A.\nB.\n\nQ [/INST]");
}
