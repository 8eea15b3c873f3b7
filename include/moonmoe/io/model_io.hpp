// moonmoe/io/model_io.hpp: a Hugging Face checkpoint into an nn::Transformer and back, by HF tensor names.
//
// load_transformer<Model>(dir) resolves config.json against the model type (a static size that disagrees is an
// error naming the field; Dynamic sizes come from the file), builds the model and reads every parameter with its
// expected shape (F32, BF16, F16, or F8_E4M3 dequantised with its block scales). A tensor the model does not
// have is an error too, except the MTP modules DeepSeek-V3 stores as extra layers (HF ignores them as well).
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "../nn/transformer.hpp"
#include "checkpoint.hpp"

namespace moonmoe {

/// Reads every parameter of `model` from `ck`; throws io_error naming the directory and tensor on any problem,
/// including tensors the checkpoint holds that the model has no place for.
template <class B>
void load_weights(nn::Transformer<B>& model, Checkpoint& ck) {
    model.visit_params([&](const ParamRef& p) {
        ck.read_f32(p.name, std::span<const index_t>(p.shape), std::span<float>(p.value, std::size_t(p.numel())));
    });
    const index_t layers = model.config.dims.layers;
    std::vector<std::string> extra;
    for (const std::string& name : ck.unused()) {
        bool mtp = false;  // model.layers.<L + i>.* for the i < num_nextn_predict_layers MTP modules
        for (index_t i = 0; i < ck.config().mtp_layers; ++i)
            mtp = mtp || name.starts_with("model.layers." + std::to_string(layers + i) + ".");
        if (!mtp) extra.push_back(name);
    }
    if (!extra.empty()) {
        std::string list;
        for (std::size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
        if (extra.size() > 8) list += ", ... (" + std::to_string(extra.size()) + " in all)";
        throw io_error(std::filesystem::path(ck.files().front()).parent_path().string() +
                       ": tensors the model has no parameter for: " + list);
    }
}

/// A model of type `Model` (sizes static or Dynamic) with the weights of the checkpoint in `dir`.
template <class Model = AnyDeepSeekV3, class B = cpu>
nn::Transformer<B> load_transformer(const std::filesystem::path& dir) {
    Checkpoint ck(dir);
    nn::Transformer<B> model(resolve(Model::config, ck.config()));
    load_weights(model, ck);
    return model;
}

/// Every parameter value (what = values) or gradient (what = gradients) under its HF name, plus `extra` tensors.
enum class Saved { values, gradients };

template <class B>
void save_parameters(const std::filesystem::path& file, nn::Transformer<B>& model, Saved what,
                     std::span<const NamedTensor> extra = {}) {
    std::vector<NamedTensor> tensors(extra.begin(), extra.end());
    model.visit_params([&](const ParamRef& p) {
        const float* data = what == Saved::values ? p.value : p.grad;
        if (!data) return;  // the router bias has no gradient
        tensors.push_back({p.name, p.shape, std::span<const float>(data, std::size_t(p.numel()))});
    });
    write_tensors(file, tensors);
}

}  // namespace moonmoe
