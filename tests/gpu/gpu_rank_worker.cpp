// One rank of a gpu test's world of several processes (train() in tests/gpu/gpu_trainer.h).
#include "tests/gpu/gpu_trainer.h"

int main(int argc, char** argv) { return tandem::gpu_test::rank_worker_main(argc, argv); }
