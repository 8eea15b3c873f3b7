// The RL oracle (tools/make_rl_reference.py -> test/data/rl/tiny_k2.safetensors) read into the library's types: the
// prompt groups with their rewards, old log-probabilities and truncation flags, the PTX batch and the objective's
// settings. test/unit/rl.cpp and test/mpi/rl.cpp compare against it.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <moonmoe/rl/objective.hpp>

#include "reference.hpp"

namespace moonmoe::testing {

struct RlOracle {
    Reference ref{data_dir("rl") + "/tiny_k2.safetensors"};
    std::vector<rl::Group> groups;
    rl::PtxBatch ptx;
    rl::Objective objective;

    RlOracle() {
        const std::vector<index_t> prompt_ids = ref.i64("prompt_ids"), response_ids = ref.i64("response_ids"),
                                   prompt_lengths = ref.i64("prompt_lengths"),
                                   response_lengths = ref.i64("response_lengths"), group_sizes = ref.i64("group_sizes"),
                                   truncated = ref.i64("truncated");
        const std::vector<float> reward = ref.f32("reward");
        const std::vector<double> old_logp = f64("old_logp"), settings = f64("settings");
        std::size_t sample = 0, p0 = 0, r0 = 0;
        for (index_t k : group_sizes) {
            rl::Group g;
            for (index_t i = 0; i < k; ++i, ++sample) {
                const auto pn = std::size_t(prompt_lengths[sample]), rn = std::size_t(response_lengths[sample]);
                rl::Sample s;
                s.prompt.assign(prompt_ids.begin() + std::ptrdiff_t(p0), prompt_ids.begin() + std::ptrdiff_t(p0 + pn));
                s.response.assign(response_ids.begin() + std::ptrdiff_t(r0),
                                  response_ids.begin() + std::ptrdiff_t(r0 + rn));
                p0 += pn, r0 += rn;
                s.reward = reward[sample], s.old_logp = old_logp[sample], s.truncated = truncated[sample] != 0;
                g.samples.push_back(std::move(s));
            }
            groups.push_back(std::move(g));
        }
        ptx = {ref.i64("ptx_ids"), nn::TokenLayout::packed(ref.i64("ptx_lengths"))};
        objective = {.tau = settings[0], .budget_penalty = settings[1], .ptx_weight = settings[2]};
    }

    /// A float64 tensor of the file.
    std::vector<double> f64(const std::string& name) const {
        const TensorRecord& r = ref.file.at(name);
        std::vector<double> out(std::size_t(r.numel()));
        std::memcpy(out.data(), r.bytes.data(), out.size() * sizeof(double));
        return out;
    }
};

}  // namespace moonmoe::testing
