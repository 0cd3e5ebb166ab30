// The parts of the public API the CLI and the server stand on (issue 19 item 4): KV budgets,
// session files, the server's entry. Only <veloxquant/...> headers, as a consumer would.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <veloxquant/server.h>
#include <veloxquant/veloxquant.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace vx = veloxquant;

namespace {

bool have_default_model() { return std::filesystem::exists(vx::Model::default_path()); }

// The vq::Error fn throws, its message holding every needle.
template <class F>
void expect_error(F&& fn, std::initializer_list<const char*> needles) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const vx::Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

std::vector<int32_t> greedy_continuation(vx::Session& s, std::vector<int32_t> ids, int64_t n_kv, int n) {
  std::vector<float> logits(size_t(s.n_vocab()));
  s.forward(std::span<const int32_t>(ids.data() + n_kv, ids.size() - size_t(n_kv)), logits.data());
  vx::Sampler sampler(vx::SamplingParams::greedy());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = sampler.sample(logits.data(), s.n_vocab());
    out.push_back(t);
    s.forward(std::span<const int32_t>(&t, 1), logits.data());
  }
  return out;
}

}  // namespace

TEST(ApiBudget, DefaultAndLeastBudgets) {
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load_default();
  EXPECT_GT(vx::default_kv_budget_bytes(model, vx::Device::cpu), size_t(64) << 20);
  if (!vx::cuda_available())
    expect_error([&] { vx::default_kv_budget_bytes(model, vx::Device::cuda); }, {"device cuda"});
  // fp16 and q8_0: one block per layer of each form; the compressed cache's least budget is larger
  // (fp16 window blocks + coded blocks) and the session and the engine agree on it.
  const vx::KVSpec fp16 = vx::KVSpec::for_model(model, "fp16"), q8 = vx::KVSpec::for_model(model, "q8_0");
  const vx::Session s16(model, fp16, {64}), s8(model, q8, {64});
  EXPECT_GT(s16.min_budget_bytes(), 0u);
  EXPECT_GT(s8.min_budget_bytes(), s16.min_budget_bytes());
  const vx::Engine e8(model, q8, {size_t(64) << 20, 2, 64, 256});
  EXPECT_EQ(e8.min_budget_bytes(), s8.min_budget_bytes());
  // Far below it (1 KiB) the first token cannot be held.
  vx::SessionOptions tiny;
  tiny.n_ctx = 64;
  tiny.kv_budget_bytes = 1024;
  vx::Session starved(model, q8, tiny);
  const std::vector<int32_t> one = {model.tokenizer().bos()};
  EXPECT_THROW(starved.forward(one, nullptr), vx::Error);
}

// Prefill steps: 512 tokens on the CPU, 2048 on the device unless asked; a step of 7 tokens gives
// the logits of the one-step forward; a negative one is refused naming the field.
TEST(ApiSession, PrefillStepDefaultsByDevice) {
  EXPECT_EQ(vx::default_max_chunk(vx::Device::cpu), 512);
  EXPECT_EQ(vx::default_max_chunk(vx::Device::cuda), 2048);
  EXPECT_EQ(vx::SessionOptions{}.max_chunk, 0);
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load_default();
  const vx::KVSpec spec = vx::KVSpec::for_model(model, "fp32");
  const std::vector<int32_t> ids = model.tokenizer().encode("The quick brown fox jumps over the lazy dog again");
  std::vector<float> a(size_t(model.info().n_vocab)), b(a.size());
  vx::SessionOptions whole;
  whole.n_ctx = 64;
  vx::Session s_whole(model, spec, whole);
  s_whole.forward(ids, a.data());
  vx::SessionOptions sevens = whole;
  sevens.max_chunk = 7;
  vx::Session s_sevens(model, spec, sevens);
  s_sevens.forward(ids, b.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-3f * (1.0f + std::fabs(a[i]))) << i;
  vx::SessionOptions bad = whole;
  bad.max_chunk = -1;
  expect_error([&] { vx::Session s(model, spec, bad); }, {"max_chunk -1"});
}

// A session saved and loaded continues exactly as the unsaved one; a file of another spec, a
// missing file and a bad path are each one vq::Error naming what is wrong.
TEST(ApiSession, SaveLoadContinuesTheSameAndRefusesOthers) {
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load_default();
  const vx::KVSpec spec = vx::KVSpec::for_model(model, "q8_0");
  const std::vector<int32_t> prompt = model.tokenizer().encode("The quick brown fox jumps over the");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "vq_api_session_files";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "s.vqs").string();

  vx::Session a(model, spec, {128});
  std::vector<float> logits(size_t(a.n_vocab()));
  a.forward(prompt, logits.data());
  a.save(file, prompt);
  const std::vector<int32_t> more = model.tokenizer().encode(" lazy", false);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  const std::vector<int32_t> want = greedy_continuation(a, all, a.pos(), 5);

  vx::Session b(model, spec, {128});
  b.forward(more, nullptr);  // what it held before is dropped by the load
  const vx::LoadedSession ld = b.load(file);
  EXPECT_EQ(ld.tokens, prompt);
  EXPECT_EQ(ld.n_kv, int64_t(prompt.size()));
  EXPECT_EQ(b.pos(), ld.n_kv);
  EXPECT_EQ(greedy_continuation(b, all, ld.n_kv, 5), want);

  // Errors.
  expect_error([&] { a.save((dir / "x.vqs").string(), {1}); }, {"fewer than"});
  vx::Session other(model, vx::KVSpec::for_model(model, "fp16"), {128});
  EXPECT_THROW(other.load(file), vx::Error);
  expect_error([&] { other.load((dir / "missing.vqs").string()); }, {"missing.vqs"});
  { std::ofstream(dir / "junk.vqs") << "not a session"; }
  expect_error([&] { other.load((dir / "junk.vqs").string()); }, {"junk.vqs"});
  EXPECT_THROW(a.save((dir / "no_such_dir" / "s.vqs").string(), prompt), vx::Error);
  std::filesystem::remove_all(dir);
}

namespace {

// One HTTP/1.1 request to 127.0.0.1:port (Connection: close); the whole response.
std::string http(int port, const std::string& method, const std::string& target, const std::string& body = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) ::close(fd);
    return "";
  }
  const std::string req = method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                          "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\n\r\n" + body;
  (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, size_t(n));
  ::close(fd);
  return out;
}

}  // namespace

// The server through its public entry: it serves a completion on a free port with the prefix
// cache on, and stops; bad options are refused before anything listens, naming the field.
TEST(ApiServer, ServesAndStopsAndRefusesBadOptions) {
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load_default();
  const vx::KVSpec spec = vx::KVSpec::for_model(model, "q8_0");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "vq_api_server_sessions";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "old.vqkv.tmp.999999999.1") << "left by a killed save"; }  // no such process
  vx::ServerOptions so;
  so.port = 0;
  so.kv_budget_bytes = size_t(64) << 20;
  so.max_sequences = 2;
  so.session_dir = dir.string();
  so.model_name = "smol";
  {
    vx::Server server(model, spec, so);
    EXPECT_TRUE(server.prefix_cache());
    EXPECT_EQ(server.removed_stale_session_files(), 1);
    EXPECT_FALSE(server.kv_events());
    EXPECT_FALSE(server.prefix_store());
    EXPECT_EQ(server.model_name(), "smol");
    EXPECT_EQ(server.kv_budget_bytes(), size_t(64) << 20);
    EXPECT_EQ(server.min_budget_bytes(), vx::min_kv_budget_bytes(model, spec));
    EXPECT_EQ(server.n_ctx(), int(model.info().n_ctx_train));
    const int port = server.bind();
    ASSERT_GT(port, 0);
    std::thread t([&] { server.run(); });
    const std::string health = http(port, "GET", "/health");
    const std::string models = http(port, "GET", "/v1/models");
    const std::string done =
        http(port, "POST", "/v1/completions", R"({"prompt": "The sun rises in the", "max_tokens": 3, "temperature": 0})");
    server.drain();
    server.stop();
    t.join();
    EXPECT_NE(health.find(" 200 "), std::string::npos) << health;
    EXPECT_NE(models.find("\"smol\""), std::string::npos) << models;
    EXPECT_NE(done.find(" 200 "), std::string::npos) << done;
    EXPECT_NE(done.find("\"completion_tokens\":3"), std::string::npos) << done;
    EXPECT_EQ(server.active(), 0);
    EXPECT_EQ(server.in_flight(), 0);
  }

  // Errors: one vq::Error each, naming what is wrong.
  expect_error([] { vx::check_kv_events_endpoint("foo", "--kv-events"); }, {"--kv-events: 'foo'"});
  expect_error([] { vx::check_prefix_store_url("http://x", "--prefix-store"); }, {"--prefix-store: 'http://x'"});
  vx::ServerOptions bad = so;
  bad.kv_events = "tcp://*:5";
  bad.prefix_cache = false;
  expect_error([&] { vx::Server(model, spec, bad); }, {"kv_events", "prefix_cache is off"});
  bad = so;
  bad.prefix_store = "redis://u:p@h:1";
  expect_error([&] { vx::Server(model, spec, bad); }, {"prefix_store"});
  bad = so;
  bad.kv_budget_bytes = 1024;
  expect_error([&] { vx::Server(model, spec, bad); }, {"kv_budget_bytes 1024", "q8_0"});
  bad = so;
  bad.max_sequences = 0;
  expect_error([&] { vx::Server(model, spec, bad); }, {"max_sequences 0"});
  if (!vx::cuda_available()) {
    bad = so;
    bad.device = vx::Device::cuda;
    expect_error([&] { vx::Server(model, spec, bad); }, {"device cuda"});
  }
  std::filesystem::remove_all(dir);
}
