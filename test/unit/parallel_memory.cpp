// The parallel runtime refuses a communicator that cannot move the backend's tensors (parallel::check_moves): the
// expert-parallel dispatcher, the pipeline and ZeRO-1 each name the communicator, where the tensors are and what to
// use instead, before anything is exchanged. On a GPU, host-memory collectives (MPI) handed device pointers would
// crash the process; this makes it an error at construction. Runs on every backend of the build (the emulated CUDA
// backend keeps its tensors in host memory, so there the wrong kind is the device-memory one).
#include "support/backends.hpp"
#include "support/io_testing.hpp"
#include "support/self_world.hpp"

#include <memory>

#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/parallel/groups.hpp>
#include <moonmoe/parallel/pipeline.hpp>
#include <moonmoe/parallel/zero.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_parallel_memory {

using namespace moonmoe;
using namespace moonmoe::testing;

TEST_CASE_TEMPLATE("A communicator that moves the other kind of memory is refused, naming both", B,
                   MOONMOE_TEST_BACKENDS) {
    const ModelConfig c = TinyK2::config;
    const char* tensors = backend::in_host_memory<B> ? "tensors are in host memory" : "tensors are in device memory";
    SelfWorld wrong("wrong world", backend::in_host_memory<B>);  // the other kind
    io_testing::check_error(
        [&] { parallel::ExpertParallelDispatcher<B> d(wrong); },
        {"ExpertParallelDispatcher on wrong world", tensors, "NcclCommunicator", "MpiCommunicator"});
    parallel::ProcessGroups g(wrong, c.parallel);
    nn::Transformer<B> part(c, parallel::model_part(c, g.at), parallel::expert_dispatcher<B>(g));
    io_testing::check_error([&] { parallel::Pipeline<B> p(part, g, 1); }, {"Pipeline on pipeline group", tensors});
    io_testing::check_error([&] { parallel::DistributedOptimizer<moonmoe::Optimizer<>, B> o(part, g); },
                            {"DistributedOptimizer on data-parallel group", tensors});

    SelfWorld right = self_world<B>();  // the same pieces over the right kind
    parallel::ProcessGroups h(right, c.parallel);
    CHECK_NOTHROW(parallel::ExpertParallelDispatcher<B>{right});
    CHECK_NOTHROW(parallel::Pipeline<B>(part, h, 1));
    CHECK_NOTHROW(parallel::DistributedOptimizer<moonmoe::Optimizer<>, B>(part, h));
}

}  // namespace unit_parallel_memory
