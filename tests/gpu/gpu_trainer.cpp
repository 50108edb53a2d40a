#include "tests/gpu/gpu_trainer.h"

#include "tests/launcher/tandemrun_process.h"

#include <tandem/checkpoint/format.h>
#include <tandem/runtime/grad_norm.h>

#include <CLI/CLI.hpp>
#include <torch/serialize.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace tandem::gpu_test {

std::string wrapper_name(Wrapper w) {
  switch (w) {
    case Wrapper::kPlain: return "plain";
    case Wrapper::kDdp: return "ddp";
    case Wrapper::kZero1: return "zero1";
    case Wrapper::kZero2: return "zero2";
    case Wrapper::kZero3: return "zero3";
  }
  return "?";
}

namespace {

int stage_of(Wrapper w) {
  return w == Wrapper::kZero1 ? 1 : w == Wrapper::kZero2 ? 2 : 3;
}

}  // namespace

Trainer::Trainer(const Recipe& recipe, Wrapper wrapper, std::shared_ptr<NetImpl> model,
                 std::shared_ptr<Communicator> comm, int world)
    : recipe_(recipe), wrapper_(wrapper), model_(std::move(model)), comm_(std::move(comm)),
      rank_(comm_ ? comm_->rank() : 0), world_(world) {
  DistributedDataParallelOptions options;
  options.mixed_precision.param_dtype = recipe.param_dtype;
  if (wrapper == Wrapper::kPlain) {
    params_ = model_->parameters();  // fp32: the masters under mixed precision
    if (recipe.param_dtype != at::kFloat) {
      low_ = make_net(recipe.size, recipe.seed, recipe.model);
      low_->to(recipe.param_dtype);
    }
  } else if (wrapper == Wrapper::kDdp) {
    ddp_ = std::make_unique<DistributedDataParallel<NetImpl>>(model_, comm_, options);
    params_ = ddp_->parameters();
  } else {
    ShardingOptions sharding;
    sharding.stage = stage_of(wrapper);
    sdp_ = std::make_unique<ShardedDataParallel<NetImpl>>(model_, comm_, sharding, options);
    params_ = sdp_->parameters();
  }
  opt_ = std::make_unique<torch::optim::AdamW>(
      params_, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  if (recipe.scaler) {
    GradScalerOptions o;
    o.growth_interval = recipe.growth_interval;
    scaler_ = std::make_unique<GradScaler>(o, comm_);
  }
  // Dropout's stream starts at the same state in every run (this also seeds the CUDA generators).
  torch::manual_seed(recipe.seed + 1000);
}

Trainer::~Trainer() = default;

at::Tensor Trainer::forward(const at::Tensor& x) {
  if (ddp_) return (*ddp_)(x);
  return (*sdp_)(x);
}

at::Tensor Trainer::loss_of(NetImpl* plain, const Batch& b) {
  AutocastGuard autocast(test_device().type(), recipe_.autocast, recipe_.autocast != at::kFloat);
  // The plain loop casts a floating input to param_dtype, as the wrappers' forward does.
  at::Tensor out = plain != nullptr ? plain->forward(b.x.to(recipe_.param_dtype)) : forward(b.x);
  return torch::mse_loss(out.to(at::kFloat), b.y);
}

void Trainer::backward(const at::Tensor& loss) {
  (scaler_ ? scaler_->scale(loss) : loss).backward();
}

void Trainer::step(int step) {
  opt_->zero_grad();
  if (wrapper_ == Wrapper::kPlain) {
    plain_backward(step);
  } else {
    backward(loss_of(nullptr, batch_of(recipe_.size, rank_, step, recipe_.rows)));
  }
  finish_step();
}

void Trainer::plain_backward(int step) {
  const bool mixed = low_ != nullptr;
  NetImpl& net = mixed ? *low_ : *model_;
  const std::vector<at::Tensor> net_params = net.parameters();
  if (mixed) {  // what the wrappers' next forward does: the masters cast into the model
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net_params.size(); ++i) net_params[i].copy_(params_[i]);
  }
  if (!mixed && world_ == 1) {
    backward(loss_of(&net, batch_of(recipe_.size, 0, step, recipe_.rows)));
    return;
  }
  // Each rank's gradients in turn, cast to fp32 and summed over ranks 0..N-1, then averaged.
  std::vector<at::Tensor> sum(net_params.size());
  for (int r = 0; r < world_; ++r) {
    for (const auto& p : net_params) p.mutable_grad() = at::Tensor();
    backward(loss_of(&net, batch_of(recipe_.size, r, step, recipe_.rows)));
    for (size_t i = 0; i < net_params.size(); ++i) {
      const at::Tensor g = net_params[i].grad().to(at::kFloat);
      sum[i] = r == 0 ? g : sum[i] + g;
    }
  }
  for (auto& p : net_params) p.mutable_grad() = at::Tensor();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].mutable_grad() = world_ == 1 ? sum[i] : sum[i].div(world_);
  }
}

void Trainer::finish_step() {
  if (recipe_.clip > 0) {
    if (scaler_) scaler_->unscale(*opt_);  // clip what the optimizer will see
    norms_.push_back(sdp_ ? sdp_->clip_grad_norm(recipe_.clip)
                          : clip_grad_norm(params_, recipe_.clip));
  }
  bool stepped = true;
  if (scaler_) {
    stepped = scaler_->step(*opt_);
    scaler_->update();
  } else {
    opt_->step();
  }
  stepped_.push_back(stepped);
}

std::vector<MasterSlice> Trainer::masters() const {
  std::vector<MasterSlice> out;
  if (sdp_) {
    for (const auto& s : sdp_->core().parameter_slices()) {
      int64_t numel = 1;
      for (int64_t d : s.shape) numel *= d;
      at::Tensor data = s.data.defined() ? s.data.detach().reshape({-1}).clone()
                                         : at::empty({0}, params_[0].options());
      out.push_back({s.name, numel, s.begin, data});
    }
    return out;
  }
  // The plain loop's model and DDP's parameters() list the trainable parameters in registration
  // order, as named_parameters() does.
  const auto named = model_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const at::Tensor& value = ddp_ ? params_[i] : named[i].value();
    out.push_back({named[i].key(), value.numel(), 0, value.detach().reshape({-1}).clone()});
  }
  return out;
}

void Trainer::register_checkpoint(CheckpointManager& ckpt) {
  if (ddp_) {
    ddp_->register_checkpoint(ckpt, "model");
    ckpt.add_optimizer("optim", *opt_);
    ckpt.add_tensors(
        "ddp", [this] { return ddp_->state(); },
        [this](const std::map<std::string, at::Tensor>& s) { ddp_->load_state(s); },
        Sharding::kSharded);
  } else if (sdp_) {
    sdp_->register_checkpoint(ckpt, "model");
    sdp_->register_optimizer(ckpt, "optim", *opt_);
  } else {
    ckpt.add_module("model", model_);
    ckpt.add_optimizer("optim", *opt_);
  }
  if (scaler_) scaler_->register_checkpoint(ckpt, "scaler");
}

namespace {

Wrapper parse_wrapper(const std::string& name) {
  for (Wrapper w : {Wrapper::kPlain, Wrapper::kDdp, Wrapper::kZero1, Wrapper::kZero2, Wrapper::kZero3}) {
    if (name == wrapper_name(w)) return w;
  }
  throw std::invalid_argument("no wrapper '" + name + "'");
}

std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

std::string exact(double v) {  // reads back to the same bits
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

at::ScalarType parse_dtype(const std::string& name) {
  for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16}) {
    if (name == c10::toString(t)) return t;
  }
  throw std::invalid_argument("no dtype '" + name + "' (Float, Half, BFloat16)");
}

// One rank's outcome in DIR/rank<R>.pt (the slices' data) and .txt (everything else: a line
// "norms <n> v...", "stepped <n> b...", then "slice <name> <numel> <begin>" per slice).
void save_rank(const std::string& dir, int rank, const Trainer& t) {
  const std::string base = dir + "/rank" + std::to_string(rank);
  std::vector<at::Tensor> data;
  std::ofstream index(base + ".txt");
  index.precision(17);
  index << "norms " << t.norms().size();
  for (double n : t.norms()) index << " " << n;
  index << "\nstepped " << t.stepped().size();
  for (bool b : t.stepped()) index << " " << (b ? 1 : 0);
  index << "\n";
  for (const auto& m : t.masters()) {
    index << "slice " << m.name << " " << m.numel << " " << m.begin << "\n";
    data.push_back(m.data.cpu());
  }
  torch::save(data, base + ".pt");
  if (!index.good()) throw std::runtime_error("cannot write " + base + ".txt");
}

struct RankOutcome {
  std::vector<MasterSlice> slices;
  std::vector<double> norms;
  std::vector<bool> stepped;
};

RankOutcome load_rank(const std::string& dir, int rank) {
  const std::string base = dir + "/rank" + std::to_string(rank);
  std::ifstream index(base + ".txt");
  if (!index) throw std::runtime_error("rank " + std::to_string(rank) + " left no " + base + ".txt");
  RankOutcome out;
  std::string word;
  size_t n = 0;
  index >> word >> n;
  out.norms.resize(n);
  for (auto& v : out.norms) index >> v;
  index >> word >> n;
  for (size_t i = 0; i < n; ++i) {
    int b = 0;
    index >> b;
    out.stepped.push_back(b != 0);
  }
  std::vector<at::Tensor> data;
  torch::load(data, base + ".pt");
  for (const at::Tensor& d : data) {
    MasterSlice m;
    index >> word >> m.name >> m.numel >> m.begin;
    m.data = d.to(test_device());
    out.slices.push_back(std::move(m));
  }
  if (!index) throw std::runtime_error(base + ".txt does not match " + base + ".pt");
  return out;
}

}  // namespace

std::vector<std::string> recipe_args(const Recipe& r, Wrapper wrapper) {
  return {"--size", r.size.name, "--wrapper", wrapper_name(wrapper),
          "--dropout", exact(r.model.dropout),
          "--checkpointed", r.model.checkpointed ? "1" : "0",
          "--replay-rng", r.model.replay_rng ? "1" : "0",
          "--steps", std::to_string(r.steps), "--rows", std::to_string(r.rows),
          "--param-dtype", dtype_name(r.param_dtype), "--scaler", r.scaler ? "1" : "0",
          "--growth-interval", std::to_string(r.growth_interval),
          "--autocast", dtype_name(r.autocast), "--clip", exact(r.clip),
          "--seed", std::to_string(r.seed)};
}

int rank_worker_main(int argc, char** argv) {
  CLI::App app("one rank of a gpu test's world (tests/gpu/gpu_trainer.h)");
  std::string out, size = "10M", wrapper = "ddp", param_dtype = "Float", autocast = "Float";
  Recipe r;
  app.add_option("--out", out)->required();
  app.add_option("--size", size);
  app.add_option("--wrapper", wrapper);
  app.add_option("--dropout", r.model.dropout);
  app.add_option("--checkpointed", r.model.checkpointed);
  app.add_option("--replay-rng", r.model.replay_rng);
  app.add_option("--steps", r.steps);
  app.add_option("--rows", r.rows);
  app.add_option("--param-dtype", param_dtype);
  app.add_option("--scaler", r.scaler);
  app.add_option("--growth-interval", r.growth_interval);
  app.add_option("--autocast", autocast);
  app.add_option("--clip", r.clip);
  app.add_option("--seed", r.seed);
  CLI11_PARSE(app, argc, argv);
  try {
    r.size = model_size(size);
    r.param_dtype = parse_dtype(param_dtype);
    r.autocast = parse_dtype(autocast);
    InitOptions options = InitOptions::from_env();
    options.backend = "gloo";  // several ranks on one GPU: NCCL refuses them; Gloo stages CUDA
    Distributed dist = init(options);
    if (std::getenv("TANDEM_GPU_TEST_CPU") != nullptr) at::set_num_threads(1);
    Trainer t(r, parse_wrapper(wrapper), make_net(r.size, r.seed, r.model), dist.world,
              dist.world->size());
    for (int s = 0; s < r.steps; ++s) t.step(s);
    save_rank(out, dist.world->rank(), t);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_rank_worker: %s\n", e.what());
    return 1;
  }
}

RunResult train(const Recipe& recipe, Wrapper wrapper, int world) {
  if (recipe.model.dropout > 0 && world != 1) {
    throw std::invalid_argument("train: dropout needs world 1 (the plain loop draws every "
                                "rank's masks from one generator)");
  }
  RunResult result;
  if (wrapper == Wrapper::kPlain || world == 1) {
    auto model = make_net(recipe.size, recipe.seed, recipe.model);
    Distributed dist;
    if (wrapper != Wrapper::kPlain) dist = nccl_world_of_one();
    Trainer t(recipe, wrapper, model, dist.world, world);
    for (int s = 0; s < recipe.steps; ++s) t.step(s);
    result.masters = assemble({t.masters()});
    result.norms = t.norms();
    result.stepped = t.stepped();
    return result;
  }
  launcher_test::TempDir dir("tandem-gpu-ranks");
  std::vector<std::string> args = {"--standalone", "--nproc-per-node", std::to_string(world),
                                   GPU_RANK_WORKER, "--out", dir.path};
  for (const std::string& a : recipe_args(recipe, wrapper)) args.push_back(a);
  // A 134 M-parameter run takes about a minute on a GPU; the 10 M ones a few seconds.
  const auto limit = recipe.size.width >= 4096 ? std::chrono::seconds(240) : std::chrono::seconds(120);
  const launcher_test::RunResult run = launcher_test::run_tandemrun(args, launcher_test::clean_env(), limit);
  if (!run.exited || run.exit_code != 0) {
    throw std::runtime_error("the " + std::to_string(world) + " rank processes of " +
                             wrapper_name(wrapper) + " failed" +
                             (run.timed_out ? " (killed after the time limit)" : "") + ":\n" +
                             run.out + run.err);
  }
  std::vector<std::vector<MasterSlice>> slices;
  for (int r = 0; r < world; ++r) {
    RankOutcome o = load_rank(dir.path, r);
    if (r == 0) {
      result.norms = o.norms;
      result.stepped = o.stepped;
    }
    slices.push_back(std::move(o.slices));
  }
  if (wrapper == Wrapper::kDdp) {
    for (int r = 1; r < world && result.replica_difference.empty(); ++r) {
      const std::string d = difference(assemble({slices[r]}), assemble({slices[0]}));
      if (!d.empty()) result.replica_difference = "rank " + std::to_string(r) + ": " + d;
    }
  }
  result.masters = assemble(slices);
  return result;
}

std::map<std::string, at::Tensor> initial_masters(const Recipe& recipe) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : make_net(recipe.size, recipe.seed, recipe.model)->named_parameters()) {
    out[p.key()] = p.value().detach().reshape({-1});
  }
  return out;
}

}  // namespace tandem::gpu_test
