// Helpers of the CheckpointManager tests: a small model, a stateful fake codec, snapshots and
// bitwise comparison, file damage, a file system whose writes can be held back.
#pragma once

#include <tandem/base/file_system.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/grad_codec.h>

#include "checkpoint/step_directory.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <unistd.h>

namespace tandem::ckpt_test {

struct TempDir {
  explicit TempDir(const std::string& name) {
    const char* base = std::getenv("TMPDIR");
    path = std::string(base ? base : "/tmp") + "/tandem_ckpt_" + name + "_" + std::to_string(::getpid());
    posix_file_system()->remove_all(path);
    posix_file_system()->create_dirs(path);
  }
  ~TempDir() { posix_file_system()->remove_all(path); }
  std::string path;
};

// Linear -> BatchNorm (buffers, int64 included) -> ReLU -> Dropout (uses the RNG) -> Linear.
struct Net : torch::nn::Module {
  explicit Net(int64_t hidden = 16)
      : fc1(register_module("fc1", torch::nn::Linear(8, hidden))),
        bn(register_module("bn", torch::nn::BatchNorm1d(hidden))),
        drop(register_module("drop", torch::nn::Dropout(0.2))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(at::relu(bn(fc1(x))))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};

// One step of every optimizer on the same gradients; inputs come from the default generator.
inline void train_step(Net& net, const std::vector<torch::optim::Optimizer*>& opts, int64_t step) {
  const at::Tensor x = at::randn({16, 8});
  const at::Tensor y = at::randn({16, 4}) + static_cast<double>(step % 3);
  for (auto* o : opts) o->zero_grad();
  const at::Tensor loss = (net.forward(x) - y).pow(2).mean();
  loss.backward();
  for (auto* o : opts) o->step();
}

// A codec with error-feedback-like state that changes every step.
class FakeCodec final : public GradCodec {
 public:
  FakeCodec() : gen_(at::make_generator<at::CPUGeneratorImpl>(17)) {}
  std::string name() const override { return "fake"; }
  std::map<std::string, at::Tensor> state() const override { return state_; }
  void load_state(const std::map<std::string, at::Tensor>& s) override { state_ = s; }
  void step() {
    const at::Tensor noise = at::randn({5, 3}, gen_);
    if (state_.empty()) {
      state_["residual.0"] = noise;
      state_["count"] = at::zeros({1}, at::kLong);
    } else {
      state_["residual.0"] = state_["residual.0"] + noise;
      state_["count"] = state_["count"] + 1;
    }
  }

 protected:
  WorkPtr encode_and_reduce(Communicator&, GradBucket&) override { throw std::logic_error("not used"); }

 private:
  at::Generator gen_;
  std::map<std::string, at::Tensor> state_;
};

inline std::map<std::string, at::Tensor> snapshot(
    const torch::OrderedDict<std::string, at::Tensor>& params,
    const torch::OrderedDict<std::string, at::Tensor>& buffers) {
  std::map<std::string, at::Tensor> m;
  for (const auto& p : params) m[p.key()] = p.value().detach().clone();
  for (const auto& b : buffers) m[b.key()] = b.value().detach().clone();
  return m;
}

inline bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

inline void expect_bitwise(const std::map<std::string, at::Tensor>& want,
                           const std::map<std::string, at::Tensor>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (const auto& [k, t] : want) {
    ASSERT_TRUE(got.count(k)) << what << ": missing " << k;
    EXPECT_TRUE(bitwise_equal(t, got.at(k))) << what << ": " << k << " differs";
  }
}

// Every optimizer's per-parameter state, keyed "opt<i>.p<j>.<field>".
inline std::map<std::string, at::Tensor> optimizer_snapshot(const std::vector<torch::optim::Optimizer*>& opts) {
  using namespace torch::optim;
  std::map<std::string, at::Tensor> m;
  for (size_t i = 0; i < opts.size(); ++i) {
    const auto& params = opts[i]->param_groups()[0].params();
    for (size_t j = 0; j < params.size(); ++j) {
      const auto it = opts[i]->state().find(params[j].unsafeGetTensorImpl());
      if (it == opts[i]->state().end()) continue;
      const std::string p = "opt" + std::to_string(i) + ".p" + std::to_string(j) + ".";
      auto put = [&](const std::string& f, const at::Tensor& t) {
        if (t.defined()) m[p + f] = t.clone();
      };
      auto* s = it->second.get();
      if (auto* q = dynamic_cast<SGDParamState*>(s)) put("momentum_buffer", q->momentum_buffer());
      if (auto* q = dynamic_cast<AdamParamState*>(s)) {
        put("exp_avg", q->exp_avg());
        put("exp_avg_sq", q->exp_avg_sq());
        put("max_exp_avg_sq", q->max_exp_avg_sq());
        m[p + "step"] = at::full({1}, q->step(), at::kLong);
      }
      if (auto* q = dynamic_cast<AdamWParamState*>(s)) {
        put("exp_avg", q->exp_avg());
        put("exp_avg_sq", q->exp_avg_sq());
        put("max_exp_avg_sq", q->max_exp_avg_sq());
        m[p + "step"] = at::full({1}, q->step(), at::kLong);
      }
      if (auto* q = dynamic_cast<AdagradParamState*>(s)) {
        put("sum", q->sum());
        m[p + "step"] = at::full({1}, q->step(), at::kLong);
      }
      if (auto* q = dynamic_cast<RMSpropParamState*>(s)) {
        put("square_avg", q->square_avg());
        put("momentum_buffer", q->momentum_buffer());
        put("grad_avg", q->grad_avg());
        m[p + "step"] = at::full({1}, q->step(), at::kLong);
      }
    }
  }
  return m;
}

inline std::shared_ptr<Communicator> shared_comm(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

inline CheckpointManagerOptions options(const std::string& dir, bool async, int64_t every = 0,
                                        std::shared_ptr<Communicator> comm = nullptr) {
  CheckpointManagerOptions o;
  o.directory = dir;
  o.async = async;
  o.every_n_steps = every;
  o.keep_last = 3;
  o.communicator = std::move(comm);
  return o;
}

inline std::string read_all(const std::string& path) { return posix_file_system()->read_file(path); }

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Flips one bit at `offset` (negative: from the end).
inline void flip_bit(const std::string& path, int64_t offset) {
  std::string b = read_all(path);
  const size_t at = offset >= 0 ? static_cast<size_t>(offset) : b.size() - static_cast<size_t>(-offset);
  b[at] = static_cast<char>(b[at] ^ 0x10);
  write_all(path, b);
}

inline void truncate_file(const std::string& path, size_t remove) {
  const std::string b = read_all(path);
  write_all(path, b.substr(0, b.size() - remove));
}

// Throws unless every file of a committed step verifies.
inline void verify_committed(const std::string& dir, int64_t step) {
  auto fs = posix_file_system();
  const Manifest m = detail::read_manifest(*fs, dir, step);
  for (const auto& f : m.files) detail::verify_shard(*fs, dir, m, f, nullptr);
}

// POSIX, except that while blocked every append waits (to hold the async writer mid-save).
class SlowFileSystem final : public FileSystem {
 public:
  void block() {
    std::lock_guard<std::mutex> l(mu_);
    blocked_ = true;
  }
  void unblock() {
    std::lock_guard<std::mutex> l(mu_);
    blocked_ = false;
    cv_.notify_all();
  }
  void wait_unblocked() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !blocked_; });
  }
  std::unique_ptr<WritableFile> new_writable_file(const std::string& path) override {
    struct File final : WritableFile {
      SlowFileSystem* fs;
      std::unique_ptr<WritableFile> base;
      void append(const void* d, size_t n) override {
        fs->wait_unblocked();
        base->append(d, n);
      }
      void sync() override { base->sync(); }
      void close() override { base->close(); }
    };
    auto f = std::make_unique<File>();
    f->fs = this;
    f->base = base_->new_writable_file(path);
    return f;
  }
  std::unique_ptr<ReadableFile> open_readable(const std::string& p) override { return base_->open_readable(p); }
  void rename(const std::string& a, const std::string& b) override { base_->rename(a, b); }
  void sync_dir(const std::string& p) override { base_->sync_dir(p); }
  void create_dirs(const std::string& p) override { base_->create_dirs(p); }
  std::vector<std::string> list_dir(const std::string& p) override { return base_->list_dir(p); }
  bool exists(const std::string& p) override { return base_->exists(p); }
  bool is_directory(const std::string& p) override { return base_->is_directory(p); }
  void remove_file(const std::string& p) override { base_->remove_file(p); }
  void remove_dir(const std::string& p) override { base_->remove_dir(p); }

 private:
  std::shared_ptr<FileSystem> base_ = posix_file_system();
  std::mutex mu_;
  std::condition_variable cv_;
  bool blocked_ = false;
};

}  // namespace tandem::ckpt_test
