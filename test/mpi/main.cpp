// The MPI test binary's main: every rank runs the doctest cases (each case may use the world communicator, and
// every rank must run the same cases in the same order: the filters come from the same command line); the exit
// status is the worst over the ranks, so mpirun fails when any rank fails.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "mpi_support.hpp"

int main(int argc, char** argv) {
    moonmoe::parallel::MpiSession session(&argc, &argv);
    moonmoe::testing::world_communicator() = session.world();
    doctest::Context context(argc, argv);
    int status = context.run();
    moonmoe::index_t worst = status;
    moonmoe::testing::world().all_reduce(std::span<moonmoe::index_t>(&worst, 1), moonmoe::parallel::ReduceOp::max);
    moonmoe::testing::world_communicator().reset();
    return int(worst);
}
