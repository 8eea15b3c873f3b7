// Activations<Offload<true>> (nn/offload.hpp): the layers' kept matrices wait in pinned host memory between their
// forward and their backward. On a backend that offloads (the CUDA backend; here its emulation, where the copies
// are synchronous) the training step gives the same bits as without offload, under K2's whole policy and under
// f32, and the device holds the offloaded bytes less between forward and backward. The CPU backend refuses it.
#include "support/backends.hpp"
#include "support/io_testing.hpp"
#include "support/reference.hpp"

#include <map>
#include <string>
#include <vector>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_nn_offload {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

const std::vector<index_t> ids = {3, 17, 42, 7, 99, 5, 61, 23, 88, 14, 2, 9, 77, 31, 50, 64};
const auto layout = nn::TokenLayout::sequences(2, 8);

}  // namespace

TEST_CASE_TEMPLATE(
    "Activations<Offload<true>>: refused on a backend with nothing to offload to (the CPU), naming "
    "where it runs",
    B, MOONMOE_TEST_BACKENDS) {
    ModelConfig c = TinyK2::config;
    c.activations.offload = true;
    static_assert(KimiK2ActivationsOffloaded::value.offload && !KimiK2Activations::value.offload);
    static_assert(activation_steps::offload.offload && activation_steps::offload == KimiK2ActivationsOffloaded::value);
    if constexpr (!backend::offloads<B>) {
        io_testing::check_error([&] { nn::Transformer<B> m(c); },
                                {"Offload<true>", "host memory already", "CUDA backend"});
        nn::Transformer<B> m(TinyK2::config);
        io_testing::check_error([&] { m.set_activations(c.activations); }, {"Offload<true>", "CUDA backend"});
        io_testing::check_error([&] { nn::DecoderLayer<B> l(c, 1); }, {"Offload<true>", "CUDA backend"});
    } else {
        nn::Transformer<B> m(c);
        CHECK(m.offload() != nullptr);
        m.set_activations(TinyK2::config.activations);
        CHECK(m.offload() == nullptr);
    }
}

#if defined(MOONMOE_TEST_CUDA)
TEST_CASE_TEMPLATE(
    "Activations<Offload<true>>: the same training step bit for bit, the kept matrices in host memory "
    "between forward and backward",
    B, moonmoe::cuda) {
    static_assert(backend::offloads<B>);
    using K2bf16 = TinyK2::with<Precision<BF16>>;
    for (const bool bf16 : {false, true}) {
        CAPTURE(bf16);
        ModelConfig kept_here = bf16 ? K2bf16::config : TinyK2::config;
        if (bf16) kept_here.activations = KimiK2Activations::value;
        ModelConfig offloaded = kept_here;
        offloaded.activations.offload = true;
        const auto load = [&] {
            return bf16 ? load_transformer<K2bf16, B>(data_dir("tiny_k2"))
                        : load_transformer<TinyK2, B>(data_dir("tiny_k2"));
        };
        nn::Transformer<B> a = load(), b = load();
        a.set_activations(kept_here.activations);
        b.set_activations(offloaded.activations);
        REQUIRE(b.offload() != nullptr);
        CHECK(a.offload() == nullptr);

        // forward: the offloaded cache holds the kept matrices' bytes less on the device
        typename nn::Transformer<B>::Cache ca, cb;
        auto& device = backend::Memory<B>::stats();
        const auto positions = layout.template device_positions<B>();  // the layout's: uploaded once for both
        const std::size_t before = device.current.load();
        const std::vector<float> la = to_host(a.forward(ids.data(), layout, ca, nn::Pass::training));
        const std::size_t with_kept = device.current.load() - before;
        const std::size_t before_b = device.current.load();
        const std::vector<float> lb = to_host(b.forward(ids.data(), layout, cb, nn::Pass::training));
        const std::size_t with_offload = device.current.load() - before_b;
        CHECK(la == lb);
        const std::size_t moved = b.offload()->host().offloaded_bytes();
        std::size_t kept_in_layers = 0;
        for (auto& l : ca.layers) l.for_each_kept([&](nn::KeptMatrix<B>& m) { kept_in_layers += m.bytes(); });
        CHECK(moved == kept_in_layers);
        CHECK(moved > 0);
        CHECK(with_kept - with_offload == moved);
        CHECK(ca.bytes() - cb.bytes() == moved);
        MESSAGE(std::string(bf16 ? "K2's policy (bf16): " : "f32: ")
                << moved << " of " << ca.bytes() << " cache bytes offloaded between forward and backward");

        // backward: every gradient the same, and a second step reuses the pinned buffers
        Tensor<float, 2, B> dl({layout.tokens(), TinyK2::config.dims.vocab});
        backend::Ops<B>::fill_normal(dl.view(), 0.0f, 1.0f, 11);
        a.backward(dl.view(), ca);
        b.backward(dl.view(), cb);
        CHECK(gradients_of<B>(a) == gradients_of<B>(b));
        const std::size_t pinned = b.offload()->host().pinned_bytes();
        CHECK(pinned == moved);
        CHECK(a.train_step(ids.data(), layout) == b.train_step(ids.data(), layout));
        CHECK(gradients_of<B>(a) == gradients_of<B>(b));
        CHECK(b.offload()->host().pinned_bytes() == pinned);
    }
}
#endif

}  // namespace unit_nn_offload
