// Chat templates: format detection from real template sources and the exact prompt text of each
// format (expected strings written from the formats' Jinja templates).
#include <gtest/gtest.h>

#include "text/chat_template.h"

namespace vq {
namespace {

// SmolLM2-135M-Instruct's tokenizer.chat_template (from its GGUF).
const char* kSmolLM2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// Qwen2.5-style: escaped newlines and the default system prompt in the non-tool branch.
const char* kQwen25 =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- endif %}{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}";

const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const char* kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
    "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() "
    "+ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

const char* kZephyr =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}"
    "\n{% endif %}{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", " What is 2+2? "}};

TEST(ChatTemplate, DetectsFormats) {
  EXPECT_EQ(detect_chat_format(kSmolLM2), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format(kQwen25), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format(kLlama3), ChatFormat::Llama3);
  EXPECT_EQ(detect_chat_format(kLlama2), ChatFormat::Llama2);
  EXPECT_EQ(detect_chat_format(kZephyr), ChatFormat::Zephyr);
  EXPECT_EQ(detect_chat_format(""), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format("{{ something unknown }}"), ChatFormat::ChatML);
  EXPECT_STREQ(chat_format_name(ChatFormat::Llama3), "llama3");
}

TEST(ChatTemplate, ChatMLWithDefaultSystemPrompt) {
  const ChatTemplate t = parse_chat_template(kSmolLM2);
  EXPECT_EQ(t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(format_chat(t, {{"user", "Hi!"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  // A given system message replaces the default one.
  EXPECT_EQ(format_chat(t, kConversation, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n What is 2+2? <|im_end|>\n");
  EXPECT_EQ(parse_chat_template(kQwen25).default_system,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(parse_chat_template("").default_system, "");
  EXPECT_EQ(format_chat(parse_chat_template(""), {{"user", "x"}}, true),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(format_chat(parse_chat_template(kLlama3), kConversation, true),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama2WithSystemBlock) {
  const ChatTemplate t = parse_chat_template(kLlama2, "<s>", "</s>");
  EXPECT_EQ(format_chat(t, kConversation, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]");
  EXPECT_EQ(format_chat(t, {{"user", "Hi"}}, true), "[INST] Hi [/INST]");
}

// The Gemma 3 instruct template's markers (the 270M GGUF of the tests ships none: see
// GemmaFromVocabulary in test_tokenizer_gguf.cpp).
TEST(ChatTemplate, Gemma) {
  const char* src = "{{ bos_token }}{%- for message in loop_messages -%}{{ '<start_of_turn>' + role + '\\n' }}"
                    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor -%}";
  EXPECT_EQ(detect_chat_format(src), ChatFormat::Gemma);
  EXPECT_STREQ(chat_format_name(ChatFormat::Gemma), "gemma");
  const ChatTemplate t = parse_chat_template(src);
  // system text prefixes the first user turn; assistant is "model"; contents are trimmed
  EXPECT_EQ(format_chat(t, kConversation, true),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(format_chat(t, {{"user", "Hi"}}, false), "<start_of_turn>user\nHi<end_of_turn>\n");
}

TEST(ChatTemplate, Zephyr) {
  const ChatTemplate t = parse_chat_template(kZephyr, "<s>", "</s>");
  EXPECT_EQ(format_chat(t, {{"user", "Hi!"}}, true), "<|user|>\nHi!</s>\n<|assistant|>\n");
}

}  // namespace
}  // namespace vq
