// The lab's job pool (see runner.h).
#include "lab/runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <normlab/error.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

extern char** environ;

namespace normlab::lab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void write_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    NL_CHECK(f.good(), "lab: cannot open '{}' for writing", tmp.string());
    f << text;
    f.close();
    NL_CHECK(!f.fail(), "lab: write error on '{}'", tmp.string());
  }
  fs::rename(tmp, path);
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const std::size_t nl = t.find_last_of('\n');
  std::string l = nl == std::string::npos ? t : t.substr(nl + 1);
  const std::size_t cr = l.find_last_of('\r');
  return cr == std::string::npos ? l : l.substr(cr + 1);
}

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  return t >= 60 ? fmt::format("{}m{:02}s", t / 60, t % 60) : fmt::format("{}s", t);
}

pid_t spawn(const std::string& exe, const fs::path& spec, const fs::path& dir) {
  const std::string log = (dir / "log.txt").string();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> args = {"normlab", "lab-job", "--spec", spec.string(), "--dir", dir.string()};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  NL_CHECK(rc == 0, "lab: cannot start '{}': {}", exe, std::strerror(rc));
  return pid;
}

}  // namespace

json run_jobs(const std::vector<Job>& jobs, const RunnerOptions& opt,
              const std::function<void(const std::string&)>& print) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const int parallel = std::max(1, opt.parallel);
  json outputs = json::object();
  struct Running {
    const Job* job;
    fs::path dir;
    Clock::time_point start;
  };
  std::map<pid_t, Running> running;
  std::size_t next = 0, done = 0;
  double total_cost = 0, done_cost = 0;
  for (const Job& j : jobs) total_cost += j.cost;

  // --resume: runs already done with the same spec.
  std::vector<const Job*> todo;
  for (const Job& j : jobs) {
    const fs::path dir = fs::path(opt.out_dir) / "runs" / j.key;
    if (opt.resume && fs::exists(dir / "result.json") && fs::exists(dir / "spec.json")) {
      const json old_spec = json::parse(read_text(dir / "spec.json"), nullptr, false);
      json o = json::parse(read_text(dir / "result.json"), nullptr, false);
      if (!old_spec.is_discarded() && old_spec == j.spec && !o.is_discarded() && o.is_object()) {
        outputs[j.key] = std::move(o);
        ++done;
        done_cost += j.cost;
        print(fmt::format("[{:>3}/{}] {:<26} reused (--resume)", done, jobs.size(), j.key));
        continue;
      }
    }
    todo.push_back(&j);
  }
  total_cost -= done_cost;
  done_cost = 0;

  auto start_one = [&] {
    const Job& j = *todo[next++];
    const fs::path dir = fs::path(opt.out_dir) / "runs" / j.key;
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_atomic(dir / "spec.json", j.spec.dump(2) + "\n");
    const pid_t pid = spawn(opt.exe, dir / "spec.json", dir);
    running[pid] = {&j, dir, Clock::now()};
    print(fmt::format("          start {:<26} (log: {})", j.key, (dir / "log.txt").string()));
  };

  while (done < jobs.size()) {
    while (running.size() < static_cast<std::size_t>(parallel) && next < todo.size()) start_one();
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("lab: waitpid failed: {}", std::strerror(errno)));
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;  // not ours
    const Running r = it->second;
    running.erase(it);
    ++done;
    done_cost += r.job->cost;
    const double secs = std::chrono::duration<double>(Clock::now() - r.start).count();
    const fs::path result = r.dir / "result.json";
    std::string status_text;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && fs::exists(result)) {
      json o = json::parse(read_text(result), nullptr, false);
      if (o.is_discarded()) {
        outputs[r.job->key] = {{"error", "unreadable " + result.string()}};
        status_text = "FAILED (unreadable result)";
      } else {
        outputs[r.job->key] = std::move(o);
        status_text = "done";
      }
    } else {
      const std::string why = WIFEXITED(status) ? fmt::format("exit status {}", WEXITSTATUS(status))
                                                : fmt::format("killed by signal {}", WTERMSIG(status));
      outputs[r.job->key] = {
          {"error", fmt::format("{}: {} (log: {})", why, last_line(read_text(r.dir / "log.txt")),
                                (r.dir / "log.txt").string())}};
      status_text = "FAILED: " + outputs[r.job->key]["error"].get<std::string>();
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    const double eta = done_cost > 0 ? elapsed * (total_cost - done_cost) / done_cost : NAN;
    print(fmt::format("[{:>3}/{}] {:<26} {:>7.1f} s  {}   (elapsed {}, ETA {})", done, jobs.size(), r.job->key, secs,
                      status_text, duration(elapsed), done < jobs.size() ? duration(eta) : "0s"));
  }
  return outputs;
}

void run_job_files(const std::string& spec_path, const std::string& dir) {
  const json spec = json::parse(read_text(spec_path), nullptr, false);
  NL_CHECK(!spec.is_discarded(), "lab-job: cannot parse '{}'", spec_path);
  const json out = run_job(spec, dir);
  write_atomic(fs::path(dir) / "result.json", out.dump() + "\n");
}

}  // namespace normlab::lab
