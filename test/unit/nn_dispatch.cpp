// What the MoE tells its dispatcher about the rows it moves (nn/dispatch.hpp): under Precision<BF16> the experts'
// input rows, their outputs and the gradients of both hold bf16 values, and the MoE says so, so an expert-parallel
// dispatcher sends them as bf16 (half the bytes, exactly: test/mpi/expert_parallel.cpp); everything it says is bf16
// must be bf16, or the wire format would round it. A dispatcher that checks each claim stands in for the local one.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <memory>
#include <vector>

#include <moonmoe/moonmoe.hpp>

namespace unit_nn_dispatch {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

/// The local dispatcher, checking that rows said to hold bf16 values do.
template <class B>
class CheckingDispatcher final : public nn::Dispatcher<B> {
public:
    using Mat = Tensor<float, 2, B>;
    int claims = 0, broken = 0;  ///< calls with values == bf16, and values among them that were not bf16

    void check(index_t experts, index_t first, index_t count) const override { local_.check(experts, first, count); }
    nn::PlannedExperts planned(index_t e, index_t first, index_t count) const override {
        return local_.planned(e, first, count);
    }
    nn::ExpertExchange<B> exchange(std::span<const index_t> offsets) override { return local_.exchange(offsets); }
    Mat dispatch(const nn::ExpertExchange<B>& ex, Mat&& rows, NumberFormat values) override {
        inspect(rows, values);
        return local_.dispatch(ex, std::move(rows), values);
    }
    Mat combine(const nn::ExpertExchange<B>& ex, Mat&& rows, NumberFormat values) override {
        inspect(rows, values);
        return local_.combine(ex, std::move(rows), values);
    }
    bool exchanges() const override { return false; }
    std::string where(const std::string& what) const override { return what; }

private:
    void inspect(const Mat& rows, NumberFormat values) {
        if (values != NumberFormat::bf16) return;
        ++claims;
        for (float x : to_host(rows)) broken += bf16::from_float(x).to_float() != x;
    }
    nn::LocalDispatcher<B> local_;
};

}  // namespace

TEST_CASE_TEMPLATE("Under Precision<BF16> the rows the MoE says hold bf16 values do: inputs, outputs, input gradients",
                   B, MOONMOE_TEST_BACKENDS) {
    using Model = TinyK2::with<Precision<BF16>, Backend<B>>;
    nn::Transformer<B> model(Model::config);
    nn::init_weights(model, {.seed = 5});
    std::vector<std::shared_ptr<CheckingDispatcher<B>>> checkers;
    for (auto& layer : model.layers)
        if (!layer.dense) {
            checkers.push_back(std::make_shared<CheckingDispatcher<B>>());
            layer.moe.dispatcher = checkers.back();
        }
    REQUIRE(checkers.size() == 2);
    std::vector<index_t> ids(48);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = index_t((11 * i + 5) % 256);
    model.train_step(ids.data(), nn::TokenLayout::sequences(2, 24));
    for (const auto& c : checkers) {
        CHECK(c->claims == 4);  // forward: the inputs out, the outputs back; backward: their gradients both ways
        CHECK(c->broken == 0);
    }
    // under f32 nothing is said to be bf16
    nn::Transformer<B> f32(TinyK2::config);
    nn::init_weights(f32, {.seed = 5});
    auto checker = std::make_shared<CheckingDispatcher<B>>();
    for (auto& layer : f32.layers)
        if (!layer.dense) layer.moe.dispatcher = checker;
    f32.train_step(ids.data(), nn::TokenLayout::sequences(2, 24));
    CHECK(checker->claims == 0);
}

}  // namespace unit_nn_dispatch
