// A small byte-level transformer language model and its data, shared by the examples
// (train_lm, train_compressed, train_fault_tolerant). Header-only on purpose: copy it.
//
// Model: token + position embeddings, `layers` pre-LayerNorm blocks (causal multi-head attention,
// GELU MLP), a final LayerNorm and a linear head over the 256 byte values.
// Data: the bytes of a text file, or a synthetic text from a small grammar (the default), so the
// loss falls visibly within a few hundred steps. Batches depend only on (seed, step, rank).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tiny_lm {

struct LmConfig {
  int64_t vocab = 256;  // bytes
  int64_t context = 64;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t layers = 2;
};

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads)
      : heads(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        proj(register_module("proj", torch::nn::Linear(dim, dim))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc(register_module("fc", torch::nn::Linear(dim, 4 * dim))),
        out(register_module("out", torch::nn::Linear(4 * dim, dim))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    auto parts = qkv(ln1(x)).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    auto q = parts[0], k = parts[1], v = parts[2];  // [b, heads, t, hd]
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto causal = torch::ones({t, t}, x.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    auto attended = torch::matmul(torch::softmax(scores, -1), v);
    auto h = x + proj(attended.transpose(1, 2).reshape({b, t, d}));
    return h + out(torch::gelu(fc(ln2(h))));
  }

  int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
};
TORCH_MODULE(Block);

struct TinyLmImpl : torch::nn::Module {
  explicit TinyLmImpl(const LmConfig& c)
      : config(c),
        tokens(register_module("tokens", torch::nn::Embedding(c.vocab, c.dim))),
        positions(register_module("positions", torch::nn::Embedding(c.context, c.dim))),
        blocks(register_module("blocks", torch::nn::Sequential())),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        head(register_module("head", torch::nn::Linear(c.dim, c.vocab))) {
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c.dim, c.heads));
  }

  // ids: [batch, t] int64 with t <= context. Returns logits [batch, t, vocab].
  torch::Tensor forward(const torch::Tensor& ids) {
    auto pos = torch::arange(ids.size(1), ids.options());
    return head(ln(blocks->forward(tokens(ids) + positions(pos))));
  }

  LmConfig config;
  torch::nn::Embedding tokens, positions;
  torch::nn::Sequential blocks;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
};
TORCH_MODULE(TinyLm);

// The model's input of a batch of windows [batch, context + 1]: all but the last byte.
inline torch::Tensor lm_inputs(const torch::Tensor& windows) {
  return windows.narrow(1, 0, windows.size(1) - 1);
}

// Next-byte cross-entropy of `logits` [batch, context, vocab] (the model's output on
// lm_inputs(windows)) against the windows shifted by one byte.
inline torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& windows) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              windows.narrow(1, 1, logits.size(1)).reshape({-1}));
}

// A synthetic English-like text: sentences from a small grammar, deterministic in `seed`.
inline std::string synthetic_text(std::size_t bytes, uint64_t seed) {
  static const std::vector<std::string> subjects = {"the cat", "a dog", "the old man", "my sister",
                                                    "the bird", "a child", "the teacher"};
  static const std::vector<std::string> verbs = {"sees", "likes", "finds", "carries", "watches",
                                                 "follows", "paints"};
  static const std::vector<std::string> objects = {"the ball", "a red box", "the river",
                                                   "an apple", "the small boat", "a letter"};
  static const std::vector<std::string> endings = {" today", " at night", " in the garden", "",
                                                   " again", " slowly"};
  std::mt19937_64 rng(seed);
  auto pick = [&rng](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  std::string text;
  while (text.size() < bytes) {
    text += pick(subjects) + " " + pick(verbs) + " " + pick(objects) + pick(endings) + ". ";
    if (rng() % 5 == 0) text += "\n";
  }
  text.resize(bytes);
  return text;
}

// The bytes of `path`; throws std::runtime_error naming the file when it is missing or too short.
inline std::string read_text(const std::string& path, int64_t min_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read text file '" + path + "': check the path");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (static_cast<int64_t>(text.size()) < min_bytes)
    throw std::runtime_error("text file '" + path + "' has " + std::to_string(text.size()) +
                             " bytes; it needs at least " + std::to_string(min_bytes));
  return text;
}

// The text as a uint8 tensor of byte values.
inline torch::Tensor text_tensor(const std::string& text) {
  return torch::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())},
                          torch::kUInt8)
      .to(torch::kLong);
}

// `batch` random windows of context + 1 bytes for (step, rank): the same on every run.
inline torch::Tensor batch_windows(const torch::Tensor& data, int64_t batch, int64_t context,
                                   uint64_t seed, int64_t step, int rank) {
  std::seed_seq seq{seed, static_cast<uint64_t>(step), static_cast<uint64_t>(rank)};
  std::mt19937_64 rng(seq);
  const uint64_t starts = static_cast<uint64_t>(data.size(0) - context - 1);
  std::vector<torch::Tensor> rows;
  for (int64_t i = 0; i < batch; ++i)
    rows.push_back(data.narrow(0, static_cast<int64_t>(rng() % starts), context + 1));
  return torch::stack(rows);
}

// Greedy continuation of `prompt` by `n` bytes (for showing what the model learned).
inline std::string generate(TinyLm& model, const std::string& prompt, int64_t n) {
  torch::NoGradGuard no_grad;
  std::string text = prompt;
  for (int64_t i = 0; i < n; ++i) {
    const auto start = text.size() > static_cast<std::size_t>(model->config.context)
                           ? text.size() - static_cast<std::size_t>(model->config.context)
                           : 0;
    auto ids = text_tensor(text.substr(start)).unsqueeze(0).to(model->head->weight.device());
    auto next = model(ids).select(1, ids.size(1) - 1).argmax(-1).item<int64_t>();
    text.push_back(static_cast<char>(next));
  }
  return text;
}

}  // namespace tiny_lm
