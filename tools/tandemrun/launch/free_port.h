// Picking a free TCP port for --standalone runs.
#pragma once

#include <string>

namespace tandem::launcher {

// Binds a TCP socket to port 0 on `host` (a numeric address or a name that resolves to a local
// address), reads back the port the kernel chose and closes the socket. Another process could take
// the port before a worker binds it (torchrun has the same window); rank 0 binds it within
// moments. Throws tandem::ConfigError naming the host and the error when nothing can be bound.
int pick_free_port(const std::string& host);

}  // namespace tandem::launcher
