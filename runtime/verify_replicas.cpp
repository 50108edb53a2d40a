// verify_replicas (include/tandem/runtime/verify_replicas.h).
#include <tandem/runtime/verify_replicas.h>

#include <tandem/base/errors.h>
#include <tandem/checkpoint/format.h>

#include "base/strings.h"
#include "runtime/rank_agreement.h"

#include <torch/nn/module.h>

#include <sstream>
#include <string>
#include <vector>

namespace tandem {

namespace {

// One line per tensor: "<name> <dtype> <shape> <hash>".
std::string describe(const torch::nn::Module& module) {
  std::ostringstream out;
  auto line = [&](const std::string& kind, const std::string& name, const at::Tensor& t) {
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    out << kind << " " << name << " " << c10::toString(c.scalar_type()) << " " << c.sizes() << " "
        << hash_hex(xxh3_64(c.data_ptr(), c.nbytes())) << "\n";
  };
  for (const auto& p : module.named_parameters(/*recurse=*/true)) line("parameter", p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) line("buffer", b.key(), b.value());
  return out.str();
}

// "parameter fc1.weight" and what differs between two lines of describe().
std::string difference(const std::string& a, const std::string& b) {
  const auto x = strings::split_words(a), y = strings::split_words(b);
  if (x.size() < 2) return "rank 0 has no tensor here but the other has " + b;
  if (y.size() < 2) return x[0] + " '" + x[1] + "' is missing on the other rank";
  if (x[1] != y[1]) return "rank 0 has " + x[0] + " '" + x[1] + "' where the other has " + y[0] + " '" + y[1] + "'";
  if (x[2] != y[2]) return x[0] + " '" + x[1] + "' is " + x[2] + " on rank 0 but " + y[2] + " on the other";
  if (a.substr(0, a.rfind(' ')) != b.substr(0, b.rfind(' '))) {
    return x[0] + " '" + x[1] + "' has another shape (rank 0: " + a.substr(a.find('[')) + ")";
  }
  return x[0] + " '" + x[1] + "' holds different values (XXH3 " + x.back() + " on rank 0, " + y.back() +
         " on the other)";
}

}  // namespace

void verify_replicas(const torch::nn::Module& module, Communicator& comm) {
  const std::vector<std::string> texts = detail::allgather_strings(comm, describe(module));
  const auto reference = strings::split_lines(texts[0]);
  std::vector<int> differing;
  std::string first;
  for (size_t r = 1; r < texts.size(); ++r) {
    const auto other = strings::split_lines(texts[r]);
    for (size_t i = 0; i < std::max(reference.size(), other.size()); ++i) {
      const std::string a = i < reference.size() ? reference[i] : "";
      const std::string b = i < other.size() ? other[i] : "";
      if (a == b) continue;
      if (first.empty()) first = difference(a, b);
      differing.push_back(static_cast<int>(r));
      break;
    }
  }
  if (differing.empty()) return;
  std::string ranks;
  for (int r : differing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  throw Error("tandem: verify_replicas: rank(s) " + ranks + " hold other parameters or buffers than rank 0; "
              "first difference (rank " + std::to_string(differing[0]) + "): " + first +
              ". The replicas have diverged: look for a step one rank skipped, a rank-dependent "
              "update or a checkpoint loaded on some ranks only.");
}

}  // namespace tandem
