// Chat templates without a model: family detection from template text, the
// start-up choice (and its errors), and the rendered prompt of each family.
#include <gtest/gtest.h>

#include <stdexcept>

#include "server/chat_template.h"

using namespace kvs::server;

namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Tell a story"}};

}  // namespace

TEST(ChatTemplate, NamesRoundTrip) {
  for (ChatFamily f : {ChatFamily::Llama2, ChatFamily::Llama3, ChatFamily::ChatML, ChatFamily::Mistral,
                       ChatFamily::Plain})
    EXPECT_EQ(parse_chat_family(to_string(f)), f);
  EXPECT_EQ(parse_chat_family("qwen"), ChatFamily::ChatML);
  EXPECT_FALSE(parse_chat_family("jinja"));
}

TEST(ChatTemplate, DetectsFamiliesFromTemplateText) {
  EXPECT_EQ(detect_chat_family("{{'<|start_header_id|>' + role + '<|end_header_id|>'}}{{'<|eot_id|>'}}"),
            ChatFamily::Llama3);
  EXPECT_EQ(detect_chat_family("{% for m in messages %}<|im_start|>{{m.role}}{% endfor %}"), ChatFamily::ChatML);
  EXPECT_EQ(detect_chat_family("[INST] <<SYS>>{{system}}<</SYS>> {{user}} [/INST]"), ChatFamily::Llama2);
  EXPECT_EQ(detect_chat_family("[INST] {{user}} [/INST]"), ChatFamily::Mistral);
  EXPECT_FALSE(detect_chat_family("{{ messages }}"));
}

TEST(ChatTemplate, ChoiceAtStartUp) {
  std::string note;
  EXPECT_EQ(choose_chat_family("auto", "", &note), ChatFamily::Plain);
  EXPECT_NE(note.find("plain"), std::string::npos);
  EXPECT_EQ(choose_chat_family("auto", "<|im_start|>", &note), ChatFamily::ChatML);
  EXPECT_NE(note.find("detected"), std::string::npos);
  EXPECT_EQ(choose_chat_family("llama3", "<|im_start|>", &note), ChatFamily::Llama3);
  EXPECT_NE(note.find("--chat-template"), std::string::npos);
  EXPECT_THROW(choose_chat_family("auto", "{{ unknown }}", nullptr), std::runtime_error);
  EXPECT_THROW(choose_chat_family("bogus", "", nullptr), std::runtime_error);
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
