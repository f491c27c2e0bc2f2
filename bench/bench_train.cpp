// bench/bench_train.cpp — throughput of one training step (forward + backward + AdamW) of the lab's
// Pre-LN byte-level LM, normlab next to the same model written with plain LibTorch ops + autograd +
// torch::optim::AdamW, in one binary (same build flags, same libgomp thread pool, same weights).
//
// Model (default): 6 layers, d_model 256, 4 heads, FFN 1024, vocabulary 256, seq 128, batch 16, Pre-LN,
// sinusoidal positions, ReLU, AdamW β = (0.9, 0.98), eps 1e-9, weight decay 0.01 (biases/norms excluded).
// For each thread count: both implementations run `warmup` untimed steps, then `steps` timed steps on
// the same random batches; reported: the median step time and tokens/s = B·T / median.
//
// Threads: normlab::set_num_threads, OpenMP and at::set_num_threads get the count; so does OpenBLAS
// (openblas_set_num_threads, looked up at run time), which LibTorch's matrix products run on and which
// at::set_num_threads leaves alone: without it the "1 thread" LibTorch run used OpenBLAS's own pool of
// one thread per core.
//
//   normlab_bench_train [--threads 1,2] [--steps 10] [--warmup 2] [--layers 6] [--d-model 256]
//                       [--heads 4] [--ffn 1024] [--seq 128] [--batch 16] [--only normlab|libtorch] [--json]
#include <normlab/nn/model.h>
#include <normlab/nn/optim.h>
#include <normlab/parallel.h>
#include <dlfcn.h>
#include <time.h>
#include <omp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using normlab::Index;
using normlab::nn::ModelConfig;
using normlab::nn::ParamRef;
namespace F = torch::nn::functional;
using TParams = std::map<std::string, torch::Tensor>;
using Clock = std::chrono::steady_clock;

torch::Tensor linear(TParams& P, const std::string& n, const torch::Tensor& x) {
  return F::linear(x, P[n + ".weight"], P[n + ".bias"]);
}
torch::Tensor ln(const ModelConfig& c, TParams& P, const std::string& n, const torch::Tensor& x) {
  return F::layer_norm(x, F::LayerNormFuncOptions({c.d_model}).weight(P[n + ".weight"]).bias(P[n + ".bias"]).eps(c.norm_eps));
}

torch::Tensor torch_loss(const ModelConfig& c, TParams& P, const torch::Tensor& pe, const torch::Tensor& mask,
                         const torch::Tensor& ids, const torch::Tensor& tgt, int64_t B, int64_t T) {
  const int64_t C = c.d_model, H = c.heads, hs = C / H;
  torch::Tensor x = F::embedding(ids, P["wte"]) + pe.unsqueeze(0);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    torch::Tensor u = ln(c, P, p + "norm1", x);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hs}).transpose(1, 2); };
    torch::Tensor q = heads(linear(P, p + "attn.q", u)), k = heads(linear(P, p + "attn.k", u)),
                  v = heads(linear(P, p + "attn.v", u));
    torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
    s = s.masked_fill(mask, -INFINITY);
    torch::Tensor ctx = torch::matmul(torch::softmax(s, -1), v).transpose(1, 2).contiguous().view({B, T, C});
    x = x + linear(P, p + "attn.o", ctx);
    x = x + linear(P, p + "ffn.w2", torch::relu(linear(P, p + "ffn.w1", ln(c, P, p + "norm2", x))));
  }
  x = ln(c, P, "ln_f", x);
  return F::cross_entropy(linear(P, "head", x).view({B * T, c.vocab}), tgt.view({B * T}));
}

// CPU time of the whole process (all its threads), seconds: on a loaded machine the wall time of a
// step includes the time other processes held the cores; the CPU time does not (but it does include
// OpenMP's spin-waiting at 2 threads).
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Args {
  std::vector<int> threads = {1, 2};
  int steps = 10, warmup = 2, layers = 6, d_model = 256, heads = 4, ffn = 1024, seq = 128, batch = 16;
  bool json = false;
  bool run_ours = true, run_torch = true;  // --only normlab | --only libtorch (profiling one side)
};

// OpenBLAS's thread count, when an OpenBLAS is loaded (LibTorch's BLAS here); false when none is.
bool set_openblas_threads(int n) {
  using Fn = void (*)(int);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!fn) return false;
  fn(n);
  return true;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "normlab_bench_train: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--threads") {
      a.threads.clear();
      std::string s = next();
      for (std::size_t p = 0; p <= s.size();) {
        const std::size_t q = std::min(s.find(',', p), s.size());
        a.threads.push_back(std::stoi(s.substr(p, q - p)));
        p = q + 1;
      }
    } else if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--warmup") a.warmup = std::stoi(next());
    else if (k == "--layers") a.layers = std::stoi(next());
    else if (k == "--d-model") a.d_model = std::stoi(next());
    else if (k == "--heads") a.heads = std::stoi(next());
    else if (k == "--ffn") a.ffn = std::stoi(next());
    else if (k == "--seq") a.seq = std::stoi(next());
    else if (k == "--batch") a.batch = std::stoi(next());
    else if (k == "--json") a.json = true;
    else if (k == "--only") {
      const std::string w = next();
      if (w != "normlab" && w != "libtorch") {
        std::fprintf(stderr, "normlab_bench_train: --only takes normlab or libtorch, got %s\n", w.c_str());
        std::exit(2);
      }
      a.run_ours = w == "normlab";
      a.run_torch = w == "libtorch";
    }
    else {
      std::fprintf(stderr, "normlab_bench_train: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  ModelConfig c;
  c.placement = normlab::nn::Placement::kPre;
  c.layers = a.layers;
  c.d_model = a.d_model;
  c.heads = a.heads;
  c.ffn = a.ffn;
  c.max_seq = a.seq;
  c.seed = 1;
  const Index B = a.batch, T = a.seq;
  const int total = a.warmup + a.steps;

  std::mt19937_64 rng(7);
  std::vector<std::vector<std::int32_t>> tok(static_cast<std::size_t>(total)), tgt(tok.size());
  for (int s = 0; s < total; ++s)
    for (Index i = 0; i < B * T; ++i) {
      tok[static_cast<std::size_t>(s)].push_back(static_cast<std::int32_t>(rng() % 256));
      tgt[static_cast<std::size_t>(s)].push_back(static_cast<std::int32_t>(rng() % 256));
    }

  if (!a.json)
    std::printf("Pre-LN LM: %d layers, d_model %d, %d heads, FFN %d, seq %d, batch %d; forward + backward + AdamW\n",
                a.layers, a.d_model, a.heads, a.ffn, a.seq, a.batch);
  std::string json = "[";
  for (int th : a.threads) {
    normlab::set_num_threads(th);
    omp_set_num_threads(th);
    at::set_num_threads(th);
    const bool openblas = set_openblas_threads(th);
    if (!a.json && th == a.threads.front())
      std::printf("OpenBLAS thread control: %s\n", openblas ? "openblas_set_num_threads" : "no OpenBLAS loaded");

    // normlab
    normlab::nn::Model model(c);
    std::vector<ParamRef> params = model.params();
    normlab::nn::AdamW opt(params, normlab::nn::AdamWOptions{0.9, 0.98, 1e-9, 0.01, true});
    std::vector<double> t_ours, c_ours;
    double loss_ours = 0;
    for (int s = 0; s < (a.run_ours ? total : 0); ++s) {
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      loss_ours = model.forward(tok[static_cast<std::size_t>(s)].data(), tgt[static_cast<std::size_t>(s)].data(), B, T);
      model.backward();
      opt.step(1e-4);
      if (s >= a.warmup) {
        t_ours.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        c_ours.push_back(cpu_seconds() - c0);
      }
    }

    // LibTorch, from the same initial weights
    normlab::nn::Model init(c);
    TParams P;
    std::vector<torch::Tensor> decay, no_decay;
    for (const ParamRef& r : init.params()) {
      P[r.name] = torch::from_blob(r.data, r.shape.vec(), torch::kFloat32).clone().requires_grad_(true);
      (normlab::nn::is_no_decay(r) ? no_decay : decay).push_back(P[r.name]);
    }
    auto opts = [](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(1e-4).betas({0.9, 0.98}).eps(1e-9).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, opts(0.01));
    groups.emplace_back(no_decay, opts(0.0));
    torch::optim::AdamW adam(std::move(groups), torch::optim::AdamWOptions(1e-4));
    torch::Tensor pe = torch::zeros({T, c.d_model}, torch::kFloat32);
    for (Index t = 0; t < T; ++t)
      for (Index j = 0; j < c.d_model; ++j) {
        const double ang = static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(j / 2) / c.d_model);
        pe[t][j] = static_cast<float>(j % 2 == 0 ? std::sin(ang) : std::cos(ang));
      }
    const torch::Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);
    std::vector<double> t_torch, c_torch;
    double loss_torch = 0;
    for (int s = 0; s < (a.run_torch ? total : 0); ++s) {
      torch::Tensor ids = torch::tensor(std::vector<int64_t>(tok[static_cast<std::size_t>(s)].begin(), tok[static_cast<std::size_t>(s)].end())).view({B, T});
      torch::Tensor tg = torch::tensor(std::vector<int64_t>(tgt[static_cast<std::size_t>(s)].begin(), tgt[static_cast<std::size_t>(s)].end())).view({B, T});
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      adam.zero_grad();
      torch::Tensor loss = torch_loss(c, P, pe, mask, ids, tg, B, T);
      loss.backward();
      adam.step();
      loss_torch = loss.item<double>();
      if (s >= a.warmup) {
        t_torch.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        c_torch.push_back(cpu_seconds() - c0);
      }
    }

    for (auto* v : {&t_ours, &c_ours, &t_torch, &c_torch})
      if (v->empty()) v->push_back(NAN);
    const double mo = median(t_ours), mt = median(t_torch), co = median(c_ours), ct = median(c_torch);
    const double tok_s = static_cast<double>(B * T);
    auto num = [](double x) { return std::isfinite(x) ? std::to_string(x) : std::string("null"); };
    if (a.json) {
      json += std::string(json.size() > 1 ? "," : "") +
              "{\"threads\":" + std::to_string(th) + ",\"normlab_step_s\":" + num(mo) + ",\"libtorch_step_s\":" +
              num(mt) + ",\"normlab_tokens_per_s\":" + num(tok_s / mo) + ",\"libtorch_tokens_per_s\":" +
              num(tok_s / mt) + ",\"normlab_cpu_s\":" + num(co) + ",\"libtorch_cpu_s\":" + num(ct) + "}";
    } else {
      std::printf("threads %d: normlab %.1f ms/step, %.0f tokens/s | LibTorch %.1f ms/step, %.0f tokens/s | "
                  "normlab/LibTorch speed %.2fx (last losses %.4f / %.4f)\n"
                  "           CPU time per step: normlab %.1f ms, LibTorch %.1f ms (ratio %.2fx)\n",
                  th, 1e3 * mo, tok_s / mo, 1e3 * mt, tok_s / mt, mt / mo, loss_ours, loss_torch, 1e3 * co,
                  1e3 * ct, ct / co);
    }
  }
  if (a.json) std::printf("%s]\n", json.c_str());
  return 0;
}
