#include "tools/tandemrun/rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>

#include "tools/tandemrun/fd_io.h"
#include "tools/tandemrun/free_port.h"
#include "tools/tandemrun/job_token.h"

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
// How long a reader waits for the details of a failure whose counter it saw.
constexpr std::chrono::seconds kDetailsWait{5};
// Token proofs and the failure keys are global to the store; rounds are under the rdzv id.
constexpr const char* kAuthPrefix = "tandemrun/auth/";

std::string to_string(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> to_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// A word as the rendezvous exchanges them: [A-Za-z0-9._:-], 1..255 characters.
bool is_word(const std::string& s) {
  if (s.empty() || s.size() > 255) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '-';
  });
}

std::optional<long long> parse_number(const std::string& s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return std::nullopt;
  return v;
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  std::string w;
  while (in >> w) words.push_back(w);
  return words;
}

// Text from another agent, made safe to print: no control characters, bounded length.
std::string printable(std::string text) {
  if (text.size() > 2000) text = text.substr(0, 2000) + "...";
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n') c = '?';
    if (c == '\n') c = ' ';
  }
  return text;
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
// TCPStore tries to bind, which would log c10d warnings for an expected outcome.
bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // let TCPStore find out
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

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s << " s";
  return out.str();
}

}  // namespace

std::pair<std::string, int> parse_endpoint(const std::string& text, int default_port) {
  std::string host = text;
  int port = default_port;
  const auto colon = text.rfind(':');
  // "[v6]:port", "host:port"; a bare IPv6 address (several colons, no brackets) has no port.
  if (colon != std::string::npos && text.find(':') == colon) {
    host = text.substr(0, colon);
    const auto p = parse_number(text.substr(colon + 1));
    if (!p || *p < 1 || *p > 65535) {
      throw ConfigError("--rdzv-endpoint '" + text + "': the port must be in 1..65535");
    }
    port = static_cast<int>(*p);
  } else if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos) throw ConfigError("--rdzv-endpoint '" + text + "': no ']'");
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      const auto p = parse_number(text.substr(close + 2));
      if (text[close + 1] != ':' || !p || *p < 1 || *p > 65535)
        throw ConfigError("--rdzv-endpoint '" + text + "': write [ADDRESS]:PORT");
      port = static_cast<int>(*p);
    }
  }
  if (host.empty()) throw ConfigError("--rdzv-endpoint '" + text + "' has no host");
  return {host, port};
}

Rendezvous::Rendezvous(const LauncherOptions& options, std::string token)
    : options_(options), token_(std::move(token)) {
  prefix_ = "tandemrun/" + options_.rdzv_id + "/";
  agent_id_ = generate_nonce();
  bool must_host = false;
  bool may_host = false;
  if (!options_.rdzv_endpoint.empty()) {
    std::tie(store_host_, store_port_) = parse_endpoint(options_.rdzv_endpoint, kDefaultRdzvPort);
    // torchrun's c10d: whoever binds it hosts it.
    may_host = is_local_address(store_host_) && port_is_free(store_port_);
  } else {
    store_host_ = options_.master_addr;
    store_port_ = options_.master_port;
    must_host = options_.node_rank == 0;
  }
  endpoint_ = store_host_ + ":" + std::to_string(store_port_);
  local_addr_ = !options_.local_addr.empty() ? options_.local_addr
                : is_loopback(store_host_)   ? "127.0.0.1"
                                             : this_host_name();
  if (!is_word(local_addr_)) throw ConfigError("--local-addr '" + local_addr_ + "' is not valid");

  const auto timeout = std::chrono::milliseconds(
      static_cast<long long>(options_.rdzv_join_timeout_s * 1000.0));
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(store_port_);
  store_options.waitWorkers = false;
  store_options.timeout = timeout;
  if (must_host || may_host) {
    store_options.isServer = true;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(store_host_, store_options);
      host_ = true;
    } catch (const std::exception& e) {
      if (must_host) {
        throw RendezvousError("node rank 0 cannot host the rendezvous store at " + endpoint_ +
                              " (" + printable(e.what()) +
                              "); pick a free --master-port, or give the other nodes "
                              "--node-rank 1, 2, ... (or use --rdzv-endpoint)");
      }
      store_options.isServer = false;  // someone else bound it first: be a client
    }
  }
  if (!host_) {
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(store_host_, store_options);
    } catch (const std::exception& e) {
      throw RendezvousError("cannot reach the rendezvous at " + endpoint_ + " within " +
                            seconds_text(options_.rdzv_join_timeout_s) + " (" +
                            printable(e.what()) +
                            "); start the agent that hosts it (node rank 0), or check the "
                            "address, the port and the firewall");
    }
  }
  store_options.isServer = false;
  if (host_) {
    host_nonce_ = generate_nonce();
    put(std::string(kAuthPrefix) + "nonce", host_nonce_);
    put(std::string(kAuthPrefix) + "proof", token_digest(token_, "host", host_nonce_));
  } else {
    verify_host();
  }
  try {
    keep_alive_store_ = c10::make_intrusive<c10d::TCPStore>(store_host_, store_options);
  } catch (const std::exception& e) {
    throw RendezvousError("cannot open a second connection to the rendezvous at " + endpoint_ +
                          ": " + printable(e.what()));
  }
  const long long n = counter(key("agents"), 1);
  put(key("agent/" + std::to_string(n)), agent_id_);
  counter(key("alive/" + agent_id_), 1);
  keep_alive_ = std::thread([this] { keep_alive_loop(); });
}

Rendezvous::~Rendezvous() {
  stop_ = true;
  if (keep_alive_.joinable()) keep_alive_.join();
  try {
    if (!host_) put(key("left/" + agent_id_), "1");
  } catch (const std::exception&) {
    // The host is gone already: nothing to tell.
  }
}

void Rendezvous::verify_host() {
  const std::string proof_key = std::string(kAuthPrefix) + "proof";
  const auto give_up = Clock::now() + kHostProofWait;
  std::optional<std::string> proof;
  while (!(proof = try_get(proof_key)) && Clock::now() < give_up)
    std::this_thread::sleep_for(kPollInterval);
  const std::optional<std::string> nonce = try_get(std::string(kAuthPrefix) + "nonce");
  if (!proof || !nonce || !is_word(*nonce) || *proof != token_digest(token_, "host", *nonce)) {
    try {
      store_->add(std::string(kAuthPrefix) + "foreign", 1);  // so the host can log it
    } catch (const std::exception&) {
      // Not a tandemrun store at all: nobody to tell.
    }
    throw RendezvousError("the rendezvous at " + endpoint_ +
                          " belongs to another job (job token differs); set TANDEM_JOB_TOKEN "
                          "to this job's token or use another --rdzv-endpoint");
  }
  host_nonce_ = *nonce;
}

void Rendezvous::keep_alive_loop() {
  const auto interval = std::chrono::milliseconds(std::clamp<long long>(
      static_cast<long long>(options_.rdzv_node_timeout_s * 1000.0 / 5.0), 20, 1000));
  const std::string alive = key("alive/" + agent_id_);
  auto next = Clock::now();
  while (!stop_) {
    if (Clock::now() >= next) {
      try {
        keep_alive_store_->add(alive, 1);
      } catch (const std::exception& e) {
        keep_alive_error_ = printable(e.what());
        keep_alive_failed_ = true;
        return;
      }
      next = Clock::now() + interval;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Rendezvous::check_store() {
  if (host_) {
    const long long foreign = counter(std::string(kAuthPrefix) + "foreign", 0);
    if (foreign > foreign_seen_) {
      log_line("turned away " + std::to_string(foreign - foreign_seen_) +
               " agent(s) of another job at the rendezvous " + endpoint_ +
               " (their job token differs)");
      foreign_seen_ = foreign;
    }
  }
  if (keep_alive_failed_) {
    throw RendezvousError("lost the rendezvous store at " + endpoint_ + " (" +
                          keep_alive_error_ +
                          "); the agent hosting it has exited or its node is down");
  }
}

std::string Rendezvous::describe_store_error(const std::exception& e) const {
  return "the rendezvous store at " + endpoint_ + " stopped answering (" + printable(e.what()) +
         "); the agent hosting it has exited or its node is down";
}

void Rendezvous::put(const std::string& k, const std::string& value) {
  try {
    store_->set(k, to_bytes(value));
  } catch (const std::exception& e) {
    throw RendezvousError(describe_store_error(e));
  }
}

std::optional<std::string> Rendezvous::try_get(const std::string& k) {
  try {
    if (!store_->check({k})) return std::nullopt;
    return to_string(store_->get(k));
  } catch (const std::exception& e) {
    throw RendezvousError(describe_store_error(e));
  }
}

long long Rendezvous::counter(const std::string& k, long long delta) {
  try {
    return store_->add(k, delta);
  } catch (const std::exception& e) {
    throw RendezvousError(describe_store_error(e));
  }
}

std::string Rendezvous::record_digest(const std::string& fields) const {
  return token_digest(token_, "join " + fields, host_nonce_);
}

Rendezvous::JoinOutcome Rendezvous::join(int min_round, const std::function<bool()>& interrupted,
                                         Round* round, std::string* status) {
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(
                                     options_.rdzv_join_timeout_s * 1000.0));
  for (;;) {
    const auto open = try_get(key("open_round"));
    int r = std::max<int>(min_round, open ? static_cast<int>(parse_number(*open).value_or(0)) : 0);
    const std::string rk = key("r/" + std::to_string(r) + "/");
    const long long slot = counter(rk + "joined", 1);
    const int port = pick_free_port(local_addr_);
    const std::string fields = agent_id_ + " " + local_addr_ + " " + std::to_string(port) + " " +
                               std::to_string(options_.nproc_per_node) + " " +
                               std::to_string(options_.node_rank_given ? options_.node_rank
                                                                       : last_node_rank_);
    put(rk + "node/" + std::to_string(slot), fields + " " + record_digest(fields));
    std::optional<Clock::time_point> min_seen;
    for (;;) {
      check_store();
      if (interrupted()) return JoinOutcome::kInterrupted;
      if (const auto state = job_state())
        return *state ? JoinOutcome::kJobSucceeded : JoinOutcome::kJobFailed;
      if (const auto members = read_members(r)) {
        const auto self =
            std::find_if(members->begin(), members->end(),
                         [&](const RoundMember& m) { return m.agent_id == agent_id_; });
        if (self == members->end()) break;  // closed without us: wait for the next restart
        round->number = r;
        round->node_rank = self->node_rank;
        last_node_rank_ = self->node_rank;  // asked for again next round: ranks stay stable
        round->members = *members;
        round->master_addr = members->front().addr;
        round->master_port = members->front().free_port;
        return JoinOutcome::kJoined;
      }
      const long long joined = counter(rk + "joined", 0);
      if (joined >= options_.min_nodes && !min_seen) min_seen = Clock::now();
      const bool last_call_over =
          min_seen && Clock::now() - *min_seen >=
                          std::chrono::milliseconds(
                              static_cast<long long>(options_.rdzv_last_call_s * 1000.0));
      if (joined >= options_.max_nodes || last_call_over) {
        if (try_close(r)) continue;
      }
      if (Clock::now() >= deadline) {
        *status = "round " + std::to_string(r) + " has " + std::to_string(joined) +
                  " of at least " + std::to_string(options_.min_nodes) + " nodes after " +
                  seconds_text(options_.rdzv_join_timeout_s) + " (--rdzv-join-timeout-s)";
        return JoinOutcome::kTimedOut;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    log_line("round " + std::to_string(r) + " of the rendezvous at " + endpoint_ +
             " closed without this node (it runs already); waiting for the next restart to join");
    // Wait (without a deadline: the job may run for long) until a restart opens a later round.
    for (;;) {
      check_store();
      if (interrupted()) return JoinOutcome::kInterrupted;
      if (const auto state = job_state())
        return *state ? JoinOutcome::kJobSucceeded : JoinOutcome::kJobFailed;
      const auto now_open = try_get(key("open_round"));
      if (now_open && parse_number(*now_open).value_or(0) > r) break;
      std::this_thread::sleep_for(kPollInterval);
    }
    min_round = r + 1;
    deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(
                                  options_.rdzv_join_timeout_s * 1000.0));
  }
}

bool Rendezvous::try_close(int r) {
  const std::string rk = key("r/" + std::to_string(r) + "/");
  if (counter(rk + "closed", 1) != 1) return false;  // another agent closes it
  // Joins counted after this read wait for the next round (they see they are not members).
  const long long count = std::min<long long>(counter(rk + "joined", 0), options_.max_nodes);
  struct Candidate {
    long long slot;
    int requested;
  };
  std::vector<Candidate> valid;
  for (long long slot = 1; slot <= count; ++slot) {
    const std::string node_key = rk + "node/" + std::to_string(slot);
    const auto give_up = Clock::now() + kDetailsWait;
    std::optional<std::string> record;
    while (!(record = try_get(node_key)) && Clock::now() < give_up)
      std::this_thread::sleep_for(kPollInterval);
    const auto words = record ? split_words(*record) : std::vector<std::string>{};
    bool ok = words.size() == 6 && std::all_of(words.begin(), words.end(), is_word);
    if (ok) {
      const std::string fields =
          words[0] + " " + words[1] + " " + words[2] + " " + words[3] + " " + words[4];
      ok = words[5] == record_digest(fields) && parse_number(words[2]) && parse_number(words[3]) &&
           parse_number(words[4]);
    }
    if (!ok) {
      log_line("rendezvous round " + std::to_string(r) + ": ignoring joiner " +
               std::to_string(slot) + " (" + (record ? "its job token differs" : "no record") +
               ")");
      continue;
    }
    valid.push_back({slot, static_cast<int>(*parse_number(words[4]))});
  }
  // Nodes that asked for a rank (--node-rank, or their rank in the previous round) come first, in
  // that order; newcomers follow in join order.
  std::stable_sort(valid.begin(), valid.end(), [](const Candidate& a, const Candidate& b) {
    const int ra = a.requested >= 0 ? a.requested : INT_MAX;
    const int rb = b.requested >= 0 ? b.requested : INT_MAX;
    return ra != rb ? ra < rb : a.slot < b.slot;
  });
  std::string members;
  for (const auto& c : valid) members += (members.empty() ? "" : " ") + std::to_string(c.slot);
  put(rk + "members", members.empty() ? "none" : members);
  return true;
}

std::optional<std::vector<RoundMember>> Rendezvous::read_members(int r) {
  const std::string rk = key("r/" + std::to_string(r) + "/");
  const auto members = try_get(rk + "members");
  if (!members) return std::nullopt;
  std::vector<RoundMember> out;
  for (const auto& slot : split_words(*members)) {
    if (slot == "none") break;
    const auto record = try_get(rk + "node/" + slot);
    const auto words = record ? split_words(*record) : std::vector<std::string>{};
    if (words.size() != 6 || !parse_number(words[2]) || !parse_number(words[3])) {
      throw RendezvousError("the rendezvous at " + endpoint_ + " holds a malformed record for "
                            "round " + std::to_string(r) + " node " + printable(slot));
    }
    RoundMember m;
    m.node_rank = static_cast<int>(out.size());
    m.agent_id = words[0];
    m.addr = words[1];
    m.free_port = static_cast<int>(*parse_number(words[2]));
    m.nproc = static_cast<int>(*parse_number(words[3]));
    out.push_back(m);
  }
  return out;
}

std::optional<RoundFailure> Rendezvous::failure(int r) {
  const std::string fk = key("r/" + std::to_string(r) + "/failure");
  const auto head = try_get(fk);
  if (!head) return std::nullopt;
  const auto words = split_words(*head);
  RoundFailure f;
  f.round = r;
  if (words.size() == 4) {
    f.node_rank = static_cast<int>(parse_number(words[0]).value_or(-1));
    f.rank = static_cast<int>(parse_number(words[1]).value_or(-1));
    f.pid = static_cast<long>(parse_number(words[2]).value_or(-1));
    f.node_lost = words[3] == "1";
  }
  f.host = printable(try_get(fk + "_host").value_or("?"));
  f.what = printable(try_get(fk + "_what").value_or("failed"));
  f.error = printable(try_get(fk + "_error").value_or(""));
  return f;
}

RoundFailure Rendezvous::report_failure(const RoundFailure& f) {
  const std::string fk = key("r/" + std::to_string(f.round) + "/failure");
  if (counter(fk + "_count", 1) == 1) {
    put(fk + "_host", f.host);
    put(fk + "_what", f.what);
    put(fk + "_error", f.error);
    // Written last: a reader that sees it finds the details.
    put(fk, std::to_string(f.node_rank) + " " + std::to_string(f.rank) + " " +
                std::to_string(f.pid) + " " + (f.node_lost ? "1" : "0"));
    return f;
  }
  const auto give_up = Clock::now() + kDetailsWait;
  while (Clock::now() < give_up) {
    if (auto first = failure(f.round)) return *first;
    std::this_thread::sleep_for(kPollInterval);
  }
  return f;  // the first reporter died before writing its report
}

bool Rendezvous::stale(const std::string& agent_id) {
  const long long count = counter(key("alive/" + agent_id), 0);
  const auto now = Clock::now();
  auto it = seen_.find(agent_id);
  if (it == seen_.end() || it->second.first != count) {
    seen_[agent_id] = {count, now};
    return false;
  }
  return now - it->second.second >
         std::chrono::milliseconds(static_cast<long long>(options_.rdzv_node_timeout_s * 1000.0));
}

std::vector<RoundMember> Rendezvous::lost_members(const Round& round) {
  std::vector<RoundMember> lost;
  for (const auto& m : round.members) {
    if (m.agent_id != agent_id_ && stale(m.agent_id)) lost.push_back(m);
  }
  return lost;
}

void Rendezvous::open_round(int number) { put(key("open_round"), std::to_string(number)); }

int Rendezvous::report_success(int r) {
  return static_cast<int>(counter(key("r/" + std::to_string(r) + "/succeeded"), 1));
}

int Rendezvous::successes(int r) {
  return static_cast<int>(counter(key("r/" + std::to_string(r) + "/succeeded"), 0));
}

void Rendezvous::set_job_state(bool succeeded) {
  put(key("state"), succeeded ? "succeeded" : "failed");
}

std::optional<bool> Rendezvous::job_state() {
  const auto state = try_get(key("state"));
  if (!state) return std::nullopt;
  return *state == "succeeded";
}

void Rendezvous::linger() {
  const auto give_up =
      Clock::now() +
      std::chrono::milliseconds(static_cast<long long>(options_.rdzv_node_timeout_s * 1000.0)) +
      std::chrono::seconds(2);
  while (Clock::now() < give_up) {
    const long long agents = counter(key("agents"), 0);
    bool all_gone = true;
    for (long long n = 1; n <= agents && all_gone; ++n) {
      const auto id = try_get(key("agent/" + std::to_string(n)));
      if (!id || *id == agent_id_ || !is_word(*id)) continue;
      if (!try_get(key("left/" + *id)) && !stale(*id)) all_gone = false;
    }
    if (all_gone) return;
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace tandem::launcher
