// The README's quick start, verbatim: it must keep compiling and its claims must keep holding.
#include <moonmoe/moonmoe.hpp>
namespace mm = moonmoe;

using MyK2 = mm::Model<  // arguments by name, in any order, K2 defaults
    mm::Dims<mm::Hidden<7168>, mm::Layers<61>, mm::DenseLayers<1>, mm::Vocab<163840>>,
    mm::Attention<mm::MLA<mm::Heads<64>, mm::QRank<1536>, mm::KVRank<512>>>,
    mm::MoE<mm::Experts<384>, mm::TopK<8>, mm::Shared<1>, mm::ExpertHidden<2048>>,
    mm::Optimizer<mm::Muon<>, mm::QKClip<100>>, mm::Parallel<16, 16, mm::Dynamic, mm::VirtualStages<2>>>;
static_assert(MyK2::parameter_count() == 1'026'408'232'448);
constexpr auto bytes = MyK2::memory_per_rank(/*DP=*/32).total_bytes();  // most loaded rank, about 30 GB

static_assert(bytes > 29'000'000'000 && bytes < 31'000'000'000);
