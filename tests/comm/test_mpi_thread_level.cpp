// A program that initialised MPI itself with a plain MPI_Init (MPI_THREAD_SINGLE) is refused by
// communicator::world(): the gradient collectives run on a collective_stream's thread, which
// needs MPI_THREAD_SERIALIZED. One process, no mpirun.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "comm/comm_error.hpp"
#include "comm/communicator.hpp"

using namespace spillway;

TEST(MpiThreadLevel, AProgramsOwnPlainMpiInitIsRefusedWithWhatToDoInstead) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ASSERT_EQ(initialized, 0);
  ASSERT_EQ(MPI_Init(nullptr, nullptr), MPI_SUCCESS);
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided >= MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    GTEST_SKIP() << "this MPI gives MPI_Init a level of " << provided << ", enough for Spillway";
  }
  try {
    (void)comm::communicator::world();
    ADD_FAILURE() << "world() took an MPI without the thread support its collectives need";
  } catch (const comm::comm_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MPI_THREAD_SERIALIZED"), std::string::npos) << m;
    EXPECT_NE(m.find("MPI_Init_thread"), std::string::npos) << "does not say what to do instead: " << m;
  }
  MPI_Finalize();
}
