// normlab/parallel.h — threading controls.
//
// normlab threads with OpenMP. Work is always split into chunks whose boundaries depend on the problem
// shape only, never on the number of threads, and partial results are combined in chunk order: the
// same inputs give the same bits for any thread count.
#pragma once

namespace normlab {

// Threads used by normlab's kernels; n ≥ 1. The default is the OpenMP default (all cores).
void set_num_threads(int n);
int num_threads();

}  // namespace normlab
