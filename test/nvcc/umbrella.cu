// The umbrella header in a CUDA translation unit: the configuration layer must compile under nvcc (-std=c++20)
// and its constexpr accounting must agree with the host compiler's.
#include <moonmoe/moonmoe.hpp>

static_assert(moonmoe::KimiK2::parameter_count() == 1'026'408'232'448);
static_assert(moonmoe::DeepSeekV3::parameter_count() == 671'026'419'200);
static_assert(moonmoe::KimiK2::activated_parameter_count() == 31'687'095'808);
static_assert(moonmoe::yarn_correction_range(moonmoe::DeepSeekV3::config.rope, 64).high == 23);

// Compile-time configuration is usable in device code: a kernel reads sizes straight from the model type.
__global__ void write_k2_shape(moonmoe::index_t* out) {
    using K2 = moonmoe::KimiK2;
    out[0] = K2::config.dims.hidden;
    out[1] = K2::config.moe.experts;
    out[2] = K2::config.attention.kv_rank + K2::config.attention.rope_dim;  // latent cache width, 576
}
