// A downstream project: finds the *installed* moonmoe package, declares its own model type and checks its
// parameter count, at compile time and at run time.
#include <cstdio>

#include <moonmoe/config.hpp>

namespace mm = moonmoe;

// A Moonlight-sized MoE: no query compression, 64 experts of which 6 plus 2 shared are active, 27 layers.
using MyModel =
    mm::Model<mm::Dims<mm::Hidden<2048>, mm::Layers<27>, mm::DenseLayers<1>, mm::Vocab<163840>, mm::DenseHidden<11264>>,
              mm::Attention<mm::MLA<mm::Heads<16>, mm::QRank<mm::NoQCompression>, mm::KVRank<512>>>,
              mm::MoE<mm::Experts<64>, mm::TopK<6>, mm::Shared<2>, mm::ExpertHidden<1408>, mm::RoutedScale<2.446>>,
              mm::Parallel<1, 8, 1>>;

// embed + head, 27 x (attention + 2 norms), 1 dense MLP, 26 x (64 + 2 experts, router, bias), final norm
constexpr long long expected =
    2LL * 163840 * 2048 + 27LL * (16 * 192 * 2048 + 576 * 2048 + 512 + 16 * 256 * 512 + 2048 * 16 * 128 + 2 * 2048) +
    3LL * 2048 * 11264 + 26LL * (66 * 3LL * 2048 * 1408 + 64 * 2048 + 64) + 2048;
static_assert(MyModel::parameter_count() == expected);

int main() {
    const mm::ParameterCounts p = mm::count_parameters(MyModel::config);  // the same count, at run time
    std::printf("consumer model: %lld parameters (%lld activated)\n", static_cast<long long>(p.total),
                static_cast<long long>(p.active));
    return p.total == expected && p.total == 15'960'110'208LL ? 0 : 1;
}
