#include "server/kv_events.h"

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>
#include <zmq.h>

#include <chrono>

#include "core/error.h"

namespace vq {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

std::string bytes_of(const msgpack::sbuffer& b) { return std::string(b.data(), b.size()); }

std::string be64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(uint64_t(v) >> (56 - 8 * i) & 0xff);
  return s;
}

bool binds(const std::string& e) {
  return e.find('*') != std::string::npos || e.find("::") != std::string::npos || e.rfind("ipc://", 0) == 0 ||
         e.rfind("inproc://", 0) == 0;
}

[[noreturn]] void zmq_fail(const char* what, const std::string& endpoint) {
  VQ_FAIL("kv events: cannot {} '{}': {}", what, endpoint, zmq_strerror(zmq_errno()));
}

}  // namespace

void check_kv_events_endpoint(const std::string& e, const char* flag) {
  const bool ok = (e.rfind("tcp://", 0) == 0 && e.size() > 6 && e.find(':', 6) != std::string::npos) ||
                  (e.rfind("ipc://", 0) == 0 && e.size() > 6) || (e.rfind("inproc://", 0) == 0 && e.size() > 9);
  VQ_CHECK(ok, "{}: '{}' is not a ZMQ endpoint (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH)", flag, e);
}

KVEventPublisher::KVEventPublisher(const KVEventsOptions& opt) : opt_(opt) {
  VQ_CHECK(opt_.buffer_batches >= 1, "kv events: the replay ring must hold at least one batch ({})", opt_.buffer_batches);
  ctx_ = zmq_ctx_new();
  VQ_CHECK(ctx_, "kv events: cannot create a ZMQ context");
  auto close_all = [this] {
    if (pub_) zmq_close(pub_);
    if (replay_) zmq_close(replay_);
    zmq_ctx_term(ctx_);
  };
  try {
    pub_ = zmq_socket(ctx_, ZMQ_PUB);
    int linger = 200;
    zmq_setsockopt(pub_, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(pub_, ZMQ_SNDHWM, &opt_.hwm, sizeof opt_.hwm);
    if (binds(opt_.endpoint)) {
      if (zmq_bind(pub_, opt_.endpoint.c_str()) != 0) zmq_fail("bind", opt_.endpoint);
    } else if (zmq_connect(pub_, opt_.endpoint.c_str()) != 0) {
      zmq_fail("connect to", opt_.endpoint);
    }
    if (!opt_.replay_endpoint.empty()) {
      replay_ = zmq_socket(ctx_, ZMQ_ROUTER);
      int zero = 0;
      zmq_setsockopt(replay_, ZMQ_LINGER, &zero, sizeof zero);
      if (zmq_bind(replay_, opt_.replay_endpoint.c_str()) != 0) zmq_fail("bind", opt_.replay_endpoint);
    }
  } catch (...) {
    close_all();
    throw;
  }
  thread_ = std::thread([this] { loop(); });
}

KVEventPublisher::~KVEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (pub_) zmq_close(pub_);
  if (replay_) zmq_close(replay_);
  zmq_ctx_term(ctx_);
}

void KVEventPublisher::push(std::string event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void KVEventPublisher::blocks_stored(uint64_t parent, bool parent_is_root, const std::vector<uint64_t>& keys,
                                     const std::vector<int32_t>& tokens, int block_tokens) {
  msgpack::sbuffer b;
  Packer p(b);
  p.pack_array(7);
  p.pack(std::string("BlockStored"));
  p.pack_array(uint32_t(keys.size()));
  for (uint64_t k : keys) p.pack_uint64(k);
  if (parent_is_root)
    p.pack_nil();
  else
    p.pack_uint64(parent);
  p.pack_array(uint32_t(tokens.size()));
  for (int32_t t : tokens) p.pack_int32(t);
  p.pack_int32(block_tokens);
  p.pack_nil();  // lora_id
  p.pack(opt_.medium);
  push(bytes_of(b));
}

void KVEventPublisher::blocks_removed(const std::vector<uint64_t>& keys) {
  msgpack::sbuffer b;
  Packer p(b);
  p.pack_array(3);
  p.pack(std::string("BlockRemoved"));
  p.pack_array(uint32_t(keys.size()));
  for (uint64_t k : keys) p.pack_uint64(k);
  p.pack(opt_.medium);
  push(bytes_of(b));
}

void KVEventPublisher::all_cleared() {
  msgpack::sbuffer b;
  Packer p(b);
  p.pack_array(1);
  p.pack(std::string("AllBlocksCleared"));
  push(bytes_of(b));
}

void KVEventPublisher::publish(std::vector<std::string> events) {
  msgpack::sbuffer b;
  Packer p(b);
  p.pack_array(3);
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  p.pack_double(ts);
  p.pack_array(uint32_t(events.size()));
  for (const std::string& e : events) b.write(e.data(), e.size());  // each is one msgpack value
  p.pack_int32(opt_.data_parallel_rank);
  const uint64_t seq = next_seq_++;
  const std::string seq_bytes = be64(int64_t(seq));
  // A PUB socket drops what no subscriber takes (or past its high-water mark); the ring keeps it.
  zmq_send(pub_, opt_.topic.data(), opt_.topic.size(), ZMQ_SNDMORE);
  zmq_send(pub_, seq_bytes.data(), 8, ZMQ_SNDMORE);
  zmq_send(pub_, b.data(), b.size(), 0);
  ring_.emplace_back(seq, bytes_of(b));
  while (int64_t(ring_.size()) > opt_.buffer_batches) ring_.pop_front();
  ++batches_;
  events_ += int64_t(events.size());
}

void KVEventPublisher::serve_replay() {
  // [client id, empty, start seq (8 bytes big-endian)] from a REQ client; anything else is dropped.
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, replay_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      return;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    const bool more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    if (!more) break;
  }
  if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) return;
  uint64_t start = 0;
  for (char c : frames[2]) start = start << 8 | uint8_t(c);
  const std::string& id = frames[0];
  auto reply = [&](const std::string& seq, const std::string& payload) {
    zmq_send(replay_, id.data(), id.size(), ZMQ_SNDMORE);
    zmq_send(replay_, "", 0, ZMQ_SNDMORE);
    zmq_send(replay_, seq.data(), seq.size(), ZMQ_SNDMORE);
    zmq_send(replay_, payload.data(), payload.size(), 0);
  };
  for (const auto& [seq, payload] : ring_)
    if (seq >= start) reply(be64(int64_t(seq)), payload);
  reply(be64(-1), std::string());
}

void KVEventPublisher::loop() {
  for (;;) {
    std::vector<std::string> events;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!replay_) cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return stop_ || !pending_.empty(); });
      events.swap(pending_);
      stopping = stop_;
    }
    if (!events.empty()) publish(std::move(events));
    if (stopping) return;
    if (replay_) {
      zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 5) > 0) serve_replay();
    }
  }
}

}  // namespace vq
