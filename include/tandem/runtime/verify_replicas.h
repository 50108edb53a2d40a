// verify_replicas: checks that every rank holds the same parameters and buffers - what every
// data-parallel program should assert after a resume, a manual load or a custom update, and what
// users otherwise write by hand.
//
//   tandem::verify_replicas(*model, *ctx.world());   // throws naming the first difference
//
// Each rank hashes every parameter and buffer (XXH3-64 of its bytes, with its name, dtype and
// shape); the descriptions are all-gathered and compared with rank 0's. Collective: every rank of
// `comm` calls it with a module of the same structure. Cost: one pass over the model's bytes and
// two small all-gathers.
// Ownership: borrows both. Thread-safety: call from the training thread, between steps.
// Errors: tandem::Error naming the first tensor (in the module's order) that differs, how
// (values, dtype, shape, missing), and on which ranks; CommError/TimeoutError from the all-gathers.
#pragma once

#include <tandem/collectives/communicator.h>

namespace torch::nn {
class Module;
}

namespace tandem {

void verify_replicas(const torch::nn::Module& module, Communicator& comm);

}  // namespace tandem
