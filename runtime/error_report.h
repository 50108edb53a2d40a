// Internal to runtime/: how a worker tells the launcher why it failed, in the error file of the
// launch contract (base/launch_contract.h). run_main.cpp and context.cpp report through it.
//
// Thread-safety: error_report is pure; write_error_report replaces the file atomically. Errors:
// neither throws (write_error_report returns false when TORCHELASTIC_ERROR_FILE is unset or the
// file cannot be written).
#pragma once

#include <exception>
#include <string>

#include "base/launch_contract.h"

namespace tandem::detail {

// The report of `e`: message "<Type>: <what>", the kind from its type, restartable from
// tandem::Error::restartable() (true for any other exception), the time now, and a callstack of
// `note` (C++ records none) and the message.
launch::ErrorReport error_report(const std::exception& e, const std::string& note);

// Writes `report` to the file TORCHELASTIC_ERROR_FILE names.
bool write_error_report(const launch::ErrorReport& report);

}  // namespace tandem::detail
