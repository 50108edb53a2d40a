// Training-state checkpoint save/load vs raw sequential write+fsync and torch::save/torch::load
// (scripts/bench-checkpoint runs it and writes bench/results/checkpoint.json).
//
// State: a stack of Linear(2048, 2048) layers trained one AdamW step, so model + optimizer state
// (parameters, exp_avg, exp_avg_sq) is about --bytes. Every figure is the median over --repeats
// rounds; the modes run interleaved within a round:
//   raw_write      the same tensor bytes written sequentially (write(2) from the tensors) + fsync
//   sync_save      CheckpointManager, async = false: hash, write, fsync, manifest, rename, fsync dir
//   async_save     CheckpointManager, async = true: save() returns after copying what may change
//                  before the next optimizer step (blocked time); the writer copies parameters and
//                  optimizer state (staged: until wait_for_checkpoint_staging() returns, what the
//                  end of the next backward waits for at most); then wait() for the commit (total).
//                  Steady state: rounds after the first reuse the staging buffers (the first is
//                  reported separately). copy_one_pass_s: one memcpy of the state into warm buffers.
//   load_verify    a fresh model + optimizer restored by resume(): read, verify every XXH3, agree,
//                  copy into parameters and optimizer state
//   torch_save     torch::save(model) + torch::save(optimizer) (no fsync; +fsync reported apart)
//   torch_load     torch::load into a fresh model + optimizer
//   dcp_*          PyTorch's torch.distributed.checkpoint (with --python and --dcp-script): the
//                  same layers and AdamW step in bench/checkpoint/pytorch_dcp.py, a coprocess
//                  started once ("serve"), told over a pipe when to save; dcp.save (fsyncs its
//                  files), dcp.async_save as documented (blocking staging copy) and with a staging
//                  thread (DefaultStager use_async_staging), dcp.load in a fresh Python process and
//                  in the coprocess. Same torch intra-op thread count as this process.
// Writers run in an order rotated every round, each after a sync(2). Loads read files just written
// (warm page cache) and run in a fresh process (as a restarted job resumes; the primary figures)
// and in this process (allocator warm: *_in_process_s).
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/checkpoint/format.h>

#include "checkpoint/step_directory.h"

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

struct Stack : torch::nn::Module {
  explicit Stack(int layers) {
    for (int i = 0; i < layers; ++i) {
      fcs.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(2048, 2048)));
    }
  }
  std::vector<torch::nn::Linear> fcs;
};

// One AdamW step with synthetic gradients, so exp_avg and exp_avg_sq exist.
void step_once(Stack& model, torch::optim::AdamW& opt) {
  for (auto& p : model.parameters()) p.mutable_grad() = torch::randn_like(p);
  opt.step();
}

std::vector<at::Tensor> state_tensors(Stack& model, torch::optim::AdamW& opt) {
  std::vector<at::Tensor> out;
  for (auto& p : model.parameters()) {
    out.push_back(p.detach());
    auto& s = static_cast<torch::optim::AdamWParamState&>(
        *opt.state().at(p.unsafeGetTensorImpl()));
    out.push_back(s.exp_avg());
    out.push_back(s.exp_avg_sq());
  }
  return out;
}

void raw_write(const std::string& path, const std::vector<at::Tensor>& tensors) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("open " + path);
  for (const auto& t : tensors) {
    const char* p = static_cast<const char*>(t.data_ptr());
    size_t n = t.numel() * t.element_size();
    while (n > 0) {
      const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
      if (w <= 0) throw std::runtime_error("write " + path);
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  if (::fsync(fd) != 0) throw std::runtime_error("fsync " + path);
  ::close(fd);
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) throw std::runtime_error("fsync " + path);
  ::close(fd);
}

// bench/checkpoint/pytorch_dcp.py serve: the PyTorch DCP peer, a coprocess holding the same state.
// One command line in, one reply line out ("ok V..." or "error MESSAGE").
class DcpPeer {
 public:
  DcpPeer(const std::string& python, const std::string& script, int layers, int threads) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    std::vector<std::string> args = {python, script, "serve", "--layers", std::to_string(layers),
                                     "--threads", std::to_string(threads)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);  // dup2 clears O_CLOEXEC on 0 and 1
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    const int rc = ::posix_spawn(&pid_, python.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) {
      ::close(in[1]);
      ::close(out[0]);
      throw std::runtime_error("cannot start " + python + ": " + std::strerror(rc));
    }
    to_ = ::fdopen(in[1], "w");
    from_ = ::fdopen(out[0], "r");
  }
  // Waits for "ready CHECKSUM INFO_JSON": the peer has built its state.
  void wait_ready() {
    const std::string line = read_line();
    std::istringstream ready(line);
    std::string word;
    ready >> word >> checksum_;
    std::getline(ready >> std::ws, info_json_);
    if (word != "ready" || checksum_.empty() || info_json_.empty() || info_json_[0] != '{') {
      throw std::runtime_error("pytorch_dcp.py serve: unexpected first line: " + line);
    }
  }
  DcpPeer(const DcpPeer&) = delete;
  DcpPeer& operator=(const DcpPeer&) = delete;
  ~DcpPeer() {
    std::fputs("quit\n", to_);
    std::fclose(to_);
    std::fclose(from_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  // Sends "cmd arg" and returns the reply's words after "ok".
  std::vector<std::string> call(const std::string& cmd, const std::string& arg) {
    if (std::fprintf(to_, "%s %s\n", cmd.c_str(), arg.c_str()) < 0 || std::fflush(to_) != 0) {
      throw std::runtime_error("pytorch_dcp.py serve: cannot send '" + cmd + "' (exited?)");
    }
    const std::string line = read_line();
    std::istringstream reply(line);
    std::vector<std::string> words;
    for (std::string w; reply >> w;) words.push_back(w);
    if (words.empty() || words[0] != "ok") {
      throw std::runtime_error("pytorch_dcp.py serve, " + cmd + " " + arg + ": " + line);
    }
    words.erase(words.begin());
    return words;
  }
  const std::string& checksum() const { return checksum_; }
  const std::string& info_json() const { return info_json_; }

 private:
  std::string read_line() {
    std::string line;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, from_) != nullptr) {
      line += buf;
      if (!line.empty() && line.back() == '\n') {
        line.pop_back();
        return line;
      }
    }
    throw std::runtime_error("pytorch_dcp.py serve exited (its error is above)");
  }
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string checksum_;
  std::string info_json_;
};

tandem::CheckpointManagerOptions manager_options(const std::string& dir, bool async) {
  tandem::CheckpointManagerOptions o;
  o.directory = dir;
  o.async = async;
  o.keep_last = 1;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"training-state checkpoint benchmark"};
  double gib = 1.0;
  int repeats = 3;
  std::string dir;
  std::string out;
  app.add_option("--gib", gib, "model + optimizer state in GiB");
  app.add_option("--repeats", repeats, "rounds (median reported)");
  app.add_option("--dir", dir, "scratch directory (removed afterwards)")->required();
  app.add_option("--out", out, "JSON result file")->required();  // ignored with --load-only
  bool keep = false;
  app.add_flag("--keep", keep, "keep the scratch directory (debugging)");
  std::string python;
  std::string dcp_script;
  app.add_option("--python", python, "python with the torch wheel: runs the PyTorch DCP peer");
  app.add_option("--dcp-script", dcp_script, "bench/checkpoint/pytorch_dcp.py (with --python)");
  std::string load_only;
  int load_layers = 0;
  int64_t load_step = 0;
  app.add_option("--load-only", load_only, "internal: time one load (tandem|torch) in this process");
  app.add_option("--layers", load_layers, "internal: layers of the state to load");
  app.add_option("--step", load_step, "internal: step to load");
  CLI11_PARSE(app, argc, argv);

  if (!load_only.empty()) {
    auto m = std::make_shared<Stack>(load_layers);
    torch::optim::AdamW o(m->parameters(), 1e-3);
    double s = 0;
    if (load_only == "torch") {
      s = seconds([&] {
        torch::load(m, dir + "/torch_model.pt");
        torch::load(o, dir + "/torch_optim.pt");
      });
    } else {
      tandem::CheckpointManager loader(manager_options(dir + "/sync", false));
      loader.add_module("model", m);
      loader.add_optimizer("optim", o);
      int64_t got = -1;
      s = seconds([&] { got = loader.resume(); });
      if (got != load_step) return 1;
    }
    std::printf("%.6f\n", s);
    return 0;
  }

  const double layer_bytes = 3.0 * (2048.0 * 2048 + 2048) * 4;  // params + 2 Adam moments
  const int layers = std::max(1, static_cast<int>(gib * (1u << 30) / layer_bytes + 0.5));
  auto fs = tandem::posix_file_system();
  fs->remove_all(dir);
  fs->create_dirs(dir);

  // The DCP peer builds its state while this process builds its own; nothing is timed until it is
  // ready. Same intra-op thread count as here.
  const int threads = at::get_num_threads();
  std::unique_ptr<DcpPeer> dcp;
  if (!python.empty() || !dcp_script.empty()) {
    if (python.empty() || dcp_script.empty()) throw std::runtime_error("--python needs --dcp-script and back");
    ::signal(SIGPIPE, SIG_IGN);  // a peer that died is reported by call(), not by a signal
    fs->create_dirs(dir + "/dcp");
    dcp = std::make_unique<DcpPeer>(python, dcp_script, layers, threads);
  }

  torch::manual_seed(0);
  auto model = std::make_shared<Stack>(layers);
  torch::optim::AdamW opt(model->parameters(), 1e-3);
  step_once(*model, opt);
  const auto tensors = state_tensors(*model, opt);
  uint64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * t.element_size();
  std::printf("state: %d x Linear(2048,2048) + AdamW = %.3f GiB in %zu tensors; %d rounds; %d torch threads\n",
              layers, bytes / double(1u << 30), tensors.size(), repeats, threads);
  if (dcp) {
    dcp->wait_ready();
    std::printf("PyTorch DCP peer ready: %s\n", dcp->info_json().c_str());
  }
  std::fflush(stdout);

  // Fresh objects to load into.
  auto model2 = std::make_shared<Stack>(layers);
  torch::optim::AdamW opt2(model2->parameters(), 1e-3);

  std::map<std::string, std::vector<double>> r;
  double async_first_blocked = 0, async_first_total = 0;
  double hash_s = 0;
  {
    std::vector<double> h;
    for (int i = 0; i < 2; ++i) {
      h.push_back(seconds([&] {
        uint64_t x = 0;
        for (const auto& t : tensors) x ^= tandem::xxh3_64(t.data_ptr(), t.numel() * t.element_size());
        if (x == 42) std::printf(" ");
      }));
    }
    hash_s = median(h);
  }
  // One copy of the state into warm buffers: what a save that stages in the caller costs at least.
  double copy_s = 0;
  {
    std::vector<at::Tensor> buffers;
    for (const auto& t : tensors) buffers.push_back(torch::empty_like(t));
    std::vector<double> c;
    for (int i = 0; i < 3; ++i) {
      c.push_back(seconds([&] {
        for (size_t k = 0; k < tensors.size(); ++k) {
          std::memcpy(buffers[k].data_ptr(), tensors[k].data_ptr(), tensors[k].numel() * tensors[k].element_size());
        }
      }));
    }
    copy_s = median(c);
  }
  tandem::CheckpointManager sync_mgr(manager_options(dir + "/sync", false));
  sync_mgr.add_module("model", model);
  sync_mgr.add_optimizer("optim", opt);
  // As in a training loop under tandem's wrappers, which wait for the staging copy at the end of
  // each backward: the async save may copy parameters and optimizer state after save() returns.
  tandem::CheckpointStagingFence fence;
  tandem::CheckpointManager async_mgr(manager_options(dir + "/async", true));
  async_mgr.add_module("model", model);
  async_mgr.add_optimizer("optim", opt);

  const std::string tm = dir + "/torch_model.pt", to = dir + "/torch_optim.pt";
  const std::string self = argv[0];
  // A load in a fresh process, as a restarted job resumes: returns its seconds.
  auto load_in_fresh_process = [&](const std::string& what, int64_t step) {
    const std::string cmd = "'" + self + "' --load-only " + what + " --layers " + std::to_string(layers) +
                            " --dir '" + dir + "' --step " + std::to_string(step) + " --out x";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) throw std::runtime_error("popen " + cmd);
    double v = -1;
    if (std::fscanf(p, "%lf", &v) != 1) v = -1;
    if (::pclose(p) != 0 || v < 0) throw std::runtime_error("fresh-process load failed: " + cmd);
    return v;
  };
  // DCP: one directory per checkpoint; dcp.load in a fresh Python process.
  auto dcp_dir = [&](const char* kind, int64_t step) { return dir + "/dcp/" + kind + "_" + std::to_string(step); };
  auto check_dcp = [&](const std::string& got, const std::string& what) {
    if (got != dcp->checksum()) {
      throw std::runtime_error("DCP " + what + ": loaded state differs from the saved state (checksum " + got +
                               " != " + dcp->checksum() + ")");
    }
  };
  auto dcp_load_in_fresh_process = [&](int64_t step) {
    const std::string cmd = "'" + python + "' '" + dcp_script + "' load --dir '" + dcp_dir("sync", step) +
                            "' --layers " + std::to_string(layers) + " --threads " + std::to_string(threads);
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) throw std::runtime_error("popen " + cmd);
    double v = -1, sd = -1;
    char sum[64] = {0};
    if (std::fscanf(p, "%lf %63s %lf", &v, sum, &sd) != 3) v = -1;
    if (::pclose(p) != 0 || v < 0) throw std::runtime_error("fresh-process DCP load failed: " + cmd);
    check_dcp(sum, "load in a fresh process");
    r["dcp_load_state_dict_s"].push_back(sd);
    return v;
  };
  double dcp_async_first_blocked = 0, dcp_async_first_total = 0;
  double dcp_async_thread_first_blocked = 0, dcp_async_thread_first_total = 0;
  uint64_t dcp_bytes = 0;
  struct {
    double blocked = 0, total = 0, thread_blocked = 0, thread_staged = 0, thread_total = 0;
  } dcp_round;  // this round's async figures, for the progress line

  for (int round = 0; round < repeats; ++round) {
    const int64_t step = round + 1;
    double blocked = 0, total = 0;
    // The writers, in an order rotated every round so drift in the disk's speed favours none.
    std::vector<std::function<void()>> writers = {
        [&] {
          ::sync();  // no dirty data of an earlier mode is written back during this one
          r["raw_write_s"].push_back(seconds([&] { raw_write(dir + "/raw.bin", tensors); }));
          fs->remove_file(dir + "/raw.bin");
        },
        [&] {
          ::sync();
          r["sync_save_s"].push_back(seconds([&] { sync_mgr.save(step); }));
        },
        [&] {
          ::sync();
          double staged = 0;
          total = seconds([&] {
            staged = seconds([&] {
              blocked = seconds([&] { async_mgr.save(step); });
              // What the end of the next backward waits for at most (the copy overlaps the
              // forward and backward in a training loop; here nothing runs in between).
              tandem::wait_for_checkpoint_staging();
            });
            async_mgr.wait();
          });
          if (round > 0 || repeats == 1) r["async_staged_s"].push_back(staged);
          if (round == 0) {
            async_first_blocked = blocked;
            async_first_total = total;
          }
          // Steady state (staging buffers reused) from the second round on.
          if (round > 0 || repeats == 1) {
            r["async_blocked_s"].push_back(blocked);
            r["async_total_s"].push_back(total);
          }
        },
        [&] {
          ::sync();
          r["torch_save_s"].push_back(seconds([&] {
            torch::save(model, tm);
            torch::save(opt, to);
          }));
          r["torch_save_fsync_s"].push_back(r["torch_save_s"].back() + seconds([&] {
            fsync_file(tm);
            fsync_file(to);
          }));
        },
    };
    if (dcp) {
      const bool steady = round > 0 || repeats == 1;  // as tandem's async: rounds 2+
      writers.push_back([&] {
        ::sync();
        const auto v = dcp->call("save", dcp_dir("sync", step));
        r["dcp_save_s"].push_back(std::stod(v.at(0)));
        r["dcp_save_state_dict_s"].push_back(std::stod(v.at(1)));
        dcp_bytes = std::stoull(v.at(2));
      });
      writers.push_back([&, steady] {
        ::sync();
        const auto v = dcp->call("async", dcp_dir("async", step));
        dcp_round.blocked = std::stod(v.at(0));
        dcp_round.total = std::stod(v.at(1));
        if (round == 0) {
          dcp_async_first_blocked = dcp_round.blocked;
          dcp_async_first_total = dcp_round.total;
        }
        if (steady) {
          r["dcp_async_blocked_s"].push_back(dcp_round.blocked);
          r["dcp_async_total_s"].push_back(dcp_round.total);
        }
        fs->remove_all(dcp_dir("async", step));
      });
      writers.push_back([&, steady] {
        ::sync();
        const auto v = dcp->call("async_thread", dcp_dir("async_thread", step));
        dcp_round.thread_blocked = std::stod(v.at(0));
        dcp_round.thread_staged = std::stod(v.at(1));
        dcp_round.thread_total = std::stod(v.at(2));
        if (round == 0) {
          dcp_async_thread_first_blocked = dcp_round.thread_blocked;
          dcp_async_thread_first_total = dcp_round.thread_total;
        }
        if (steady) {
          r["dcp_async_thread_blocked_s"].push_back(dcp_round.thread_blocked);
          r["dcp_async_thread_staged_s"].push_back(dcp_round.thread_staged);
          r["dcp_async_thread_total_s"].push_back(dcp_round.thread_total);
        }
        fs->remove_all(dcp_dir("async_thread", step));
      });
    }
    for (size_t i = 0; i < writers.size(); ++i) writers[(i + static_cast<size_t>(round)) % writers.size()]();
    ::sync();

    // Loads: in a fresh process (what a restarted job does: first-touch memory) and in this one
    // (allocator already warm), in an order rotated every round.
    const size_t fresh_loads = dcp ? 3 : 2;
    for (size_t k = 0; k < fresh_loads; ++k) {
      switch ((k + static_cast<size_t>(round)) % fresh_loads) {
        case 0: r["load_verify_s"].push_back(load_in_fresh_process("tandem", step)); break;
        case 1: r["torch_load_s"].push_back(load_in_fresh_process("torch", step)); break;
        default: r["dcp_load_s"].push_back(dcp_load_in_fresh_process(step)); break;
      }
    }
    r["torch_load_in_process_s"].push_back(seconds([&] {
      torch::load(model2, tm);
      torch::load(opt2, to);
    }));
    tandem::CheckpointManager loader(manager_options(dir + "/sync", false));
    loader.add_module("model", model2);
    loader.add_optimizer("optim", opt2);
    int64_t got = -1;
    r["load_verify_in_process_s"].push_back(seconds([&] { got = loader.resume(); }));
    if (got != step) throw std::runtime_error("resume returned the wrong step");
    if (dcp) {  // into a second model + AdamW kept by the peer (warm after the first round)
      const auto v = dcp->call("load", dcp_dir("sync", step));
      check_dcp(v.at(1), "load in process");
      r["dcp_load_in_process_s"].push_back(std::stod(v.at(0)));
    }
    if (!keep || round + 1 < repeats) {
      fs->remove_file(tm);
      fs->remove_file(to);
      if (dcp) fs->remove_all(dcp_dir("sync", step));
    }
    const auto stats = sync_mgr.last_save_stats();
    r["sync_write_s"].push_back(stats.write_s);
    r["sync_commit_s"].push_back(stats.commit_s);
    std::printf("round %d/%d: raw %.3f  sync %.3f  async blocked %.4f (total %.3f)  load+verify %.3f "
                "(in process %.3f)  torch save %.3f (+fsync %.3f)  torch load %.3f (in process %.3f)  [s]\n",
                round + 1, repeats, r["raw_write_s"].back(), r["sync_save_s"].back(), blocked, total,
                r["load_verify_s"].back(), r["load_verify_in_process_s"].back(), r["torch_save_s"].back(),
                r["torch_save_fsync_s"].back(), r["torch_load_s"].back(), r["torch_load_in_process_s"].back());
    if (dcp) {
      std::printf("         DCP: save %.3f  async blocked %.4f (total %.3f)  async with staging thread blocked "
                  "%.4f (staged %.3f, total %.3f)  load %.3f (in process %.3f)  [s]\n",
                  r["dcp_save_s"].back(), dcp_round.blocked, dcp_round.total, dcp_round.thread_blocked,
                  dcp_round.thread_staged, dcp_round.thread_total, r["dcp_load_s"].back(),
                  r["dcp_load_in_process_s"].back());
    }
    std::fflush(stdout);
  }
  // The loaded state must equal the saved one.
  for (const auto& [a, b] : std::vector<std::pair<at::Tensor, at::Tensor>>{
           {state_tensors(*model, opt)[0], state_tensors(*model2, opt2)[0]},
           {state_tensors(*model, opt).back(), state_tensors(*model2, opt2).back()}}) {
    if (!torch::equal(a, b)) throw std::runtime_error("loaded state differs from the saved state");
  }
  uint64_t ckpt_bytes = 0;
  {
    const std::string d = dir + "/sync/" + tandem::step_directory_name(repeats);
    for (const auto& n : fs->list_dir(d)) ckpt_bytes += fs->open_readable(d + "/" + n)->size();
  }
  if (!keep) fs->remove_all(dir);

  std::ofstream f(out);
  f << "{\n  \"state_bytes\": " << bytes << ",\n  \"checkpoint_bytes\": " << ckpt_bytes
    << ",\n  \"tensors\": " << tensors.size() << ",\n  \"layers\": " << layers
    << ",\n  \"repeats\": " << repeats << ",\n  \"xxh3_one_pass_s\": " << hash_s
    << ",\n  \"copy_one_pass_s\": " << copy_s
    << ",\n  \"async_first_blocked_s\": " << async_first_blocked
    << ",\n  \"async_first_total_s\": " << async_first_total << ",\n  \"torch_threads\": " << threads;
  if (dcp) {
    f << ",\n  \"dcp_checkpoint_bytes\": " << dcp_bytes << ",\n  \"dcp_async_first_blocked_s\": " << dcp_async_first_blocked
      << ",\n  \"dcp_async_first_total_s\": " << dcp_async_first_total
      << ",\n  \"dcp_async_thread_first_blocked_s\": " << dcp_async_thread_first_blocked
      << ",\n  \"dcp_async_thread_first_total_s\": " << dcp_async_thread_first_total
      << ",\n  \"dcp_info\": " << dcp->info_json();
  }
  for (const auto& [k, v] : r) {
    f << ",\n  \"" << k << "\": " << median(v) << ",\n  \"" << k.substr(0, k.size() - 2) << "_runs_s\": [";
    for (size_t i = 0; i < v.size(); ++i) f << (i ? ", " : "") << v[i];
    f << "]";
  }
  f << "\n}\n";
  return 0;
}
