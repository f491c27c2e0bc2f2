// Forwarding header: the optimizer API lives in include/normlab/nn/optim.h.
#pragma once

#include <normlab/nn/optim.h>
