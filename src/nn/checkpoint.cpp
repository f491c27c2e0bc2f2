// Checkpoints (src/nn/checkpoint.h).
#include "nn/checkpoint.h"

#include <normlab/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

namespace normlab::nn {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'N', 'L', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr char kEndMagic[8] = {'N', 'L', 'C', 'K', 'E', 'N', 'D', '\n'};

std::uint64_t fnv1a(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
void put(std::vector<std::uint8_t>& out, T v) {
  static_assert(std::endian::native == std::endian::little, "checkpoints are written little-endian");
  const auto* b = reinterpret_cast<const std::uint8_t*>(&v);
  out.insert(out.end(), b, b + sizeof(T));
}
void put_bytes(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

json config_to_json(const ModelConfig& c) {
  return json{{"placement", static_cast<int>(c.placement)},
              {"norm", static_cast<int>(c.norm)},
              {"head", static_cast<int>(c.head)},
              {"positions", static_cast<int>(c.positions)},
              {"init", static_cast<int>(c.init)},
              {"layers", c.layers},
              {"d_model", c.d_model},
              {"heads", c.heads},
              {"ffn", c.ffn},
              {"vocab", c.vocab},
              {"classes", c.classes},
              {"input_dim", c.input_dim},
              {"max_seq", c.max_seq},
              {"norm_eps", c.norm_eps},
              {"mixln_alpha", c.mixln_alpha},
              {"causal", c.causal},
              {"gelu", c.gelu},
              {"seed", c.seed}};
}

ModelConfig config_from_json(const json& j) {
  ModelConfig c;
  c.placement = static_cast<Placement>(j.at("placement").get<int>());
  c.norm = static_cast<NormKind>(j.at("norm").get<int>());
  c.head = static_cast<Head>(j.at("head").get<int>());
  c.positions = static_cast<PositionKind>(j.at("positions").get<int>());
  c.init = static_cast<InitKind>(j.at("init").get<int>());
  c.layers = j.at("layers").get<int>();
  c.d_model = j.at("d_model").get<int>();
  c.heads = j.at("heads").get<int>();
  c.ffn = j.at("ffn").get<int>();
  c.vocab = j.at("vocab").get<int>();
  c.classes = j.at("classes").get<int>();
  c.input_dim = j.at("input_dim").get<int>();
  c.max_seq = j.at("max_seq").get<int>();
  c.norm_eps = j.at("norm_eps").get<double>();
  c.mixln_alpha = j.at("mixln_alpha").get<double>();
  c.causal = j.at("causal").get<bool>();
  c.gelu = j.at("gelu").get<bool>();
  c.seed = j.at("seed").get<std::uint64_t>();
  return c;
}

// A parsed, checksum-verified checkpoint file.
struct Parsed {
  json header;
  std::vector<std::uint8_t> bytes;
  std::size_t data_offset = 0;  // start of the float data
  std::size_t data_bytes = 0;
};

Parsed parse_file(const std::string& dir) {
  const std::string path = checkpoint_file(dir);
  std::ifstream in(path, std::ios::binary);
  NL_CHECK(in.good(), "checkpoint not found: {} (no such file or not readable)", path);
  Parsed p;
  p.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  NL_CHECK(!in.bad(), "error reading checkpoint {}", path);
  const std::vector<std::uint8_t>& b = p.bytes;
  constexpr std::size_t kHead = 8 + 4 + 4 + 8, kTail = 8 + 8;
  NL_CHECK(b.size() >= kHead + kTail, "checkpoint {} is truncated ({} bytes)", path, b.size());
  NL_CHECK(std::memcmp(b.data(), kMagic, 8) == 0, "{} is not a normlab checkpoint (bad magic)", path);
  std::uint32_t version = 0;
  std::memcpy(&version, b.data() + 8, 4);
  NL_CHECK(version == kCheckpointVersion, "checkpoint {} has version {}; this normlab reads version {}", path,
           version, kCheckpointVersion);
  NL_CHECK(std::memcmp(b.data() + b.size() - 8, kEndMagic, 8) == 0,
           "checkpoint {} is truncated or corrupt (end marker missing)", path);
  std::uint64_t stored = 0;
  std::memcpy(&stored, b.data() + b.size() - kTail, 8);
  NL_CHECK(fnv1a(b.data(), b.size() - kTail) == stored, "checkpoint {} is corrupt (checksum mismatch)", path);
  std::uint64_t hlen = 0;
  std::memcpy(&hlen, b.data() + 16, 8);
  NL_CHECK(hlen <= b.size() - kHead - kTail, "checkpoint {} is corrupt (header length {})", path, hlen);
  try {
    p.header = json::parse(b.begin() + static_cast<std::ptrdiff_t>(kHead),
                           b.begin() + static_cast<std::ptrdiff_t>(kHead + hlen));
  } catch (const json::exception& e) {
    throw Error(fmt::format("checkpoint {} is corrupt (header: {})", path, e.what()));
  }
  p.data_offset = kHead + hlen;
  p.data_bytes = b.size() - kTail - p.data_offset;
  std::size_t expect = 0;
  try {
    for (const json& e : p.header.at("params")) {
      std::size_t n = 1;
      for (const json& d : e.at("shape")) n *= d.get<std::size_t>();
      expect += n * 4;
    }
    for (const json& e : p.header.at("optim_state")) expect += e.at("numel").get<std::size_t>() * 4;
    if (p.header.contains("buffers"))
      for (const json& e : p.header.at("buffers")) {
        std::size_t n = 1;
        for (const json& d : e.at("shape")) n *= d.get<std::size_t>();
        expect += n * 4;
      }
  } catch (const json::exception& e) {
    throw Error(fmt::format("checkpoint {} is corrupt (header: {})", path, e.what()));
  }
  NL_CHECK(expect == p.data_bytes, "checkpoint {} is corrupt: {} data bytes, the header describes {}", path,
           p.data_bytes, expect);
  return p;
}

CheckpointMeta meta_of(const Parsed& p, const std::string& dir) {
  CheckpointMeta m;
  try {
    m.model = config_from_json(p.header.at("model"));
    m.step = p.header.at("step").get<std::int64_t>();
    m.rng_state = p.header.at("rng").get<std::string>();
    m.optimizer = p.header.at("optimizer").get<std::string>();
    m.extra = p.header.at("extra").dump();
  } catch (const json::exception& e) {
    throw Error(fmt::format("checkpoint {} is corrupt (header: {})", checkpoint_file(dir), e.what()));
  }
  return m;
}

void write_atomically(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  NL_CHECK(fd >= 0, "cannot write checkpoint {}: {}", tmp, std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(fmt::format("cannot write checkpoint {}: {}", tmp, std::strerror(err)));
    }
    done += static_cast<std::size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot write checkpoint {}: {}", path, std::strerror(err)));
  }
}

}  // namespace

std::string checkpoint_file(const std::string& dir) { return (fs::path(dir) / "checkpoint.bin").string(); }

std::string model_config_json(const ModelConfig& cfg) { return config_to_json(cfg).dump(); }
ModelConfig model_config_from_json(const std::string& text) {
  try {
    return config_from_json(json::parse(text));
  } catch (const json::exception& e) {
    throw Error(fmt::format("malformed model configuration JSON: {}", e.what()));
  }
}

void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, std::span<const ParamRef> params,
                     Optimizer* opt, std::span<const ParamRef> buffers) {
  json h;
  h["model"] = config_to_json(meta.model);
  h["step"] = meta.step;
  h["rng"] = meta.rng_state;
  h["optimizer"] = opt ? opt->kind() : "";
  h["optimizer_steps"] = opt ? opt->steps() : 0;
  h["params"] = json::array();
  for (const ParamRef& p : params) h["params"].push_back({{"name", p.name}, {"shape", p.shape.vec()}});
  std::vector<OptimStateRef> state;
  if (opt) state = opt->state();
  h["optim_state"] = json::array();
  for (const OptimStateRef& s : state) h["optim_state"].push_back({{"name", s.name}, {"numel", s.numel}});
  if (!buffers.empty()) {
    h["buffers"] = json::array();
    for (const ParamRef& b : buffers) h["buffers"].push_back({{"name", b.name}, {"shape", b.shape.vec()}});
  }
  try {
    h["extra"] = json::parse(meta.extra.empty() ? "{}" : meta.extra);
  } catch (const json::exception& e) {
    throw Error(fmt::format("checkpoint: extra metadata is not JSON: {}", e.what()));
  }
  const std::string header = h.dump();

  std::vector<std::uint8_t> out;
  put_bytes(out, kMagic, 8);
  put<std::uint32_t>(out, kCheckpointVersion);
  put<std::uint32_t>(out, 0);
  put<std::uint64_t>(out, header.size());
  put_bytes(out, header.data(), header.size());
  for (const ParamRef& p : params) put_bytes(out, p.data, static_cast<std::size_t>(p.numel()) * 4);
  for (const OptimStateRef& s : state) put_bytes(out, s.data, static_cast<std::size_t>(s.numel) * 4);
  for (const ParamRef& b : buffers) put_bytes(out, b.data, static_cast<std::size_t>(b.numel()) * 4);
  put<std::uint64_t>(out, fnv1a(out.data(), out.size()));
  put_bytes(out, kEndMagic, 8);

  std::error_code ec;
  fs::create_directories(dir, ec);
  NL_CHECK(!ec, "cannot create checkpoint folder {}: {}", dir, ec.message());
  write_atomically(checkpoint_file(dir), out);
}

CheckpointMeta read_checkpoint_meta(const std::string& dir) {
  const Parsed p = parse_file(dir);
  return meta_of(p, dir);
}

CheckpointMeta load_checkpoint(const std::string& dir, const ModelConfig& model, std::span<const ParamRef> params,
                               Optimizer* opt, std::span<const ParamRef> buffers) {
  const std::string path = checkpoint_file(dir);
  const Parsed p = parse_file(dir);
  CheckpointMeta meta = meta_of(p, dir);

  // The model configuration, field by field.
  const json saved = config_to_json(meta.model), here = config_to_json(model);
  for (auto it = saved.begin(); it != saved.end(); ++it)
    NL_CHECK(here.at(it.key()) == it.value(),
             "checkpoint {} was saved for a different model: {} = {} in the checkpoint, {} here", path, it.key(),
             it.value().dump(), here.at(it.key()).dump());

  // Parameter names and shapes.
  const json& hp = p.header.at("params");
  NL_CHECK(hp.size() == params.size(), "checkpoint {} has {} parameters, the model has {}", path, hp.size(),
           params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string name = hp[i].at("name").get<std::string>();
    const std::vector<Index> shape = hp[i].at("shape").get<std::vector<Index>>();
    NL_CHECK(name == params[i].name, "checkpoint {}: parameter {} is {} in the checkpoint, {} in the model", path,
             i, name, params[i].name);
    NL_CHECK(Dims(shape) == params[i].shape, "checkpoint {}: parameter {} has shape {} in the checkpoint, {} in the model",
             path, name, Dims(shape).str(), params[i].shape.str());
  }

  // Optimizer state.
  std::vector<OptimStateRef> state;
  const json& hs = p.header.at("optim_state");
  if (opt) {
    NL_CHECK(meta.optimizer == opt->kind(), "checkpoint {} holds {} optimizer state, the run uses {}", path,
             meta.optimizer.empty() ? "no" : meta.optimizer, opt->kind());
    state = opt->state();
    NL_CHECK(hs.size() == state.size(), "checkpoint {} has {} optimizer buffers, the optimizer has {}", path,
             hs.size(), state.size());
    for (std::size_t i = 0; i < state.size(); ++i)
      NL_CHECK(hs[i].at("name").get<std::string>() == state[i].name && hs[i].at("numel").get<Index>() == state[i].numel,
               "checkpoint {}: optimizer buffer {} is {} ({} values) in the checkpoint, {} ({} values) here", path, i,
               hs[i].at("name").get<std::string>(), hs[i].at("numel").get<Index>(), state[i].name, state[i].numel);
  }

  // Buffers (BatchNorm running statistics).
  const json hb = p.header.contains("buffers") ? p.header.at("buffers") : json::array();
  NL_CHECK(hb.size() == buffers.size(), "checkpoint {} has {} buffers (running statistics), the model has {}", path,
           hb.size(), buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i)
    NL_CHECK(hb[i].at("name").get<std::string>() == buffers[i].name &&
                 Dims(hb[i].at("shape").get<std::vector<Index>>()) == buffers[i].shape,
             "checkpoint {}: buffer {} is {} in the checkpoint, {} in the model", path, i,
             hb[i].at("name").get<std::string>(), buffers[i].name);

  // Everything checked: copy.
  const std::uint8_t* src = p.bytes.data() + p.data_offset;
  for (const ParamRef& q : params) {
    const std::size_t n = static_cast<std::size_t>(q.numel()) * 4;
    std::memcpy(q.data, src, n);
    src += n;
  }
  if (opt) {
    for (const OptimStateRef& s : state) {
      const std::size_t n = static_cast<std::size_t>(s.numel) * 4;
      std::memcpy(s.data, src, n);
      src += n;
    }
    opt->set_steps(p.header.at("optimizer_steps").get<std::int64_t>());
  } else {
    for (const json& e : hs) src += e.at("numel").get<std::size_t>() * 4;  // skip the optimizer state
  }
  for (const ParamRef& b : buffers) {
    const std::size_t n = static_cast<std::size_t>(b.numel()) * 4;
    std::memcpy(b.data, src, n);
    src += n;
  }
  return meta;
}

}  // namespace normlab::nn
