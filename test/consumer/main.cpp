// A downstream project using the installed package with its CPU backend: a model type of its own, built,
// run forward and backward, its parameters counted at compile time and at run time.
#include <cstdio>

#include <moonmoe/moonmoe.hpp>

namespace mm = moonmoe;

using Small = mm::Model<mm::Dims<mm::Hidden<32>, mm::Layers<2>, mm::DenseLayers<1>, mm::Vocab<64>, mm::DenseHidden<48>>,
                        mm::Attention<mm::MLA<mm::Heads<2>, mm::QRank<16>, mm::KVRank<8>, mm::NopeDim<8>,
                                              mm::RopeDim<4>, mm::VDim<8>>>,
                        mm::MoE<mm::Experts<4>, mm::TopK<2>, mm::Shared<1>, mm::ExpertHidden<8>>,
                        mm::RoPE<mm::MaxPositions<256>, mm::YaRN<mm::OriginalMaxPositions<64>>>>;

int main() {
    mm::nn::Transformer<> model(Small::config);
    mm::index_t count = 0;
    std::uint64_t seed = 1;
    model.visit_params([&](const mm::ParamRef& p) {
        count += p.numel();
        if (p.kind != mm::ParamKind::vector)
            mm::backend::Ops<mm::cpu>::fill_normal(mm::View<float, 2>(p.value, {1, p.numel()}), 0.0f, 0.1f, seed++);
    });
    const mm::index_t ids[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float loss = model.train_step(ids, mm::nn::TokenLayout::sequences(2, 4));
    std::printf("consumer: %lld parameters, loss %.4f (ln 64 = 4.1589)\n", static_cast<long long>(count), loss);
    const bool ok = count == Small::parameter_count() && loss > 3.5f && loss < 5.0f;
    return ok ? 0 : 1;
}
