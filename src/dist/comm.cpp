// The communicator: gathers, and sums in rank order (include/normlab/dist.h).
#include <normlab/dist.h>
#include <normlab/error.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace normlab::dist {

namespace {

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(fmt::format("dist: {} failed: {}", what, std::string(msg, static_cast<std::size_t>(len))));
}

}  // namespace

Comm::Comm(MPI_Comm comm) : comm_(comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  NL_CHECK(initialized, "dist: MPI is not initialized (call MPI_Init first)");
  mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

Comm Comm::world() {
  return Comm(MPI_COMM_WORLD);
}

// The lengths first, from every rank to every rank: a rank with a different length would otherwise make a
// collective read past buffers. Every rank sees every rank's lengths, so all throw on a mismatch. When
// `weighted`, every rank must give size() weights.
void Comm::check_lengths(std::size_t n, std::size_t weights, bool weighted) const {
  const double mine[2] = {static_cast<double>(n), static_cast<double>(weights)};
  std::vector<double> all(2 * static_cast<std::size_t>(size_));
  mpi_check(MPI_Allgather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, comm_), "MPI_Allgather");
  for (int r = 0; r < size_; ++r) {
    const double nr = all[2 * static_cast<std::size_t>(r)], wr = all[2 * static_cast<std::size_t>(r) + 1];
    NL_CHECK(nr == mine[0], "dist: rank {} contributes {} values, rank {} {}", rank_, n, r, nr);
    NL_CHECK(!weighted || wr == size_, "dist: rank {} gives {} weights for {} ranks", r, wr, size_);
  }
  NL_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
           "dist: {} values exceed MPI's count limit", n);
}

std::vector<double> Comm::allgather(std::span<const double> local) const {
  check_lengths(local.size(), 0, false);
  std::vector<double> all(local.size() * static_cast<std::size_t>(size_));
  if (!local.empty())
    mpi_check(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_DOUBLE, all.data(),
                            static_cast<int>(local.size()), MPI_DOUBLE, comm_),
              "MPI_Allgather");
  return all;
}

// Rank q owns the slice [n·q/size, n·(q+1)/size) of v. MPI_Alltoallv hands every rank the slices it owns
// from all ranks (rank-major), it sums them in rank order, and MPI_Allgatherv hands the summed slices to
// every rank. Each element is summed by one rank, in the order of a sum of allgather's values in rank
// order, so every rank gets those bits.
void Comm::sum_in_rank_order(std::span<double> v, std::span<const double> w, bool weighted) const {
  check_lengths(v.size(), w.size(), weighted);
  if (v.empty()) return;
  const std::size_t n = v.size(), P = static_cast<std::size_t>(size_);
  std::vector<int> counts(P), displs(P);
  for (std::size_t q = 0; q < P; ++q) {
    displs[q] = static_cast<int>(n * q / P);
    counts[q] = static_cast<int>(n * (q + 1) / P) - displs[q];
  }
  const std::size_t me = static_cast<std::size_t>(rank_);
  const std::size_t mine = static_cast<std::size_t>(counts[me]), lo = static_cast<std::size_t>(displs[me]);
  std::vector<double> slices(P * mine);  // rank r's values of this rank's slice at [r·mine, (r+1)·mine)
  std::vector<int> rcounts(P, counts[me]), rdispls(P);
  for (std::size_t r = 0; r < P; ++r) rdispls[r] = static_cast<int>(r * mine);
  mpi_check(MPI_Alltoallv(v.data(), counts.data(), displs.data(), MPI_DOUBLE, slices.data(), rcounts.data(),
                          rdispls.data(), MPI_DOUBLE, comm_),
            "MPI_Alltoallv");
  for (std::size_t i = 0; i < mine; ++i) {
    double s;
    if (!weighted) {
      s = slices[i];  // s = v_0 + v_1 + ... + v_{P−1}
      for (std::size_t r = 1; r < P; ++r) s += slices[r * mine + i];
    } else {
      s = 0;  // s = 0 + w_0·v_0 + w_1·v_1 + ...
      for (std::size_t r = 0; r < P; ++r) s += w[r] * slices[r * mine + i];
    }
    v[lo + i] = s;
  }
  mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.data(), counts.data(), displs.data(),
                           MPI_DOUBLE, comm_),
            "MPI_Allgatherv");
}

void Comm::allreduce_sum(std::span<double> v) const {
  sum_in_rank_order(v, {}, false);
}

void Comm::weighted_sum(std::span<double> v, std::span<const double> weights) const {
  sum_in_rank_order(v, weights, true);
}

void Comm::agree(const std::string& local_error) const {
  int bad = local_error.empty() ? 0 : 1;
  std::vector<int> all(static_cast<std::size_t>(size_));
  mpi_check(MPI_Allgather(&bad, 1, MPI_INT, all.data(), 1, MPI_INT, comm_), "MPI_Allgather");
  if (!local_error.empty()) throw Error(local_error);
  for (int r = 0; r < size_; ++r)
    if (all[static_cast<std::size_t>(r)])
      throw Error(fmt::format(
          "dist: rank {} rejected its input (its error names the cause); rank {} stops too", r, rank_));
}

void Comm::check_same(std::span<const double> v, const std::string& what) const {
  const std::vector<double> all = allgather(v);
  const std::size_t n = v.size();
  for (int r = 0; r < size_; ++r)
    for (std::size_t i = 0; i < n; ++i)
      NL_CHECK(std::memcmp(&all[static_cast<std::size_t>(r) * n + i], &v[i], sizeof(double)) == 0,
               "dist: {} differs between ranks (rank {}: {}, rank {}: {})", what, rank_, v[i], r,
               all[static_cast<std::size_t>(r) * n + i]);
}

}  // namespace normlab::dist
