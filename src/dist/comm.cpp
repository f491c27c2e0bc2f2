// The communicator: MPI_Allgather and sums in rank order (include/normlab/dist.h).
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

std::vector<double> Comm::allgather(std::span<const double> local) const {
  // The lengths first: a rank with a different length would otherwise make MPI_Allgather read past buffers.
  const double n = static_cast<double>(local.size());
  double ns[1] = {n};
  std::vector<double> all_n(static_cast<std::size_t>(size_));
  mpi_check(MPI_Allgather(ns, 1, MPI_DOUBLE, all_n.data(), 1, MPI_DOUBLE, comm_), "MPI_Allgather");
  for (int r = 0; r < size_; ++r)
    NL_CHECK(all_n[static_cast<std::size_t>(r)] == n, "dist: rank {} contributes {} values, rank {} {}",
             rank_, local.size(), r, all_n[static_cast<std::size_t>(r)]);
  NL_CHECK(local.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
           "dist: {} values exceed MPI's count limit", local.size());
  std::vector<double> all(local.size() * static_cast<std::size_t>(size_));
  if (!local.empty())
    mpi_check(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_DOUBLE, all.data(),
                            static_cast<int>(local.size()), MPI_DOUBLE, comm_),
              "MPI_Allgather");
  return all;
}

void Comm::allreduce_sum(std::span<double> v) const {
  const std::vector<double> all = allgather(v);
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) {
    double s = all[i];
    for (std::size_t r = 1; r < static_cast<std::size_t>(size_); ++r) s += all[r * n + i];
    v[i] = s;
  }
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
