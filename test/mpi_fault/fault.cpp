// Failures that must end every rank with a clear error instead of a hang (ctest mpi.fault.*, cmake/MpiFault.cmake
// checks the exit status, the time and the message):
//   fault world_size   a world that is not PP x EP x DP processes: every rank refuses it at start-up, naming both
//   fault dead_rank    rank 1 dies (exits without a word) while the others wait in a collective: their bounded wait
//                      ends in a named error and every rank is taken down
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <moonmoe/parallel/layout.hpp>
#include <moonmoe/parallel/mpi.hpp>

using namespace moonmoe;
using namespace moonmoe::parallel;

int main(int argc, char** argv) {
    MpiSession mpi(&argc, &argv);
    const auto world = mpi.world();
    const std::string mode = argc > 1 ? argv[1] : "";
    try {
        if (mode == "world_size") {
            RankLayout(2, 2, 2).check_world(world->size(), "train_parallel");
        } else if (mode == "dead_rank") {
            world->set_timeout(std::chrono::seconds(5));
            if (world->rank() == 1) std::_Exit(3);
            std::vector<float> x(4, 1.0f);
            world->all_reduce(std::span<float>(x), ReduceOp::sum);
        } else {
            MpiSession::abort(2, "usage: fault world_size|dead_rank");
        }
    } catch (const std::exception& e) {
        MpiSession::abort(1, e.what());
    }
    return 0;
}
