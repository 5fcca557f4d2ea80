// The kernels examples call, in one include. See kernels/context.hpp for the launch contract
// (streams, layouts, determinism) that every kernel follows.
#pragma once

#include "kernels/adam.hpp"
#include "kernels/attention.hpp"
#include "kernels/context.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/cpu_adam.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gemm.hpp"
#include "kernels/grad_norm.hpp"
#include "kernels/layer_norm.hpp"
#include "kernels/numa_array.hpp"
#include "kernels/pooling.hpp"
#include "kernels/softmax_cross_entropy.hpp"
