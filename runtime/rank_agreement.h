// Internal: checks that every rank holds the same description of something (a model's
// parameters, sharding units) and, if not, raises the same ConfigError on every rank naming the
// first rank and line that differ.
#pragma once

#include <tandem/collectives/communicator.h>

#include <string>
#include <vector>

namespace tandem::detail {

// Every rank's `text` (collective: two all-gathers).
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& text);

// Collective. Compares `description` (one item per line) across ranks; on a difference throws
// ConfigError: "<what>: first difference at line #i: rank 0 '<a>' vs rank r '<b>'. <fix>".
void check_same_on_every_rank(Communicator& comm, const std::string& description,
                              const std::string& what, const std::string& fix);

}  // namespace tandem::detail
