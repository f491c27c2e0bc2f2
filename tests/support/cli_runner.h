// The fixture shared by the tests that run the built `normlab` binary (NORMLAB_CLI): a fresh temporary
// directory per test (removed after a pass, kept and printed after a failure), a runner that captures
// exit code, stdout and stderr, and .npy helpers relative to that directory.
#pragma once

#include <gtest/gtest.h>
#include <normlab/npy.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#ifndef NORMLAB_CLI
#error "NORMLAB_CLI (the path of the built normlab binary) must be defined"
#endif

namespace normlab::testing {

struct RunResult {
  int rc = -1;  // exit code; -1 when the process did not exit normally
  std::string out, err;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

inline std::string describe(const RunResult& r) {
  return "rc " + std::to_string(r.rc) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

class CliDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    dir_ = std::filesystem::temp_directory_path() / ("normlab_cli_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (HasFailure())
      std::printf("kept test directory %s\n", dir_.c_str());
    else
      std::filesystem::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  bool exists(const std::string& name) const { return std::filesystem::exists(dir_ / name); }

  // Runs `normlab ARGS` in the test directory, capturing stdout and stderr.
  RunResult run(const std::string& args) const {
    const std::string cmd = "cd '" + dir_.string() + "' && '" NORMLAB_CLI "' " + args + " >'" +
                            path("stdout.txt") + "' 2>'" + path("stderr.txt") + "'";
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.rc = (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
    r.out = read_file(dir_ / "stdout.txt");
    r.err = read_file(dir_ / "stderr.txt");
    return r;
  }

  void save(const std::string& name, const Tensor& t) const { save_npy(path(name), t.cview()); }
  Tensor load(const std::string& name) const { return load_npy(path(name)); }

  std::filesystem::path dir_;
};

}  // namespace normlab::testing
