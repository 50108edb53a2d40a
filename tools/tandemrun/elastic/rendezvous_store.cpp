#include "tools/tandemrun/elastic/rendezvous_store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/strings.h"
#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/launch/free_port.h"
#include "tools/tandemrun/elastic/job_token.h"
#include "tools/tandemrun/launch/worker_status.h"

namespace tandem::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// torchrun's default port of a c10d rendezvous endpoint.
constexpr int kDefaultRdzvPort = 29400;
// How often a waiting agent looks at the store.
constexpr std::chrono::milliseconds kPollInterval{50};
// How long a client waits for the host's token proof after connecting (the host writes it right
// after binding; a store without it belongs to some other program).
constexpr std::chrono::seconds kHostProofWait{5};
// Token proofs are global to the store; everything else is under the rdzv id.
constexpr const char* kAuthPrefix = "tandemrun/auth/";

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
}

std::optional<int> parse_port(const std::string& text) {
  const auto port = strings::parse_int(text);
  if (!port || *port < 1 || *port > 65535) return std::nullopt;
  return static_cast<int>(*port);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// True when `host` is an address of this machine (something can be bound on it).
bool is_local_address(const std::string& host) {
  try {
    pick_free_port(host);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

// False when something listens on `port` already (then this agent is a client). Checked before
// the store tries to bind, which would log c10d warnings for an expected outcome.
bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // let the store find out
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return free;
}

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  return name;
}

}  // namespace

bool is_word(const std::string& s) {
  if (s.empty() || s.size() > 255) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '-';
  });
}

std::string printable(std::string text) {
  if (text.size() > 2000) text = text.substr(0, 2000) + "...";
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n') c = '?';
    if (c == '\n') c = ' ';
  }
  return text;
}

std::pair<std::string, int> parse_endpoint(const std::string& text, int default_port) {
  std::string host = text;
  int port = default_port;
  const auto colon = text.rfind(':');
  // "[v6]:port", "host:port"; a bare IPv6 address (several colons, no brackets) has no port.
  if (colon != std::string::npos && text.find(':') == colon) {
    host = text.substr(0, colon);
    const auto p = parse_port(text.substr(colon + 1));
    if (!p) throw ConfigError("--rdzv-endpoint '" + text + "': the port must be in 1..65535");
    port = *p;
  } else if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos) throw ConfigError("--rdzv-endpoint '" + text + "': no ']'");
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      const auto p = parse_port(text.substr(close + 2));
      if (text[close + 1] != ':' || !p)
        throw ConfigError("--rdzv-endpoint '" + text + "': write [ADDRESS]:PORT");
      port = *p;
    }
  }
  if (host.empty()) throw ConfigError("--rdzv-endpoint '" + text + "' has no host");
  return {host, port};
}

RendezvousStore::RendezvousStore(const LauncherOptions& options, std::string token)
    : options_(options),
      token_(std::move(token)),
      prefix_("tandemrun/" + options.rdzv_id + "/"),
      agent_id_(generate_nonce()),
      peers_(millis(options.rdzv_node_timeout_s)) {
  StoreAddress address;
  bool must_host = false;
  bool may_host = false;
  if (!options_.rdzv_endpoint.empty()) {
    std::tie(address.host, address.port) =
        parse_endpoint(options_.rdzv_endpoint, kDefaultRdzvPort);
    // torchrun's c10d: whoever binds it hosts it.
    may_host = is_local_address(address.host) && port_is_free(address.port);
  } else {
    address.host = options_.master_addr;
    address.port = options_.master_port;
    must_host = options_.node_rank == 0;
  }
  endpoint_ = address.host + ":" + std::to_string(address.port);
  local_addr_ = !options_.local_addr.empty() ? options_.local_addr
                : is_loopback(address.host)  ? "127.0.0.1"
                                             : this_host_name();
  if (!is_word(local_addr_)) throw ConfigError("--local-addr '" + local_addr_ + "' is not valid");

  address.timeout = millis(options_.rdzv_join_timeout_s);
  if (must_host || may_host) {
    address.server = true;
    try {
      store_ = connect_store(address);
      host_ = true;
    } catch (const RendezvousError&) {
      throw;  // the store module is missing: nothing to host with
    } catch (const std::exception& e) {
      if (must_host) {
        throw RendezvousError("node rank 0 cannot host the rendezvous store at " + endpoint_ +
                              " (" + printable(e.what()) +
                              "); pick a free --master-port, or give the other nodes "
                              "--node-rank 1, 2, ... (or use --rdzv-endpoint)");
      }
      // Someone else bound it first: be a client.
    }
  }
  address.server = false;
  if (!host_) {
    try {
      store_ = connect_store(address);
    } catch (const RendezvousError&) {
      throw;
    } catch (const std::exception& e) {
      throw RendezvousError("cannot reach the rendezvous at " + endpoint_ + " within " +
                            seconds_text(options_.rdzv_join_timeout_s) + " (" +
                            printable(e.what()) +
                            "); start the agent that hosts it (node rank 0), or check the "
                            "address, the port and the firewall");
    }
  }
  if (host_) {
    host_nonce_ = generate_nonce();
    set_key(std::string(kAuthPrefix) + "nonce", host_nonce_);
    set_key(std::string(kAuthPrefix) + "proof", token_digest(token_, "host", host_nonce_));
    put("host", agent_id_);  // --ft: the agent that serves the workers' store (rendezvous.h)
  } else {
    verify_host();
  }
  // Connecting waits for a host that starts late; a request to a reachable host answers at once.
  // One that hangs (a partition) fails after the node timeout, as the others judge this node.
  const auto op_timeout =
      std::max(millis(options_.rdzv_node_timeout_s), std::chrono::milliseconds(1000));
  store_->set_timeout(op_timeout);
  std::unique_ptr<StoreConnection> second;
  try {
    second = connect_store(address);
  } catch (const std::exception& e) {
    throw RendezvousError("cannot open a second connection to the rendezvous at " + endpoint_ +
                          ": " + printable(e.what()));
  }
  const long long n = counter("agents", 1);
  put("agent/" + std::to_string(n), agent_id_);
  counter("alive/" + agent_id_, 1);
  second->set_timeout(op_timeout);
  keep_alive_ = std::make_unique<KeepAlive>(
      std::move(second), prefix_ + "alive/" + agent_id_,
      std::chrono::milliseconds(std::clamp<long long>(
          static_cast<long long>(options_.rdzv_node_timeout_s * 1000.0 / 5.0), 20, 1000)));
}

RendezvousStore::~RendezvousStore() {
  const bool reachable = keep_alive_ && !keep_alive_->lost();
  keep_alive_.reset();
  try {
    if (!host_ && store_ && reachable) put("left/" + agent_id_, "1");
  } catch (const std::exception&) {
    // The host is gone already: nothing to tell.
  }
}

void RendezvousStore::verify_host() {
  const std::string proof_key = std::string(kAuthPrefix) + "proof";
  const auto give_up = Clock::now() + kHostProofWait;
  std::optional<std::string> proof;
  while (!(proof = get_key(proof_key)) && Clock::now() < give_up)
    std::this_thread::sleep_for(kPollInterval);
  const std::optional<std::string> nonce = get_key(std::string(kAuthPrefix) + "nonce");
  if (proof && nonce && is_word(*nonce) && *proof == token_digest(token_, "host", *nonce)) {
    host_nonce_ = *nonce;
    return;
  }
  try {
    store_->add(std::string(kAuthPrefix) + "foreign", 1);  // so the host can log it
  } catch (const std::exception&) {
    // Not a tandemrun store at all: nobody to tell.
  }
  throw RendezvousError("the rendezvous at " + endpoint_ +
                        " belongs to another job (job token differs); set TANDEM_JOB_TOKEN "
                        "to this job's token or use another --rdzv-endpoint");
}

std::string RendezvousStore::describe_error(const std::exception& e) const {
  return "the rendezvous store at " + endpoint_ + " stopped answering (" + printable(e.what()) +
         "); the agent hosting it has exited or its node is down";
}

void RendezvousStore::set_key(const std::string& key, const std::string& value) {
  try {
    store_->set(key, value);
  } catch (const std::exception& e) {
    throw RendezvousError(describe_error(e));
  }
}

std::optional<std::string> RendezvousStore::get_key(const std::string& key) {
  try {
    return store_->get(key);
  } catch (const std::exception& e) {
    throw RendezvousError(describe_error(e));
  }
}

long long RendezvousStore::add_key(const std::string& key, long long delta) {
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    throw RendezvousError(describe_error(e));
  }
}

std::string RendezvousStore::record_digest(const std::string& fields) const {
  return token_digest(token_, "join " + fields, host_nonce_);
}

void RendezvousStore::check() {
  if (host_) {
    const long long foreign = add_key(std::string(kAuthPrefix) + "foreign", 0);
    if (foreign > foreign_seen_) {
      log_line("turned away " + std::to_string(foreign - foreign_seen_) +
               " agent(s) of another job at the rendezvous " + endpoint_ +
               " (their job token differs)");
      foreign_seen_ = foreign;
    }
  }
  if (const auto lost = keep_alive_->lost()) {
    throw RendezvousError("lost the rendezvous store at " + endpoint_ + " (" + *lost +
                          "); the agent hosting it has exited or its node is down");
  }
}

bool RendezvousStore::stale(const std::string& agent_id) {
  return peers_.stale(agent_id, counter("alive/" + agent_id, 0));
}

void RendezvousStore::linger() {
  const auto give_up =
      Clock::now() + millis(options_.rdzv_node_timeout_s) + std::chrono::seconds(2);
  while (Clock::now() < give_up) {
    const long long agents = counter("agents", 0);
    bool all_gone = true;
    for (long long n = 1; n <= agents && all_gone; ++n) {
      const auto id = try_get("agent/" + std::to_string(n));
      if (!id || *id == agent_id_ || !is_word(*id)) continue;
      if (!try_get("left/" + *id) && !stale(*id)) all_gone = false;
    }
    if (all_gone) return;
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace tandem::launcher
