// normlab/dist.h — data parallelism over MPI: a communicator with deterministic reductions, SyncBatchNorm,
// and gradient averaging for the Transformer engine (library normlab_dist; the core library has no MPI).
//
// Determinism: every reduction here sums the ranks' values in rank order (0, 1, ..., size−1) in double, each
// element on one rank (a reduce-scatter by MPI_Alltoallv, then MPI_Allgatherv), or on every rank after an
// MPI_Allgather. MPI_Allreduce may combine in any order (and differently on different ranks), which would
// break "the same bits on every rank and in every run".
//
// Errors: a check that fails on one rank only must not leave the others waiting inside a collective call.
// Every collective function below validates its arguments locally first, then all ranks exchange a status
// (Comm::agree), and either all go on or all throw normlab::Error (the failing rank with its own message).
// The program must have called MPI_Init; the library never initializes or aborts MPI.
#pragma once
#include <mpi.h>
#include <normlab/nn/model.h>
#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <span>
#include <string>
#include <vector>

namespace normlab::dist {

class Comm {
 public:
  explicit Comm(MPI_Comm comm);
  static Comm world();  // MPI_COMM_WORLD

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const { return comm_; }

  // Every rank's `local` (the same length on every rank), rank-major: size()·local.size() values.
  std::vector<double> allgather(std::span<const double> local) const;
  // v ← Σ_r v_r elementwise, summed in rank order (the same bits on every rank). Each rank sums 1/size() of
  // the elements and receives the others' sums: about 2·v.size() values in and out per rank, whatever
  // size() is (an allgather would bring size()·v.size()).
  void allreduce_sum(std::span<double> v) const;
  // v ← Σ_r weights[r]·v_r elementwise, summed in rank order from 0 (0 + w_0·v_0 + w_1·v_1 + ...), as
  // allreduce_sum. `weights` has size() entries, the same on every rank.
  void weighted_sum(std::span<double> v, std::span<const double> weights) const;
  // Collective status check: throws normlab::Error on every rank when `local_error` is non-empty on any
  // rank (this rank's message, or one naming the first failing rank). Returns normally otherwise.
  void agree(const std::string& local_error) const;
  // The same value from every rank? (e.g. a shape); throws on every rank otherwise, naming `what`.
  void check_same(std::span<const double> v, const std::string& what) const;

 private:
  // The same n on every rank, and size() weights on every rank when `weighted`: an Error on every rank
  // otherwise.
  void check_lengths(std::size_t n, std::size_t weights, bool weighted) const;
  void sum_in_rank_order(std::span<double> v, std::span<const double> weights, bool weighted) const;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

// ---- SyncBatchNorm -----------------------------------------------------------------------------------
// BatchNorm whose batch statistics are those of the union of every rank's batch (PyTorch's
// torch.nn.SyncBatchNorm). Each rank passes its own x [B_r, C, S...] (B_r ≥ 1 and S may differ between
// ranks; C must not), with lengths as in batch_norm_forward. In training mode:
//   forward:  per channel, each rank's count n_r, mean_r and M2_r (normlab's exact moments, chnorm::moments)
//             are merged in rank order: n = Σ n_r, mean = Σ n_r·mean_r / n, M2 = Σ (M2_r + n_r·(mean_r −
//             mean)²) (Chan et al.), var = M2 / n; y, save_mean, save_rstd and the running statistics as
//             batch_norm_forward with these (the same running-stat rules and momentum convention).
//   backward: the statistics are recomputed as in the forward; Σ dy and Σ dy·x̂ per channel are summed over
//             ranks (rank order); dx as batch_norm_backward with those sums. dweight and dbias are THIS
//             rank's sums, as in PyTorch (the data-parallel gradient averaging combines them).
// With one rank the results equal batch_norm_forward / batch_norm_backward's up to the order of the
// last double sums. Eval mode (training = false) uses the running statistics and does not communicate.
void sync_batch_norm_forward(const Comm& comm, View y, View save_mean, View save_rstd, View running_mean,
                             View running_var, Index* num_batches_tracked, ConstView x, ConstView weight,
                             ConstView bias, std::span<const Index> lengths = {},
                             const BatchNormOptions& opt = {});
void sync_batch_norm_backward(const Comm& comm, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                              ConstView weight, ConstView running_mean, ConstView running_var,
                              std::span<const Index> lengths = {}, const BatchNormOptions& opt = {},
                              GradMode mode = GradMode::kOverwrite);

// ---- data-parallel training ------------------------------------------------------------------------
// Gradient averaging of a data-parallel step: every rank ran forward/backward on its own shard of the batch;
// each gradient becomes Σ_r w_r·g_r / Σ_r w_r (double, rank order, rounded once), the same bits on every
// rank (w_r ≥ 0, Σ w_r > 0). With w_r = the number of predicted tokens in rank r's shard and a loss that is
// the mean over them (Model::forward), the result is the gradient of the mean loss over the whole batch. The
// parameter lists must have the same names and shapes on every rank (checked). Cost: one
// Comm::weighted_sum of all gradients in double, about 2·numel values in and out per rank.
void average_gradients(const Comm& comm, std::span<const nn::ParamRef> params, double weight = 1.0);
// Copies the parameters (or buffers) of rank `root` to every rank (PyTorch DDP does this at construction).
void broadcast_params(const Comm& comm, std::span<const nn::ParamRef> params, int root = 0);
// The whole training loop (nn::train in src/nn/train.h) runs data-parallel with the hooks of
// dist::data_parallel(comm) (src/dist/train_hooks.h); `normlab train` uses them when started by mpirun.

}  // namespace normlab::dist
