// The CUDA backend's host waits (backend/cuda/host_waits.hpp), counted the same way in the emulated build as on a
// GPU, so this file holds the line in CI: a training forward waits once per MoE layer (the experts' segment sizes,
// which size the grouped GEMMs and the exchange) and nowhere else, the loss is read once, and the backward never
// waits. Uploads up to the staging ring's largest size go without a wait; a copy to the host is always one.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <cstdint>
#include <vector>

#include <moonmoe/moonmoe.hpp>

namespace unit_host_waits {

using namespace moonmoe;
using namespace moonmoe::testing;

#if defined(MOONMOE_TEST_CUDA)

namespace {

/// The host waits `f` made.
template <class F>
std::uint64_t waits_of(F&& f) {
    const std::uint64_t before = backend::cuda_host_waits();
    f();
    return backend::cuda_host_waits() - before;
}

}  // namespace

TEST_CASE_TEMPLATE("Memory<cuda> waits for every copy to the host, and for an upload only past the staging ring", B,
                   moonmoe::cuda) {
    using Memory = backend::Memory<B>;
    const std::size_t largest = backend::cuda_detail::staging_largest;
    std::vector<std::byte> host(largest + 1, std::byte{7});
    Tensor<std::byte, 1, B> device({index_t(largest + 1)});
    CHECK(waits_of([&] { Memory::to_device(device.data(), host.data(), 1); }) == 0);
    CHECK(waits_of([&] { Memory::to_device(device.data(), host.data(), largest); }) == 0);
    CHECK(waits_of([&] { Memory::to_device(device.data(), host.data(), largest + 1); }) == 1);
    CHECK(waits_of([&] { Memory::to_host(host.data(), device.data(), 1); }) == 1);
    CHECK(waits_of([&] { Memory::to_host(host.data(), device.data(), 0); }) == 0);
    CHECK(waits_of([&] { Memory::trim(); }) == 1);
    // many small uploads in a row (several laps of the ring's worth on a GPU) stay without a wait here, where
    // nothing is ever still in flight, and their values arrive in order
    const std::uint64_t many = waits_of([&] {
        for (int i = 0; i < 64; ++i) {
            std::vector<index_t> v(4096, index_t(i));
            const Tensor<index_t, 1, B> t = to_device<B>(v);
            if (i == 63) CHECK(to_host(t) == v);
        }
    });
    CHECK(many == 1);  // the one read back
}

TEST_CASE_TEMPLATE("A training forward waits on the host once per MoE layer, the loss once, the backward never", B,
                   moonmoe::cuda) {
    nn::Transformer<B> model(TinyK2::config);
    nn::init_weights(model, {.seed = 3});
    const index_t moe_layers = TinyK2::config.dims.layers - TinyK2::config.dims.dense_layers;
    REQUIRE(moe_layers == 2);
    for (const auto& [batch, length] : {std::pair<index_t, index_t>{2, 32}, {3, 300}}) {
        CAPTURE(batch);
        CAPTURE(length);
        const auto layout = nn::TokenLayout::sequences(batch, length);
        std::vector<index_t> ids(std::size_t(batch * length));
        for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = index_t((7 * i + 3) % 256);
        typename nn::Transformer<B>::Cache cache;
        Tensor<float, 2, B> logits;
        CHECK(waits_of([&] { logits = model.forward(ids.data(), layout, cache, nn::Pass::training); }) == moe_layers);
        Tensor<float, 2, B> dlogits(logits.shape());
        CHECK(waits_of([&] { nn::causal_lm_loss<B>(logits.view(), ids.data(), layout, dlogits.view(), 1.0f); }) == 1);
        CHECK(waits_of([&] { model.backward(dlogits.view(), cache); }) == 0);
        // an inference forward with the same layout reuses its uploaded positions, and waits as often
        CHECK(waits_of([&] { logits = model.forward(ids.data(), layout, cache); }) == moe_layers);
    }
}

#endif

TEST_CASE_TEMPLATE("A layout uploads its positions once for every layer, and again when they change", B,
                   MOONMOE_TEST_BACKENDS) {
    auto layout = nn::TokenLayout::packed({3, 2});
    const auto first = layout.device_positions<B>();
    CHECK(layout.device_positions<B>() == first);  // the same tensor: one upload
    CHECK(to_host(*first) == std::vector<index_t>{0, 1, 2, 0, 1});
    layout.positions = {5, 6, 7, 9, 10};  // decoding moves them
    const auto moved = layout.device_positions<B>();
    CHECK(moved != first);
    CHECK(to_host(*moved) == std::vector<index_t>{5, 6, 7, 9, 10});
    CHECK(to_host(*first) == std::vector<index_t>{0, 1, 2, 0, 1});  // a holder of the old upload keeps it
    const nn::TokenLayout copy = layout;
    CHECK(copy.device_positions<B>() != moved);  // a copy uploads its own
    CHECK(to_host(*copy.device_positions<B>()) == layout.positions);
}

}  // namespace unit_host_waits
