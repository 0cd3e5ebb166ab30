#include "server/api.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <random>
#include <cctype>
#include <set>

#include "text/chat_template.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace vq {
namespace {

using nlohmann::json;

const char* status_type(int status) {
  switch (status) {
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "server_busy";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

double number(const json& v, const char* name, double lo, double hi) {
  if (!v.is_number()) bad(name, std::string("'") + name + "' must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(name, fmt::format("'{}' is {} but must be in [{}, {}]", name, x, lo, hi));
  return x;
}

int64_t integer(const json& v, const char* name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(name, std::string("'") + name + "' must be an integer");
  // Unsigned values past int64 and signed ones alike are compared as doubles first.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))
    bad(name, fmt::format("'{}' is {} but must be in [{}, {}]", name, v.get<uint64_t>(), lo, hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(name, fmt::format("'{}' is {} but must be in [{}, {}]", name, x, lo, hi));
  return x;
}

bool boolean(const json& v, const char* name) {
  if (!v.is_boolean()) bad(name, std::string("'") + name + "' must be true or false");
  return v.get<bool>();
}

std::string text_of(const json& v, const char* name) {
  if (!v.is_string()) bad(name, std::string("'") + name + "' must be a string");
  return v.get<std::string>();
}

std::vector<std::string> parse_stop(const json& v) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > 4) bad("stop", "'stop' takes at most 4 strings");
    for (const json& s : v) out.push_back(text_of(s, "stop"));
  } else {
    bad("stop", "'stop' must be a string or an array of strings");
  }
  for (const std::string& s : out)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
  return out;
}

std::vector<int32_t> parse_prompt(const json& v, const Tokenizer& tok) {
  // A string, an array of token ids, or an array holding one string.
  if (v.is_array() && v.size() == 1 && v[0].is_string()) return parse_prompt(v[0], tok);
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s.empty()) bad("prompt", "'prompt' must not be empty");
    return tok.encode(s, tok.add_bos_default(), true);
  }
  if (v.is_array() && !v.empty()) {
    std::vector<int32_t> ids;
    for (const json& t : v) {
      if (!t.is_number_integer()) bad("prompt", "'prompt' must be a string or an array of token ids");
      ids.push_back(int32_t(integer(t, "prompt", 0, tok.n_vocab() - 1)));
    }
    return ids;
  }
  bad("prompt", "'prompt' must be a non-empty string or array of token ids (one prompt per request)");
}

std::string content_of(const json& c) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) bad("messages", "a message's 'content' must be a string or an array of text parts");
  std::string s;
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad("messages", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    s += part["text"].get<std::string>();
  }
  return s;
}

std::vector<int32_t> parse_messages(const json& v, const Tokenizer& tok) {
  if (!v.is_array() || v.empty()) bad("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> msgs;
  for (const json& m : v) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("messages", "each message must be an object with a 'role' string");
    for (const auto& [k, x] : m.items())
      if (k != "role" && k != "content" && k != "name") bad("messages", "unsupported message field '" + k + "'");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      bad("messages", "message role '" + role + "' is not supported (system, developer, user, assistant)");
    msgs.push_back({role == "developer" ? "system" : role, content_of(m.value("content", json()))});
  }
  const std::string text = apply_chat_template(tok, msgs, true);
  return tok.encode(text, tok.add_bos_default(), true);
}

// Fields accepted only at their default (OpenAI's meaning without them).
void check_defaults(const json& body) {
  auto must = [&](const char* k, auto&& is_default, const char* what) {
    if (body.contains(k) && !body[k].is_null() && !is_default(body[k]))
      bad(k, std::string("'") + k + "' " + what + " is not supported by this server");
  };
  must("n", [](const json& x) { return x == 1; }, "other than 1");
  must("best_of", [](const json& x) { return x == 1; }, "other than 1");
  must("echo", [](const json& x) { return x == false; }, "= true");
  must("presence_penalty", [](const json& x) { return x.is_number() && x.get<double>() == 0; }, "other than 0");
  must("frequency_penalty", [](const json& x) { return x.is_number() && x.get<double>() == 0; }, "other than 0");
  must("logit_bias", [](const json& x) { return x.is_object() && x.empty(); }, "(non-empty)");
  must("suffix", [](const json& x) { return x.is_string() && x.get<std::string>().empty(); }, "(non-empty)");
  must("tools", [](const json& x) { return x.is_array() && x.empty(); }, "(tool calls)");
  must("tool_choice", [](const json& x) { return x == "none"; }, "(tool calls)");
  must("response_format", [](const json& x) { return x.is_object() && x.value("type", "") == "text"; },
       "other than {\"type\": \"text\"}");
  // SGLang's fields, as its router sends them: what this server does anyway is accepted, the rest
  // refused. Reasoning separation needs a reasoning parser (SGLang's too): a no-op either way here.
  must("no_stop_trim", [](const json& x) { return x == false; }, "= true");
  must("skip_special_tokens", [](const json& x) { return x == true; }, "= false");
  must("return_hidden_states", [](const json& x) { return x == false; }, "= true");
  must("continue_final_message", [](const json& x) { return x == false; }, "= true");
  must("separate_reasoning", [](const json& x) { return x.is_boolean(); }, "(not a boolean)");
  must("stream_reasoning", [](const json& x) { return x.is_boolean(); }, "(not a boolean)");
}

}  // namespace

std::string error_body(int status, const std::string& message, const std::string& type, const std::string& param) {
  json e = {{"message", message},
            {"type", type.empty() || (type == "invalid_request_error" && status != 400) ? status_type(status) : type},
            {"param", param.empty() ? json() : json(param)},
            {"code", status}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool valid_session_name(const std::string& s) {
  if (s.empty() || s.size() > 64 || s[0] == '.') return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

GenParams parse_generation(const json& body, bool chat, const Model& model, const ApiLimits& lim) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "stop", "stream",
      "stream_options", "n", "best_of", "echo", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
      "top_logprobs", "user", "suffix", "ignore_eos", "session", "return_token_ids", "metadata", "store",
      // SGLang's router (sglang-router, issue 24) forwards these with every request, at its defaults.
      "no_stop_trim", "skip_special_tokens", "return_hidden_states"};
  static const std::set<std::string> chat_only = {"messages", "max_completion_tokens", "tools", "tool_choice",
                                                  "response_format", "parallel_tool_calls",
                                                  "continue_final_message", "separate_reasoning", "stream_reasoning"};
  for (const auto& [k, v] : body.items()) {
    const bool ok = common.count(k) || (chat ? chat_only.count(k) : k == "prompt");
    if (!ok) bad(k, "unknown field '" + k + "'");
  }
  check_defaults(body);
  if (body.contains("model") && !body["model"].is_string()) bad("model", "'model' must be a string");
  const Tokenizer& tok = model.tokenizer();
  GenParams p;
  p.chat = chat;
  if (chat) {
    if (!body.contains("messages")) bad("messages", "'messages' is required");
    p.prompt = parse_messages(body["messages"], tok);
  } else {
    if (!body.contains("prompt")) bad("prompt", "'prompt' is required");
    p.prompt = parse_prompt(body["prompt"], tok);
  }
  if (p.prompt.empty()) bad(chat ? "messages" : "prompt", "the prompt encodes to no tokens");
  const int64_t room = int64_t(lim.n_ctx) - int64_t(p.prompt.size());
  if (room < 1)
    throw ApiError(400, fmt::format("the prompt has {} tokens; this server's context is {} tokens", p.prompt.size(), lim.n_ctx),
                   chat ? "messages" : "prompt", "context_length_exceeded");
  // Completions default to 16 new tokens (OpenAI); chat to the rest of the context.
  p.max_tokens = chat ? int(room) : int(std::min<int64_t>(16, room));
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (body.contains(k) && !body[k].is_null()) {
      const int64_t m = integer(body[k], k, 1, INT32_MAX);
      if (m > room)
        throw ApiError(400, fmt::format("'{}' is {}, but the prompt ({} tokens) leaves {} of the {}-token context", k, m,
                                        p.prompt.size(), room, lim.n_ctx), k, "context_length_exceeded");
      p.max_tokens = int(m);
    }
  // OpenAI's sampling: temperature 1, no top-k, no min-p unless asked.
  p.sampling.temp = 1.0f;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1.0f;
  p.sampling.min_p = 0.0f;
  p.sampling.seed = std::random_device{}();
  auto has = [&](const char* k) { return body.contains(k) && !body[k].is_null(); };
  if (has("temperature")) p.sampling.temp = float(number(body["temperature"], "temperature", 0, 2));
  if (has("top_p")) p.sampling.top_p = float(number(body["top_p"], "top_p", 0, 1));
  if (has("top_k")) p.sampling.top_k = int(integer(body["top_k"], "top_k", 0, 1 << 20));
  if (has("min_p")) p.sampling.min_p = float(number(body["min_p"], "min_p", 0, 1));
  if (has("repeat_penalty")) p.sampling.repeat_penalty = float(number(body["repeat_penalty"], "repeat_penalty", 0.01, 100));
  if (has("seed")) p.sampling.seed = uint64_t(integer(body["seed"], "seed", INT64_MIN, INT64_MAX));
  if (has("stop")) p.stop = parse_stop(body["stop"]);
  if (has("stream")) p.stream = boolean(body["stream"], "stream");
  if (has("stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    for (const auto& [k, v] : so.items()) {
      if (k != "include_usage") bad("stream_options", "unknown field 'stream_options." + k + "'");
      p.include_usage = boolean(v, "stream_options.include_usage");
    }
  }
  if (has("ignore_eos")) p.ignore_eos = boolean(body["ignore_eos"], "ignore_eos");
  if (has("return_token_ids")) p.return_token_ids = boolean(body["return_token_ids"], "return_token_ids");
  if (has("user")) text_of(body["user"], "user");
  // Log-probabilities: completions take logprobs = N (0..5 top entries), chat logprobs = true
  // with top_logprobs = N (0..20).
  if (!chat && has("logprobs")) p.logprobs = int(integer(body["logprobs"], "logprobs", 0, 5));
  if (chat && has("logprobs") && boolean(body["logprobs"], "logprobs")) p.logprobs = 0;
  if (has("top_logprobs")) {
    if (!chat) bad("top_logprobs", "'top_logprobs' is a chat field; completions take 'logprobs': N");
    const int n = int(integer(body["top_logprobs"], "top_logprobs", 0, 20));
    if (p.logprobs < 0 && n > 0) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (p.logprobs >= 0) p.logprobs = n;
  }
  if (has("session")) {
    p.session = text_of(body["session"], "session");
    if (!valid_session_name(p.session))
      bad("session", "'session' must be 1..64 characters of [A-Za-z0-9_.-], not starting with '.'");
  }
  return p;
}

}  // namespace vq
