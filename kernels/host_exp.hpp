// Exponentials for the cpu launchers: four at a time through glibc's vector math library
// (libmvec) where the build found it, else the scalar expf. See Note [Host exponentials].
#pragma once

#include <cstddef>

namespace spillway::kernels::detail {

// Note [Host exponentials]
// GELU and the causal softmax spend most of their host time in expf: called once per element,
// glibc's scalar expf took about 3.5 ns a value here, so a small GPT layer's GELU took as long
// as the GEMM in front of it. libmvec's 4-wide expf (the SSE variant, which every x86-64 CPU
// runs) takes about a third of that. Its results are within a few ulp of expf, and, like expf's on the
// device, need not be expf's bits; what the launchers need is that they do not change: each
// element's result depends on its value alone, not on its neighbours, the length of the array
// or where it starts, so a kernel repeats bit for bit whatever its chunks (Note [Deterministic
// kernels]) and a float32 body and its bf16 twin agree. host_exp(x) gives the same bits
// exp_in_place gives x. Without libmvec both call expf.

/// v[i] = e^v[i] for every i < n.
void exp_in_place(float* v, std::size_t n);

/// e^x, the bits exp_in_place gives x.
float host_exp(float x);

}  // namespace spillway::kernels::detail
