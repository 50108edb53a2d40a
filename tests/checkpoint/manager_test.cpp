// CheckpointManager end to end in one process: bitwise round trip of every state kind, resume
// equivalence (SGD with momentum, AdamW), async == sync byte for byte, faults through the manager,
// corruption and fallback, errors surfacing from the async writer, keep-last-K. Ranks as threads
// are in manager_ranks_test.cpp.
#include "tests/checkpoint/checkpoint_test_util.h"

#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/collectives/grad_codec.h>

#include "checkpoint/step_directory.h"
#include "tests/support/fault_injection_file_system.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cerrno>
#include <mutex>

namespace tandem {
namespace {

using namespace tandem::ckpt_test;

TEST(CheckpointManager, RoundTripsEveryStateKindBitwise) {
  TempDir dir("roundtrip");
  at::manual_seed(1);
  auto net = std::make_shared<Net>();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(true));
  torch::optim::AdamW adamw(net->parameters(), 1e-3);
  torch::optim::Adagrad adagrad(net->parameters(), 1e-2);
  torch::optim::RMSprop rmsprop(net->parameters(), torch::optim::RMSpropOptions(1e-2).momentum(0.5).centered(true));
  std::vector<torch::optim::Optimizer*> opts = {&sgd, &adam, &adamw, &adagrad, &rmsprop};
  FakeCodec codec;
  std::map<std::string, at::Tensor> extra = {{"half", at::randn({3, 2}).to(at::kHalf)},
                                             {"bf16", at::randn({5}).to(at::kBFloat16)},
                                             {"i16", at::arange(7, at::kShort)},
                                             {"i8", at::arange(-3, 3, at::kChar)},
                                             {"bool", at::rand({4}) > 0.5},
                                             {"f64", at::randn({2, 2}, at::kDouble)},
                                             {"empty", at::empty({0, 3})}};
  std::map<std::string, CheckpointValue> loader = {
      {"position", int64_t{12345}}, {"nan", std::nan("")}, {"inf", -INFINITY},
      {"lr", 0.1 + 0.2}, {"name", std::string("epoch \"3\" \xe2\x9c\x93")}, {"shuffle", true}};
  for (int i = 0; i < 3; ++i) {  // give every optimizer state
    train_step(*net, opts, i);
    codec.step();
  }
  const auto model_before = snapshot(net->named_parameters(), net->named_buffers());
  const auto opt_before = optimizer_snapshot(opts);
  const at::Tensor rng_before = at::detail::getDefaultCPUGenerator().get_state();
  const auto codec_before = codec.state();
  auto register_all = [&](CheckpointManager& m) {
    m.add_module("model", net);
    m.add_optimizer("sgd", sgd);
    m.add_optimizer("adam", adam);
    m.add_optimizer("adamw", adamw);
    m.add_optimizer("adagrad", adagrad);
    m.add_optimizer("rmsprop", rmsprop);
    m.add_rng("rng");
    m.add_tensors(
        "codec", [&] { return codec.state(); },
        [&](const std::map<std::string, at::Tensor>& t) { codec.load_state(t); },
        Sharding::kSharded);
    m.add_tensors("extra", [&] { return extra; }, [&](const std::map<std::string, at::Tensor>& t) { extra = t; });
    m.add_values("loader", [&] { return loader; }, [&](const std::map<std::string, CheckpointValue>& v) { loader = v; });
  };
  const auto extra_before = extra;
  const auto loader_before = loader;
  {
    CheckpointManager m(options(dir.path, /*async=*/false));
    register_all(m);
    m.set_value("step", int64_t{3});
    m.set_value("note", std::string("hello"));
    m.save(3);
  }
  // Change everything.
  for (int i = 0; i < 2; ++i) {
    train_step(*net, opts, 10 + i);
    codec.step();
  }
  at::manual_seed(999);
  extra = {};
  loader = {};
  CheckpointManager m(options(dir.path, /*async=*/false));
  register_all(m);
  ASSERT_EQ(m.resume(), 3);
  EXPECT_EQ(m.resumed_step(), 3);
  expect_bitwise(model_before, snapshot(net->named_parameters(), net->named_buffers()), "model");
  expect_bitwise(opt_before, optimizer_snapshot(opts), "optimizers");
  EXPECT_TRUE(at::equal(rng_before, at::detail::getDefaultCPUGenerator().get_state()));
  expect_bitwise(codec_before, codec.state(), "codec");
  expect_bitwise(extra_before, extra, "extra");
  ASSERT_EQ(loader.size(), loader_before.size());
  for (const auto& [k, v] : loader_before) {
    if (const double* d = std::get_if<double>(&v)) {
      ASSERT_TRUE(std::holds_alternative<double>(loader.at(k))) << k;
      EXPECT_EQ(std::memcmp(d, &std::get<double>(loader.at(k)), sizeof(double)), 0) << k;
    } else {
      EXPECT_EQ(loader.at(k), v) << k;
    }
  }
  EXPECT_EQ(std::get<int64_t>(*m.value("step")), 3);
  EXPECT_EQ(std::get<std::string>(*m.value("note")), "hello");
  // Learning rates and other hyperparameters come back too.
  EXPECT_EQ(static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options()).momentum(), 0.9);
  EXPECT_TRUE(static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).amsgrad());
}

TEST(CheckpointManager, NothingToResumeReturnsZeroAndChangesNothing) {
  TempDir dir("empty");
  auto net = std::make_shared<Net>();
  const auto before = snapshot(net->named_parameters(), net->named_buffers());
  CheckpointManager m(options(dir.path + "/does/not/exist", true));
  m.add_module("model", net);
  EXPECT_EQ(m.resume(), 0);
  EXPECT_EQ(m.resumed_step(), -1);
  expect_bitwise(before, snapshot(net->named_parameters(), net->named_buffers()), "model");
}

enum class OptKind { kSgdMomentum, kAdamW };

// Trains 50 steps; with `interrupt`, saves every 10 steps, "dies" at step 37, and a fresh process
// state (new model, optimizer, generator seed, manager) resumes from step 30 and finishes.
std::vector<at::Tensor> train_run(OptKind kind, const std::string& dir, bool interrupt) {
  auto make_opt = [&](Net& net) -> std::unique_ptr<torch::optim::Optimizer> {
    if (kind == OptKind::kSgdMomentum) {
      return std::make_unique<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    }
    return std::make_unique<torch::optim::AdamW>(net.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  };
  at::manual_seed(42);
  auto net = std::make_shared<Net>();
  auto opt = make_opt(*net);
  int64_t step = 0;
  if (interrupt) {
    auto m = std::make_unique<CheckpointManager>(options(dir, /*async=*/true, /*every=*/10));
    m->add_module("model", net);
    m->add_optimizer("optim", *opt);
    m->add_rng("rng");
    EXPECT_EQ(m->resume(), 0);
    for (; step < 37; ++step) {
      train_step(*net, {opt.get()}, step);
      m->set_value("step", step + 1);
      m->maybe_save(step + 1);
    }
    m->wait();
    m.reset();
    // Restart: everything new and different.
    at::manual_seed(7);
    net = std::make_shared<Net>();
    opt = make_opt(*net);
    m = std::make_unique<CheckpointManager>(options(dir, /*async=*/true, /*every=*/10));
    m->add_module("model", net);
    m->add_optimizer("optim", *opt);
    m->add_rng("rng");
    step = m->resume();
    EXPECT_EQ(step, 30);
    EXPECT_EQ(std::get<int64_t>(*m->value("step")), 30);
    for (; step < 50; ++step) {
      train_step(*net, {opt.get()}, step);
      m->maybe_save(step + 1);
    }
    m->wait();
  } else {
    for (; step < 50; ++step) train_step(*net, {opt.get()}, step);
  }
  std::vector<at::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(CheckpointManager, ResumeEquivalenceSgdMomentum) {
  TempDir dir("resume_sgd");
  const auto straight = train_run(OptKind::kSgdMomentum, dir.path, false);
  const auto resumed = train_run(OptKind::kSgdMomentum, dir.path, true);
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(bitwise_equal(straight[i], resumed[i])) << i;
}

TEST(CheckpointManager, ResumeEquivalenceAdamW) {
  TempDir dir("resume_adamw");
  const auto straight = train_run(OptKind::kAdamW, dir.path, false);
  const auto resumed = train_run(OptKind::kAdamW, dir.path, true);
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(bitwise_equal(straight[i], resumed[i])) << i;
}

TEST(CheckpointManager, AsyncSaveEqualsSyncSaveByteForByte) {
  TempDir dir("async_sync");
  at::manual_seed(3);
  auto net = std::make_shared<Net>();
  torch::optim::AdamW opt(net->parameters(), 1e-3);
  train_step(*net, {&opt}, 0);
  for (const bool async : {false, true}) {
    CheckpointManager m(options(dir.path + (async ? "/async" : "/sync"), async));
    m.add_module("model", net);
    m.add_optimizer("optim", opt);
    m.add_rng("rng");
    m.set_value("step", int64_t{1});
    m.save(1);
    m.wait();
  }
  for (const std::string& name : {std::string("manifest.json"), shard_file_name(0)}) {
    const std::string a = read_all(detail::step_directory(dir.path + "/sync", 1) + "/" + name);
    const std::string b = read_all(detail::step_directory(dir.path + "/async", 1) + "/" + name);
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << name << " differs between sync and async saves";
  }
}

TEST(CheckpointManager, AsyncSaveReturnsBeforeTheWriteAndTrainingMayContinue) {
  TempDir dir("async_continue");
  auto fs = std::make_shared<SlowFileSystem>();
  at::manual_seed(3);
  auto net = std::make_shared<Net>();
  CheckpointManagerOptions o = options(dir.path, true);
  o.file_system = fs;
  CheckpointManager m(o);
  m.add_module("model", net);
  const auto saved = snapshot(net->named_parameters(), net->named_buffers());
  fs->block();
  m.save(1);  // returns although the writer is blocked on its first write
  // Training changes the parameters while the writer still runs: the save keeps the staged copy.
  {
    at::NoGradGuard g;
    for (auto& p : net->parameters()) p.add_(1.0);
  }
  fs->unblock();
  m.wait();
  EXPECT_GT(m.last_save_stats().bytes, 0u);
  auto fresh = std::make_shared<Net>();
  CheckpointManager r(options(dir.path, true));
  r.add_module("model", fresh);
  ASSERT_EQ(r.resume(), 1);
  expect_bitwise(saved, snapshot(fresh->named_parameters(), fresh->named_buffers()), "model");
}

TEST(CheckpointManager, AsyncErrorsSurfaceOnTheNextCall) {
  TempDir dir("async_error");
  auto fs = std::make_shared<FaultInjectionFileSystem>();
  auto net = std::make_shared<Net>();
  CheckpointManagerOptions o = options(dir.path, true);
  o.file_system = fs;
  std::vector<std::string> warnings;
  std::mutex mu;
  o.on_warning = [&](const std::string& w) {
    std::lock_guard<std::mutex> l(mu);
    warnings.push_back(w);
  };
  {
    CheckpointManager m(o);
    m.add_module("model", net);
    m.save(10);
    m.wait();
    fs->fail_all(FaultInjectionFileSystem::Op::kAppend, ENOSPC);
    m.save(20);  // returns; the failure is the writer's
    try {
      m.wait();
      ADD_FAILURE() << "wait() did not report the failed save";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("step 20"), std::string::npos) << e.what();
    }
    m.wait();  // reported once
    m.save(30);  // fails again, reported by the next save
    EXPECT_THROW(m.save(40), CheckpointError);
    fs->reset();
    m.save(50);
    m.wait();
    EXPECT_EQ(m.committed_steps(), (std::vector<int64_t>{50, 10}));
    // A failure nobody waited for is reported by the destructor through the warning handler.
    fs->fail_all(FaultInjectionFileSystem::Op::kSync, EIO);
    m.save(60);
  }
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings.back().find("never reported"), std::string::npos) << warnings.back();
}

// Issue 20 items 2 and 8: a save that fails on a full disk removes its partial directory (the
// restart would fail the same way), says what keep_last costs, and claims a previous checkpoint
// only when there is one.
TEST(CheckpointManager, AFailedSaveRemovesItsPartialDirectoryAndTellsWhatIsLeft) {
  TempDir dir("failed_save");
  at::manual_seed(3);
  auto net = std::make_shared<Net>();
  auto fs = std::make_shared<FaultInjectionFileSystem>();
  CheckpointManagerOptions o = options(dir.path, false);
  o.file_system = fs;
  CheckpointManager m(o);
  m.add_module("model", net);
  const auto message_of = [&](int64_t step) {
    try {
      m.save(step);
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "save(" << step << ") did not fail";
    return std::string();
  };
  fs->fail_all(FaultInjectionFileSystem::Op::kAppend, ENOSPC);
  std::string first = message_of(10);
  EXPECT_NE(first.find("No space left on device"), std::string::npos) << first;
  EXPECT_NE(first.find("checkpoint.keep_last = 3 needs room for 4 checkpoints"), std::string::npos) << first;
  EXPECT_EQ(first.find("previous checkpoint stays"), std::string::npos) << "there is none\n" << first;
  EXPECT_NE(first.find("There is no earlier checkpoint"), std::string::npos) << first;
  EXPECT_NE(first.find("was removed"), std::string::npos) << first;
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/step_0000000010.tmp")) << "partial directory left";
  fs->reset();
  m.save(20);
  fs->fail_all(FaultInjectionFileSystem::Op::kAppend, ENOSPC);
  const std::string second = message_of(30);
  EXPECT_NE(second.find("The previous checkpoint stays the newest valid one."), std::string::npos) << second;
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/step_0000000030.tmp"));
  fs->reset();
  EXPECT_EQ(m.committed_steps(), (std::vector<int64_t>{20}));
}

// Issue 20 item 12: an async save copies parameters and optimizer state after save() returns
// (they change only in an optimizer step) and everything else before; after wait_staged() the
// parameters may change without touching the checkpoint.
TEST(CheckpointManager, AsyncSaveStagesParametersAfterSaveReturnsAndBuffersBefore) {
  TempDir dir("deferred_staging");
  at::manual_seed(6);
  auto net = std::make_shared<Net>(512);
  torch::optim::AdamW opt(net->parameters(), 1e-2);
  train_step(*net, {&opt}, 0);
  const auto saved = snapshot(net->named_parameters(), net->named_buffers());
  const auto saved_optim = optimizer_snapshot({&opt});
  {
    CheckpointStagingFence fence;  // this loop calls wait_for_checkpoint_staging(), as the wrappers do
    CheckpointManager m(options(dir.path, true));
    m.add_module("model", net);
    m.add_optimizer("optim", opt);
    m.save(1);
    // Buffers may change in the next forward (batch norm): they were copied before save() returned.
    for (auto& b : net->named_buffers()) b.value().add_(1);
    wait_for_checkpoint_staging();  // what tandem's wrappers do at the end of backward
    train_step(*net, {&opt}, 1);    // the optimizer step changes parameters and state
    m.wait();
    uint64_t parameters = 0, moments = 0;
    for (const auto& p : net->parameters()) parameters += p.numel() * sizeof(float);
    moments = 2 * parameters;  // AdamW's exp_avg and exp_avg_sq
    EXPECT_EQ(m.last_save_stats().deferred_bytes, parameters + moments) << "not copied after save() returned";
  }
  auto fresh = std::make_shared<Net>(512);
  torch::optim::AdamW opt2(fresh->parameters(), 1e-2);
  CheckpointManager r(options(dir.path, true));
  r.add_module("model", fresh);
  r.add_optimizer("optim", opt2);
  ASSERT_EQ(r.resume(), 1);
  expect_bitwise(saved, snapshot(fresh->named_parameters(), fresh->named_buffers()), "model");
  expect_bitwise(saved_optim, optimizer_snapshot({&opt2}), "optimizer");
}

// Issue 20 item 7: a damaged header length is reported with the file it is in.
TEST(CheckpointManager, ACorruptHeaderLengthWarningNamesTheFile) {
  TempDir dir("header_length");
  at::manual_seed(4);
  auto net = std::make_shared<Net>();
  {
    CheckpointManager m(options(dir.path, false));
    m.add_module("model", net);
    m.save(10);
  }
  const std::string shard = dir.path + "/step_0000000010/" + shard_file_name(0);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    const char huge[8] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\x00', '\x00'};
    f.write(huge, 8);
  }
  std::vector<std::string> warnings;
  CheckpointManagerOptions o = options(dir.path, false);
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  CheckpointManager r(o);
  r.add_module("model", std::make_shared<Net>());
  EXPECT_EQ(r.resume(), 0);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find("'" + shard + "'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("shard header length"), std::string::npos) << warnings[0];
}

TEST(CheckpointManager, EveryInjectedFaultLeavesPreviousOrNewCheckpoint) {
  TempDir dir("manager_faults");
  at::manual_seed(5);
  auto net = std::make_shared<Net>();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_step(*net, {&opt}, 0);
  // Count the file-system ops of one save.
  int64_t ops = 0;
  {
    auto fs = std::make_shared<FaultInjectionFileSystem>();
    CheckpointManagerOptions o = options(dir.path + "/count", false);
    o.file_system = fs;
    CheckpointManager m(o);
    m.add_module("model", net);
    m.add_optimizer("optim", opt);
    m.save(1);
    fs->reset();
    m.save(2);
    ops = fs->ops();
  }
  ASSERT_GT(ops, 5);
  for (int64_t k = 0; k < ops; ++k) {
    for (const bool power_loss : {false, true}) {
      const std::string d = dir.path + "/k" + std::to_string(k) + (power_loss ? "p" : "");
      auto fs = std::make_shared<FaultInjectionFileSystem>();
      CheckpointManagerOptions o = options(d, k % 2 == 0);  // async and sync alike
      o.file_system = fs;
      o.on_warning = [](const std::string&) {};
      std::map<std::string, at::Tensor> at_step[3];
      {
        CheckpointManager m(o);
        m.add_module("model", net);
        m.add_optimizer("optim", opt);
        at_step[1] = snapshot(net->named_parameters(), net->named_buffers());
        m.save(1);
        m.wait();
        train_step(*net, {&opt}, 1);
        at_step[2] = snapshot(net->named_parameters(), net->named_buffers());
        fs->reset();
        fs->crash_at(k);
        try {
          m.save(2);
          m.wait();
        } catch (const FileError&) {  // the save's CheckpointError, or the simulated crash itself
        }
      }
      if (power_loss) fs->lose_unsynced();
      fs->reset();
      auto fresh = std::make_shared<Net>();
      torch::optim::SGD fresh_opt(fresh->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      CheckpointManager r(o);
      r.add_module("model", fresh);
      r.add_optimizer("optim", fresh_opt);
      const int64_t step = r.resume();
      ASSERT_TRUE(step == 1 || step == 2) << "crash at op " << k << " left step " << step;
      expect_bitwise(at_step[step], snapshot(fresh->named_parameters(), fresh->named_buffers()),
                     "crash at op " + std::to_string(k));
      for (const int64_t s : r.committed_steps()) {  // nothing committed is corrupt
        EXPECT_NO_THROW(verify_committed(d, s)) << "op " << k << " step " << s;
      }
    }
  }
}

TEST(CheckpointManager, CorruptTruncatedMissingAndUncommittedAreSkippedWithAWarning) {
  struct Case {
    const char* name;
    std::function<void(const std::string& step_dir)> damage;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"bitflip", [](const std::string& d) { flip_bit(d + "/" + shard_file_name(0), -9); }, "checksum mismatch"},
      {"header", [](const std::string& d) { flip_bit(d + "/" + shard_file_name(0), 20); }, "rank_00000.safetensors"},
      {"truncated", [](const std::string& d) { truncate_file(d + "/" + shard_file_name(0), 100); }, "truncated"},
      {"missing", [](const std::string& d) { std::remove((d + "/" + shard_file_name(0)).c_str()); }, "missing"},
      {"manifest", [](const std::string& d) { flip_bit(d + "/manifest.json", 200); }, "manifest"},
      {"uncommitted", [](const std::string& d) { std::remove((d + "/manifest.json").c_str()); }, "never committed"},
  };
  for (const auto& c : cases) {
    TempDir dir(std::string("damage_") + c.name);
    auto net = std::make_shared<Net>();
    std::map<std::string, at::Tensor> at10;
    {
      CheckpointManager m(options(dir.path, false));
      m.add_module("model", net);
      at10 = snapshot(net->named_parameters(), net->named_buffers());
      m.save(10);
      {
        at::NoGradGuard g;
        for (auto& p : net->parameters()) p.mul_(2);
      }
      m.save(20);
    }
    c.damage(detail::step_directory(dir.path, 20));
    std::vector<std::string> warnings;
    CheckpointManagerOptions o = options(dir.path, false);
    o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
    auto fresh = std::make_shared<Net>();
    CheckpointManager r(o);
    r.add_module("model", fresh);
    EXPECT_EQ(r.resume(), 10) << c.name;
    expect_bitwise(at10, snapshot(fresh->named_parameters(), fresh->named_buffers()), c.name);
    std::string all;
    for (const auto& w : warnings) all += w + "\n";
    EXPECT_NE(all.find("step_0000000020"), std::string::npos) << c.name << ": " << all;
    EXPECT_NE(all.find(c.reason), std::string::npos) << c.name << ": " << all;
  }
}

TEST(CheckpointManager, MismatchedStateIsAnErrorNotAFallback) {
  TempDir dir("mismatch");
  {
    auto net = std::make_shared<Net>();
    CheckpointManager m(options(dir.path, false));
    m.add_module("model", net);
    m.save(10);
  }
  auto other = std::make_shared<Net>(/*hidden=*/9);
  CheckpointManager r(options(dir.path, false));
  r.add_module("model", other);
  try {
    r.resume();
    ADD_FAILURE() << "resume() accepted a checkpoint of another shape";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
  }
}

TEST(CheckpointManager, UnsupportedOptimizerNamesTheSupportedOnes) {
  auto net = std::make_shared<Net>();
  torch::optim::LBFGS lbfgs(net->parameters());
  TempDir dir("lbfgs");
  CheckpointManager m(options(dir.path, false));
  try {
    m.add_optimizer("lbfgs", lbfgs);
    ADD_FAILURE() << "LBFGS accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("LBFGS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("AdamW"), std::string::npos) << e.what();
  }
}

// A sync save un-commits the steps beyond keep_last before it returns and leaves unlinking their
// files to the writer thread; wait() (like the next save or resume) waits for that too.
TEST(CheckpointManager, ASyncSaveRetiresOldStepsAtOnceAndUnlinksThemOnTheWriter) {
  TempDir dir("retire");
  auto net = std::make_shared<Net>();
  CheckpointManagerOptions o = options(dir.path, /*async=*/false);
  o.keep_last = 1;
  CheckpointManager m(o);
  m.add_module("model", net);
  m.save(1);
  m.save(2);
  EXPECT_EQ(m.committed_steps(), (std::vector<int64_t>{2}));
  EXPECT_FALSE(posix_file_system()->exists(dir.path + "/step_0000000001"));
  m.wait();
  EXPECT_EQ(posix_file_system()->list_dir(dir.path), (std::vector<std::string>{"step_0000000002"}));
}

TEST(CheckpointManager, KeepsTheLastK) {
  TempDir dir("keep");
  auto net = std::make_shared<Net>();
  CheckpointManagerOptions o = options(dir.path, true, 10);
  o.keep_last = 2;
  CheckpointManager m(o);
  m.add_module("model", net);
  for (int64_t s = 1; s <= 50; ++s) m.maybe_save(s);
  m.wait();
  EXPECT_EQ(m.committed_steps(), (std::vector<int64_t>{50, 40}));
}

}  // namespace
}  // namespace tandem
