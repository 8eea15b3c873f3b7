// Reading the committed Hugging Face reference outputs (test/data/<model>/*.safetensors) in tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <moonmoe/io/convert.hpp>
#include <moonmoe/io/safetensors.hpp>
#include <moonmoe/nn/param.hpp>
#include <moonmoe/tensor/transfer.hpp>

namespace moonmoe::testing {

inline std::string data_dir(const std::string& name) { return std::string(MOONMOE_TEST_SOURCE_DIR) + "/data/" + name; }

struct Reference {
    SafetensorsFile file;
    explicit Reference(const std::string& path) : file(path) {}
    std::vector<float> f32(const std::string& name) const { return to_f32(file.at(name)); }
    std::vector<index_t> i64(const std::string& name) const {
        const TensorRecord& r = file.at(name);
        std::vector<index_t> out(std::size_t(r.numel()));
        std::memcpy(out.data(), r.bytes.data(), out.size() * sizeof(index_t));
        return out;
    }
    std::vector<index_t> shape(const std::string& name) const { return file.at(name).shape; }
};

/// The n floats at `p` in backend B's memory (a parameter's value or gradient), on the host.
template <class B>
std::vector<float> floats_to_host(const float* p, index_t n) {
    return to_host(View<const float, 1, B>(p, {n}));
}

/// Every parameter gradient of `model` (anything with visit_params(f)) on the host, by name.
template <class B, class Model>
std::map<std::string, std::vector<float>> gradients_of(Model& model) {
    std::map<std::string, std::vector<float>> out;
    model.visit_params([&](const ParamRef& p) {
        if (p.grad) out[p.name] = floats_to_host<B>(p.grad, p.numel());
    });
    return out;
}

/// max |a - b| / max |b|: the error relative to the reference tensor's scale.
inline double scaled_error(const float* a, const std::vector<float>& b) {
    double diff = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < b.size(); ++i) {
        diff = std::max(diff, std::abs(double(a[i]) - b[i]));
        scale = std::max(scale, std::abs(double(b[i])));
    }
    return scale > 0 ? diff / scale : diff;
}

}  // namespace moonmoe::testing
