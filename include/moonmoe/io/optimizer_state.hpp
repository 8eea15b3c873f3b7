// moonmoe/io/optimizer_state.hpp: an optimizer's state to a safetensors file and back, bit for bit.
//
// Tensors `<param>.momentum` (Muon), `<param>.exp_avg` and `<param>.exp_avg_sq` (AdamW), and `<param>.master` (the
// f32 master of a parameter stored in bf16, Weights<BF16>), F32, shaped like the parameter; the step count in the
// metadata ("step"). Loading a master rounds it into the bf16 parameter too. Loading checks that every slot finds its state with the
// right shape and that the file holds nothing else, naming the file and tensor otherwise.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "../optim/optimizer.hpp"
#include "../tensor/transfer.hpp"
#include "checkpoint.hpp"

namespace moonmoe {

template <class Config, class B>
void save_optimizer_state(const std::filesystem::path& file, optim::Optimizer<Config, B>& opt) {
    SafetensorsWriter w;
    w.metadata("format", "pt");
    w.metadata("step", std::to_string(opt.steps()));
    for (auto& s : opt.slots()) {
        // The state lives on the optimizer's backend: to_host is the io crossing.
        if (!s.momentum.empty()) w.add_f32(s.param.name + ".momentum", s.param.shape, to_host(s.momentum));
        if (!s.exp_avg.empty()) {
            w.add_f32(s.param.name + ".exp_avg", s.param.shape, to_host(s.exp_avg));
            w.add_f32(s.param.name + ".exp_avg_sq", s.param.shape, to_host(s.exp_avg_sq));
        }
        if (!s.master.empty()) w.add_f32(s.param.name + ".master", s.param.shape, to_host(s.master));
    }
    w.write(file);
}

template <class Config, class B>
void load_optimizer_state(const std::filesystem::path& file, optim::Optimizer<Config, B>& opt) {
    SafetensorsFile f(file);
    const auto& meta = f.metadata();
    const auto step = meta.find("step");
    if (step == meta.end()) throw io_error(file.string() + ": no \"step\" in the metadata; not an optimizer state");
    std::set<std::string> expected;
    auto read = [&](const std::string& name, const std::vector<index_t>& shape, Tensor<float, 1, B>& out) {
        expected.insert(name);
        const TensorRecord& r = f.at(name);
        if (r.dtype != DType::f32 || r.shape != shape)
            throw io_error(file.string() + ": " + detail::quoted(name) + " is " + std::string(dtype_name(r.dtype)) + " " +
                           detail::format_shape(r.shape) + ", expected F32 " + detail::format_shape(shape));
        const std::vector<float> values = to_f32(r);
        copy_to_device(std::span<const float>(values), out.view());  // the io crossing onto the optimizer's backend
    };
    for (auto& s : opt.slots()) {
        if (!s.momentum.empty()) read(s.param.name + ".momentum", s.param.shape, s.momentum);
        if (!s.exp_avg.empty()) {
            read(s.param.name + ".exp_avg", s.param.shape, s.exp_avg);
            read(s.param.name + ".exp_avg_sq", s.param.shape, s.exp_avg_sq);
        }
        if (!s.master.empty()) read(s.param.name + ".master", s.param.shape, s.master);
    }
    for (const std::string& name : f.names())
        if (!expected.count(name)) throw io_error(file.string() + ": state for an unknown parameter: " + detail::quoted(name));
    opt.set_steps(std::stoll(step->second));
    opt.round_masters();
}

}  // namespace moonmoe
