// moonmoe/io/optimizer_state.hpp: an optimizer's state to a safetensors file and back, bit for bit.
//
// Tensors `<param>.momentum` (Muon), `<param>.exp_avg` and `<param>.exp_avg_sq` (AdamW), and `<param>.master` (the
// f32 master of a parameter stored in bf16, Weights<BF16>), F32, shaped like the parameter; the step count in the
// metadata ("step"). Loading a master rounds it into the bf16 parameter too. Loading checks that every slot finds its
// state with the right shape and that the file holds nothing else, naming the file and tensor otherwise.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "../optim/optimizer.hpp"
#include "../tensor/transfer.hpp"
#include "checkpoint.hpp"

namespace moonmoe {

namespace detail {

/// Calls f(name, state) on each state tensor of optimizer slot `s` (none for a slot routed to no update).
template <class Slot, class F>
void for_each_state(Slot& s, F&& f) {
    if (!s.momentum.empty()) f(s.param.name + ".momentum", s.momentum);
    if (!s.exp_avg.empty()) {
        f(s.param.name + ".exp_avg", s.exp_avg);
        f(s.param.name + ".exp_avg_sq", s.exp_avg_sq);
    }
    if (!s.master.empty()) f(s.param.name + ".master", s.master);
}

/// Reads state tensor `name` of `file` into `out` (on the optimizer's backend), F32 of the parameter's shape.
template <class B>
void read_state(const SafetensorsFile& file, const std::string& name, const std::vector<index_t>& shape,
                Tensor<float, 1, B>& out) {
    const TensorRecord& r = file.at(name);
    if (r.dtype != DType::f32 || r.shape != shape)
        throw io_error(file.path() + ": " + detail::quoted(name) + " is " + std::string(dtype_name(r.dtype)) + " " +
                       detail::format_shape(r.shape) + ", expected F32 " + detail::format_shape(shape));
    const std::vector<float> values = to_f32(r);
    copy_to_device(std::span<const float>(values), out.view());  // the io crossing onto the optimizer's backend
}

}  // namespace detail

template <class Config, class B>
void save_optimizer_state(const std::filesystem::path& file, optim::Optimizer<Config, B>& opt) {
    SafetensorsWriter w;
    w.metadata("format", "pt");
    w.metadata("step", std::to_string(opt.steps()));
    for (auto& s : opt.slots())  // the state lives on the optimizer's backend: to_host is the io crossing
        detail::for_each_state(s, [&](const std::string& name, const Tensor<float, 1, B>& state) {
            w.add_f32(name, s.param.shape, to_host(state));
        });
    w.write(file);
}

template <class Config, class B>
void load_optimizer_state(const std::filesystem::path& file, optim::Optimizer<Config, B>& opt) {
    SafetensorsFile f(file);
    const auto& meta = f.metadata();
    const auto step = meta.find("step");
    if (step == meta.end()) throw io_error(file.string() + ": no \"step\" in the metadata; not an optimizer state");
    std::set<std::string> expected;
    for (auto& s : opt.slots())
        detail::for_each_state(s, [&](const std::string& name, Tensor<float, 1, B>& state) {
            expected.insert(name);
            detail::read_state(f, name, s.param.shape, state);
        });
    for (const std::string& name : f.names())
        if (!expected.count(name))
            throw io_error(file.string() + ": state for an unknown parameter: " + detail::quoted(name));
    opt.set_steps(std::stoll(step->second));
    opt.round_masters();
}

}  // namespace moonmoe
