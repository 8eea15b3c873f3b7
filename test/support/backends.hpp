// Which backends a test written once runs on: Backend<cpu> always; Backend<cuda> too in the build that defines
// MOONMOE_TEST_CUDA (the emulated CUDA backend under g++ with Thrust's OpenMP system, or nvcc on a GPU).
// Use as TEST_CASE_TEMPLATE("...", B, MOONMOE_TEST_BACKENDS) and move data with the helpers below.
#pragma once

#include <doctest/doctest.h>

#include <span>
#include <vector>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/tensor/transfer.hpp>
#if defined(MOONMOE_TEST_CUDA)
#include <moonmoe/backend/cuda.hpp>
#define MOONMOE_TEST_BACKENDS moonmoe::cpu, moonmoe::cuda
#else
#define MOONMOE_TEST_BACKENDS moonmoe::cpu
#endif

// Test names end in <cpu> or <cuda>: the emulated build registers only the <cuda> instances with ctest.
TYPE_TO_STRING_AS("cpu", moonmoe::cpu);
#if defined(MOONMOE_TEST_CUDA)
TYPE_TO_STRING_AS("cuda", moonmoe::cuda);
#endif

namespace moonmoe::testing {

/// A backend copy of a host tensor.
template <class B, class T, int Rank>
Tensor<T, Rank, B> on(const Tensor<T, Rank, cpu>& host) {
    return to_device<B, Rank>(std::span<const T>(host.data(), std::size_t(host.numel())), host.shape());
}

/// A host copy of a backend tensor.
template <class T, int Rank, class B>
Tensor<T, Rank, cpu> host(const Tensor<T, Rank, B>& t) {
    Tensor<T, Rank, cpu> out(t.shape());
    const std::vector<T> v = to_host(t);
    std::copy(v.begin(), v.end(), out.data());
    return out;
}

}  // namespace moonmoe::testing
