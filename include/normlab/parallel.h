// normlab/parallel.h — threading controls.
//
// normlab threads with OpenMP. Reductions across rows, segments or groups are split into chunks whose
// boundaries depend on the problem shape only, never on the number of threads, and their partial results
// are combined in chunk order; work whose items are independent (each row's, segment's or group's own
// arithmetic) is cut into one range per thread. Either way the same inputs give the same bits for any
// thread count.
#pragma once

namespace normlab {

// Threads used by normlab's kernels; n ≥ 1. The default is the OpenMP default (all cores).
void set_num_threads(int n);
int num_threads();

}  // namespace normlab
