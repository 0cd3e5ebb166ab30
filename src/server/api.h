#pragma once
// The OpenAI-compatible request bodies of /v1/completions and /v1/chat/completions, checked and
// turned into what the engine runs. Every problem is an ApiError naming the field, which the HTTP
// layer answers with its status and the OpenAI error body. Unknown fields are refused (a typo
// must not silently change a request); known fields whose non-default values this server does not
// implement (n > 1, echo, logit_bias, penalties, tools, ...) are refused by name.
// Extensions: top_k, min_p, repeat_penalty, ignore_eos, session (keep the conversation's KV under
// a name for /v1/sessions), return_token_ids (the generated ids in the choice).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/sampler.h"

namespace vq {

class Model;

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)), status(status), param(std::move(param)), type(std::move(type)) {}
  int status;
  std::string param, type;
};

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
std::string error_body(int status, const std::string& message, const std::string& type = "invalid_request_error",
                       const std::string& param = "");

struct GenParams {
  bool chat = false;
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplerParams sampling;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  bool ignore_eos = false, return_token_ids = false;
  int logprobs = -1;  // -1: none; else the sampled token's log-probability and this many top ones
  std::string session;  // "" or a valid session name
};

struct ApiLimits {
  int n_ctx = 2048;  // positions per sequence: prompt + max_tokens must fit
};

// Throws ApiError for anything malformed, unknown, unsupported or past the limits.
GenParams parse_generation(const nlohmann::json& body, bool chat, const Model& model, const ApiLimits& limits);

// Session names are file names: 1..64 of [A-Za-z0-9_.-], not starting with '.'.
bool valid_session_name(const std::string& name);

}  // namespace vq
