// main() of the MPI test executable: MPI_Init around GoogleTest. CTest runs it under mpirun with 1, 2 and 3
// ranks; a failure on any rank makes that rank's exit status (and so mpirun's) non-zero.
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one progress log (rank 0's); other ranks still print their failures
    ::testing::TestEventListeners& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
    struct FailurePrinter : ::testing::EmptyTestEventListener {
      int rank;
      explicit FailurePrinter(int r) : rank(r) {}
      void OnTestPartResult(const ::testing::TestPartResult& r) override {
        if (r.failed())
          std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank, r.file_name() ? r.file_name() : "?",
                       r.line_number(), r.summary());
      }
    };
    l.Append(new FailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
