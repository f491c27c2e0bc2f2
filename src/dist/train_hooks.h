// The training loop's data-parallel hooks over MPI (internal: nn::DataParallel lives in src/nn/train.h).
#pragma once
#include <normlab/dist.h>

#include "nn/train.h"

namespace normlab::dist {

// Σ_r w_r·v_r / Σ_r w_r over ranks (rank order; the same bits on every rank).
double weighted_mean(const Comm& comm, double value, double weight);
// nn::train()'s hooks: broadcast_params from rank 0, average_gradients, weighted_mean, all on `comm`
// (copied into the hooks; the communicator must outlive the training run).
nn::DataParallel data_parallel(const Comm& comm);

}  // namespace normlab::dist
