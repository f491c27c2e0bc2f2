// Checkpoints: weights + optimizer state + step + the data sampler's RNG state + the ModelConfig.
//
// One file, DIR/checkpoint.bin, written atomically (DIR/checkpoint.bin.tmp.<pid>, fsync, rename):
//   "NLCKPT\r\n" (8 bytes)   magic
//   u32 version (1), u32 0   little-endian
//   u64 n, then n bytes      header: JSON {model, step, rng, optimizer, optimizer_steps,
//                            params: [{name, shape}], optim_state: [{name, numel}], extra}
//   float32 data             every parameter in params order, then every optimizer state buffer
//   u64 FNV-1a 64            of every byte before it
//   "NLCKEND\n"              end magic
// A missing, truncated or corrupt file, another version, a different ModelConfig, other parameter
// names/shapes or another optimizer throw normlab::Error naming the file and what differs; nothing is
// modified unless the whole checkpoint is valid.
#pragma once

#include <normlab/nn/model.h>
#include <normlab/nn/optim.h>

#include <cstdint>
#include <span>
#include <string>

namespace normlab::nn {

inline constexpr std::uint32_t kCheckpointVersion = 1;

struct CheckpointMeta {
  ModelConfig model;
  std::int64_t step = 0;       // training steps completed
  std::string rng_state;       // BatchSampler::rng_state()
  std::string extra = "{}";    // caller's JSON text (the training configuration)
  std::string optimizer;       // read back: the optimizer's kind, "" when none was saved
};

std::string checkpoint_file(const std::string& dir);  // DIR/checkpoint.bin

// Creates DIR when needed. `opt` may be nullptr (weights only). `buffers`: the model's non-trained state
// (Model::buffers(): BatchNorm running statistics), saved after the optimizer state; the header lists
// them under "buffers" (absent when there are none, as in files written before BatchNorm existed).
void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, std::span<const ParamRef> params,
                     Optimizer* opt, std::span<const ParamRef> buffers = {});

// The metadata alone (header; the checksum is verified): enough to build the Model before loading.
CheckpointMeta read_checkpoint_meta(const std::string& dir);

// Verifies everything against `model` (its ModelConfig must equal the saved one) and `params`/`opt`,
// then copies the weights and, when opt is not nullptr, the optimizer state and step count.
// `buffers` (Model::buffers()) must match the saved ones by name and shape; they are copied too.
CheckpointMeta load_checkpoint(const std::string& dir, const ModelConfig& model, std::span<const ParamRef> params,
                               Optimizer* opt, std::span<const ParamRef> buffers = {});

// ModelConfig ↔ JSON text (every field; enums as their integer values).
std::string model_config_json(const ModelConfig& cfg);
ModelConfig model_config_from_json(const std::string& json);

}  // namespace normlab::nn
