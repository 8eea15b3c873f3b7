// moonmoe/io/model_io.hpp: a Hugging Face checkpoint into an nn::Transformer and back, by HF tensor names.
//
// load_transformer<Model>(dir) resolves config.json against the model type (a static size that disagrees is an
// error naming the field; Dynamic sizes come from the file), builds the model and reads every parameter with its
// expected shape (F32, BF16, F16, or F8_E4M3 dequantised with its block scales). A tensor the model does not
// have is an error too, except the MTP modules DeepSeek-V3 stores as extra layers (HF ignores them as well).
//
// save_transformer(dir, model) writes the model back as a checkpoint directory that load_transformer and
// transformers' DeepseekV3ForCausalLM.from_pretrained read: config.json (the loaded file's, every field kept, or
// written from the model's configuration for a model built from a type), the weights in safetensors shards with
// model.safetensors.index.json when there are several (io/checkpoint_writer.hpp). It saves a whole model only: a
// part of one (a rank of a parallel run) is refused, and parallel/checkpoint.hpp saves the run instead. So:
//
//     auto model = moonmoe::load_transformer("in");           // or nn::Transformer<> model(MyModel::config);
//     ... model.train_step(ids, layout); opt.step(); ...       //    nn::init_weights(model, {.seed = 1});
//     moonmoe::save_transformer("out", model);
//     auto again = moonmoe::load_transformer("out");           // the same weights, bit for bit (F32)
#pragma once

#include <algorithm>

#include <cmath>
#include <deque>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../nn/transformer.hpp"
#include "checkpoint.hpp"
#include "hf_config_writer.hpp"
#include "memory_budget.hpp"
#include "checkpoint_writer.hpp"

namespace moonmoe {

/// How load_transformer reads a checkpoint.
struct LoadOptions {
    /// Bytes the model's parameters may take (values and gradients, plus optimizer state if counted below);
    /// unset: the memory available to this process when loading starts (MemAvailable and the cgroup limit).
    std::optional<double> memory_limit = std::nullopt;
    /// Count Muon / AdamW state in that budget too (for a caller that builds an optimizer next).
    bool with_optimizer_state = false;
    /// Refuse a weight holding NaN or Inf, naming the first such tensor and element (one pass over the weights).
    bool check_finite = false;
};

namespace detail {

/// Throws io_error if `values` holds a NaN or an infinity, naming the tensor, the element and its index.
template <class T>  // float or bf16
void check_finite_values(const std::string& where, const std::string& name, std::span<const index_t> shape,
                         std::span<const T> values) {
    const auto wide = [](T v) { return float(convert<float>(v)); };
    const auto bad = std::find_if(values.begin(), values.end(), [&](T v) { return !std::isfinite(wide(v)); });
    if (bad == values.end()) return;
    index_t flat = bad - values.begin();
    std::vector<index_t> index(shape.size());
    for (std::size_t d = shape.size(); d-- > 0;) index[d] = flat % shape[d], flat /= shape[d];
    throw io_error(where + ": tensor " + detail::quoted(name) + " holds " +
                   (std::isnan(wide(*bad)) ? "NaN" : "an infinity") + " at " + format_shape(index) +
                   " (the first non-finite weight of the checkpoint)");
}

/// The layer index N of "model.layers.N.<rest>", or nullopt.
inline std::optional<index_t> layer_of(std::string_view name) {
    constexpr std::string_view prefix = "model.layers.";
    if (!name.starts_with(prefix)) return std::nullopt;
    name.remove_prefix(prefix.size());
    index_t n = 0;
    std::size_t digits = 0;
    for (; digits < name.size() && digits < 18 && name[digits] >= '0' && name[digits] <= '9'; ++digits)
        n = n * 10 + (name[digits] - '0');
    return digits > 0 && digits < name.size() && name[digits] == '.' ? std::optional<index_t>(n) : std::nullopt;
}

/// The routed expert a tensor name belongs to ("model.layers.<l>.mlp.experts.<e>. ..."), if any.
inline std::optional<index_t> expert_of(std::string_view name) {
    constexpr std::string_view marker = ".mlp.experts.";
    const std::size_t at = name.find(marker);
    if (at == std::string_view::npos) return std::nullopt;
    name.remove_prefix(at + marker.size());
    index_t n = 0;
    std::size_t digits = 0;
    for (; digits < name.size() && digits < 18 && name[digits] >= '0' && name[digits] <= '9'; ++digits)
        n = n * 10 + (name[digits] - '0');
    return digits > 0 && digits < name.size() && name[digits] == '.' ? std::optional<index_t>(n) : std::nullopt;
}

/// Whether `name` is a tensor of the whole model that a part (nn::ModelPart: one rank's share in a parallel run)
/// leaves to other ranks: a layer it does not hold, an expert outside its range, the embedding or the head.
inline bool held_by_another_part(const nn::ModelPart& part, const ModelConfig& c, std::string_view name) {
    if (const auto layer = layer_of(name)) {
        if (*layer >= c.dims.layers) return false;  // not the model's (MTP modules are handled apart)
        if (std::find(part.layers.begin(), part.layers.end(), *layer) == part.layers.end()) return true;
        const auto expert = expert_of(name);
        const index_t count = part.expert_count < 0 ? c.moe.experts - part.first_expert : part.expert_count;
        return expert && *expert < c.moe.experts &&
               (*expert < part.first_expert || *expert >= part.first_expert + count);
    }
    if (name == "model.embed_tokens.weight") return !part.embedding;
    if (name == "model.norm.weight" || name == "lm_head.weight") return !part.head;
    return false;
}

/// What a part of the model holds, for messages: "layers 0-1 and 4, routed experts 0-3 of 8, the embedding, no
/// final norm / lm_head".
inline std::string describe_part(const nn::ModelPart& part, const ModelConfig& c) {
    std::string layers;
    for (std::size_t i = 0; i < part.layers.size();) {
        std::size_t j = i;
        while (j + 1 < part.layers.size() && part.layers[j + 1] == part.layers[j] + 1) ++j;
        const std::string run = std::to_string(part.layers[i]) + (j > i ? "-" + std::to_string(part.layers[j]) : "");
        layers += (i == 0 ? "" : j + 1 == part.layers.size() ? " and " : ", ") + run;
        i = j + 1;
    }
    const index_t count = part.expert_count < 0 ? c.moe.experts - part.first_expert : part.expert_count;
    std::string out =
        part.layers.empty() ? "no decoder layer" : (part.layers.size() == 1 ? "layer " : "layers ") + layers;
    out += " of " + std::to_string(c.dims.layers);
    if (c.dims.layers > c.dims.dense_layers)
        out += ", routed experts " +
               (count == 0 ? std::string("none")
                           : std::to_string(part.first_expert) +
                                 (count > 1 ? "-" + std::to_string(part.first_expert + count - 1) : "")) +
               " of " + std::to_string(c.moe.experts);
    out += part.embedding ? ", the embedding" : ", no embedding";
    out += part.head ? ", the final norm and lm_head" : ", no final norm / lm_head";
    return out;
}

/// A parameter's values as host memory: the parameter itself on a host-visible backend, else a copy kept in
/// `copies` (io is one of the named places where values cross to the host).
template <class B, class T>
std::span<const T> host_values(const T* data, index_t n, std::deque<std::vector<T>>& copies) {
    if constexpr (backend::host_visible<B>) {
        return {data, std::size_t(n)};
    } else {
        std::vector<T>& c = copies.emplace_back(std::size_t(n));
        backend::Memory<B>::to_host(c.data(), data, c.size() * sizeof(T));
        return c;
    }
}

/// A parameter's values as they are stored: f32 (the parameter or its master), or bf16 (Weights<BF16>).
template <class B>
NamedTensor stored_values(const ParamRef& p, std::deque<std::vector<float>>& copies,
                          std::deque<std::vector<bf16>>& copies16) {
    if (p.value) return {p.name, p.shape, host_values<B>(p.value, p.numel(), copies)};
    return {p.name, p.shape, {}, host_values<B>(static_cast<const bf16*>(p.value16), p.numel(), copies16)};
}

}  // namespace detail

/// Reads every parameter of `model` from `ck`; throws io_error naming the directory and tensor on any problem,
/// including tensors the checkpoint holds that the model has no place for. A part of the model (a parallel run's
/// rank, parallel/groups.hpp) reads its own tensors; those of the other parts are expected in the checkpoint and
/// left there (with a Checkpoint opened with Shards::as_needed, in shards it never opens: parallel/checkpoint.hpp's
/// load_checkpoint). The model keeps the checkpoint's config.json (hf_config_json), which a save writes back with
/// every field moonmoe does not model (bos_token_id, eos_token_id, ...).
///
/// DeepSeek-V3 stores its num_nextn_predict_layers multi-token-prediction modules as layers L, L+1, ... which the
/// model (like transformers) does not load. Such a layer is recognised by its MTP tensors (eh_proj, enorm,
/// hnorm); a layer at that index without them is an ordinary decoder layer, which means num_hidden_layers is
/// smaller than the checkpoint: refused, instead of silently dropping the layer.
template <class B>
void load_weights(nn::Transformer<B>& model, Checkpoint& ck, const LoadOptions& options = {}) {
    const std::string where = ck.directory().string();
    // Each tensor goes where the parameter keeps its values: f32 (the parameter, or the master an optimizer
    // attached) or, for a parameter stored in bf16 alone (Weights<BF16>), bf16 read as such.
    const auto load = [&]<class T>(const ParamRef& p, T* into, std::vector<T>& staging) {
        std::span<T> values;
        if constexpr (backend::host_visible<B>) {
            values = std::span<T>(into, std::size_t(p.numel()));
        } else {  // a device backend: one tensor at a time through the host
            staging.resize(std::size_t(p.numel()));
            values = staging;
        }
        if constexpr (std::is_same_v<T, bf16>) ck.read_bf16(p.name, std::span<const index_t>(p.shape), values);
        else
            ck.read_f32(p.name, std::span<const index_t>(p.shape), values);
        if (options.check_finite) detail::check_finite_values<T>(where, p.name, p.shape, values);
        if constexpr (!backend::host_visible<B>)
            backend::Memory<B>::to_device(into, values.data(), values.size_bytes());
    };
    std::vector<float> staging;
    std::vector<bf16> staging16;
    model.visit_params([&](const ParamRef& p) {
        if (p.value) load(p, p.value, staging);
        else
            load(p, p.value16, staging16);
    });
    model.refresh_working_weights();                 // bf16 compute: the bf16 values of the loaded f32 ones
    model.hf_config_json = ck.config().json.dump();  // saved back with the weights: bos / eos ids and all
    const index_t layers = model.config.dims.layers, mtp_layers = ck.config().mtp_layers;
    std::vector<std::string> extra;
    for (const std::string& name : ck.unused()) {
        const auto layer = detail::layer_of(name);
        const bool mtp = layer && *layer >= layers && *layer - layers < mtp_layers;
        if (mtp && !ck.contains("model.layers." + std::to_string(*layer) + ".eh_proj.weight"))
            throw io_error(where + ": tensor " + detail::quoted(name) + " belongs to layer " + std::to_string(*layer) +
                           ", which config.json's num_nextn_predict_layers " + std::to_string(mtp_layers) +
                           " makes a multi-token-prediction module, but the layer has no MTP tensors (eh_proj, "
                           "enorm, hnorm): it is a decoder layer, so num_hidden_layers " +
                           std::to_string(layers) + " is smaller than the checkpoint");
        if (!mtp && !detail::held_by_another_part(model.part, model.config, name)) extra.push_back(name);
    }
    if (!extra.empty()) {
        std::string list;
        for (std::size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + detail::quoted(extra[i]);
        if (extra.size() > 8) list += ", ... (" + std::to_string(extra.size()) + " in all)";
        throw io_error(where + ": tensors the model has no parameter for: " + list);
    }
}

/// A model of type `Model` (sizes static or Dynamic) with the weights of the checkpoint in `dir`, on the type's
/// backend (Backend<cuda>: the weights go to the GPU) unless B names another. Before anything
/// is allocated, the parameters' memory is estimated from config.json and refused beyond options.memory_limit
/// (default: the memory available), see io/memory_budget.hpp.
template <class Model = AnyDeepSeekV3, class B = typename Model::backend>
nn::Transformer<B> load_transformer(const std::filesystem::path& dir, const LoadOptions& options = {}) {
    Checkpoint ck(dir);
    const ModelConfig config = resolve(Model::config, ck.config());
    check_memory_budget(config, ck.config().source, options.memory_limit, options.with_optimizer_state);
    nn::Transformer<B> model(config);
    load_weights(model, ck, options);
    model.hf_config_json = ck.config().json.dump();
    return model;
}

/// How save_transformer writes a checkpoint.
struct SaveOptions {
    /// F32 (exact), or BF16 / F16 (rounded to nearest even, as torch rounds).
    DType store = DType::f32;
    /// Shard size limit: the weights are split into model-0000i-of-0000n.safetensors files of at most this many
    /// bytes (a larger tensor gets a file of its own) with an index; a model that fits is one model.safetensors.
    std::uint64_t max_shard_bytes = default_max_shard_bytes;
    /// config.json's initializer_range for a model built from a type (a loaded file's own value is kept).
    double initializer_range = 0.02;
    /// A parameter holding a NaN or an infinity makes the save refuse, naming it; true writes it as it is.
    bool allow_non_finite = false;
};

/// The config.json a saved `model` gets: the file it was loaded from (after checking that its sizes are the
/// model's), or one written from its configuration (io/hf_config_writer.hpp).
template <class B>
HFConfig saved_hf_config(const nn::Transformer<B>& model, double initializer_range = 0.02) {
    if (model.hf_config_json.empty()) return hf_config_for(model.config, initializer_range);
    HFConfig loaded = parse_hf_config(model.hf_config_json, "the config.json the model was loaded from");
    resolve(model.config, loaded);  // throws naming the field if the model's sizes are not the file's
    return loaded;
}

/// Saves `model` as a Hugging Face checkpoint directory `dir` (see the top of this file): config.json, and every
/// parameter under its HF name in shards. Creates `dir` if needed and replaces an existing checkpoint there as a
/// whole or not at all (the rules of io/checkpoint_writer.hpp: a directory holding anything but checkpoint and
/// tokenizer files is refused, and tokenizer files are kept).
///
/// The model must be whole: a part (one rank's share of a parallel run) would make a checkpoint that lacks the other
/// parts' tensors under the whole model's config.json, which transformers loads with those tensors drawn at random.
/// It is refused, naming what the part holds; every rank of the run calls parallel::save_checkpoint instead
/// (parallel/checkpoint.hpp), which writes the one checkpoint of the whole model.
template <class B>
void save_transformer(const std::filesystem::path& dir, nn::Transformer<B>& model, const SaveOptions& options = {}) {
    if (!model.is_whole())
        throw io_error(dir.string() + ": save_transformer was given a part of the model (" +
                       detail::describe_part(model.part, model.config) +
                       "), whose checkpoint would lack the other parts' tensors; save a parallel run with "
                       "parallel::save_checkpoint(dir, part, groups) on every rank (moonmoe/parallel/checkpoint.hpp), "
                       "which writes the whole model's checkpoint; nothing was written");
    const HFConfig config = saved_hf_config(model, options.initializer_range);
    std::vector<NamedTensor> tensors;
    std::deque<std::vector<float>> copies;  // host copies of a device backend's parameters
    std::deque<std::vector<bf16>> copies16;
    model.visit_params([&](const ParamRef& p) { tensors.push_back(detail::stored_values<B>(p, copies, copies16)); });
    if (!options.allow_non_finite) detail::refuse_non_finite(tensors, dir.string());
    write_sharded_checkpoint(dir, config, tensors, options.store, options.max_shard_bytes);
}

/// Every parameter value (what = values) or gradient (what = gradients) under its HF name, plus `extra` tensors.
enum class Saved { values, gradients };

template <class B>
void save_parameters(const std::filesystem::path& file, nn::Transformer<B>& model, Saved what,
                     std::span<const NamedTensor> extra = {}) {
    std::vector<NamedTensor> tensors(extra.begin(), extra.end());
    std::deque<std::vector<float>> copies;
    std::deque<std::vector<bf16>> copies16;
    model.visit_params([&](const ParamRef& p) {
        if (what == Saved::values) return tensors.push_back(detail::stored_values<B>(p, copies, copies16));
        if (!p.grad) return;  // the router bias has no gradient
        tensors.push_back(
            {p.name, p.shape, detail::host_values<B>(static_cast<const float*>(p.grad), p.numel(), copies)});
    });
    write_tensors(file, tensors);
}

}  // namespace moonmoe
