// The lab's job pool: runs each Job in its own process (`EXE lab-job --spec DIR/runs/KEY/spec.json --dir
// DIR/runs/KEY`), at most `parallel` at a time, longest first, and collects DIR/runs/KEY/result.json.
// Separate processes because normlab's and OpenMP's thread settings are process-global.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lab/experiments.h"

namespace normlab::lab {

struct RunnerOptions {
  std::string exe;      // the normlab binary (/proc/self/exe)
  std::string out_dir;  // DIR: runs go to DIR/runs/KEY
  int parallel = 2;
  bool resume = false;  // reuse DIR/runs/KEY/result.json when DIR/runs/KEY/spec.json equals the job's spec
};

// key → the run's output, or {"error": "..."} when it failed (exit status, last line of its log).
// `print` receives progress lines.
nlohmann::json run_jobs(const std::vector<Job>& jobs, const RunnerOptions& opt,
                        const std::function<void(const std::string&)>& print);

// The child side: reads the spec, runs it (run_job) and writes DIR/result.json.
void run_job_files(const std::string& spec_path, const std::string& dir);

}  // namespace normlab::lab
