#pragma once
// Runner: the engine's thread and what crosses to it. HTTP threads submit generation requests
// and get a Channel that the engine's thread fills (text deltas, token ids, the end); they may
// cancel them (a client that went away). Anything else that touches the KV pool (sessions) runs
// on the engine's thread between steps through call().
//
// Text is made on the engine's thread (TextStream: UTF-8 and stop strings), so a stop string ends
// the sequence at the token that completes it.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "kvcache/kv_identity.h"
#include "server/api.h"
#include "server/logprobs.h"
#include "server/metrics.h"
#include "server/text_stream.h"

namespace vq {

// One request's progress, written by the engine's thread, read by the HTTP thread waiting on it.
struct Channel {
  using Clock = std::chrono::steady_clock;
  std::mutex mu;
  std::condition_variable cv;
  std::string text;             // emitted text not yet taken by the HTTP thread
  std::vector<int32_t> tokens;  // every generated token id
  std::vector<TokenLogprob> logprobs;  // one per token when params.logprobs >= 0
  bool done = false;
  SeqResult result;
  std::string finish_reason;  // OpenAI's: "stop" or "length" (or "cancelled"/"error")
  int64_t id = -1;
  Clock::time_point arrived;
  // Engine thread only:
  std::unique_ptr<TextStream> stream;
  const float* logits = nullptr;  // of the token being sampled (Request::on_logits)
  GenParams params;
};

struct SessionInfo {
  std::string name;
  int64_t n_tokens = 0, n_kv = 0;
};

class Runner {
 public:
  Runner(Engine& engine, Metrics& metrics, KVIdentity identity, std::string session_dir, int max_sessions);
  ~Runner();  // stops the thread (cancels what is left)

  std::shared_ptr<Channel> submit(GenParams p, Channel::Clock::time_point arrived);
  void cancel(const Channel& c);
  void cancel_all();
  int64_t in_flight() const;
  // Runs fn on the engine's thread between steps and returns when it has run (its exception, if
  // any, is rethrown here).
  void call(const std::function<void()>& fn);

  // Sessions (ApiError on failure): a finished request named `session` keeps its KV pinned in the
  // prefix cache under that name; save writes it to <session_dir>/<name>.vqkv, restore reads it
  // back into the pool and pins it, so a request that continues the conversation starts there.
  SessionInfo save_session(const std::string& name);
  SessionInfo restore_session(const std::string& name);
  void delete_session(const std::string& name);
  std::vector<SessionInfo> sessions();
  const KVIdentity& identity() const { return identity_; }
  // The shared prefix store (nullptr: none), asked for each prompt on the submitting thread before
  // it goes to the engine; set before serving.
  void set_prefix_store(class PrefixStore* store) { store_ = store; }
  const std::string& session_dir() const { return session_dir_; }

 private:
  struct Session {
    int64_t point = -1;
    std::vector<int32_t> tokens;  // all of them; the KV holds the first n_kv
    int64_t n_kv = 0;
  };
  void loop();
  void finished(Channel& c, const SeqResult& r);
  void pin_session(const std::string& name, std::vector<int32_t> tokens, int64_t n_kv);
  void unpin_unless_named(int64_t point);
  std::string session_path(const std::string& name) const;

  Engine& engine_;
  Metrics& metrics_;
  class PrefixStore* store_ = nullptr;
  KVIdentity identity_;
  // Each rank's identity (tp = 1: identity_; else its store and calibration slice), and the runner of
  // a rank's store operations (its GPU current; empty at tp = 1).
  std::vector<KVIdentity> rank_identities() const;
  RankRunner rank_runner();
  std::string session_dir_;
  int max_sessions_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool wake_ = false, stop_ = false;
  std::vector<std::function<void()>> tasks_;
  std::map<int64_t, std::shared_ptr<Channel>> live_;  // by engine request id
  std::map<std::string, Session> sessions_;           // engine thread only
  std::thread thread_;
};

}  // namespace vq
