#include "runtime/rank_agreement.h"

#include <tandem/base/errors.h>

#include "base/strings.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

namespace tandem::detail {

std::vector<std::string> allgather_strings(Communicator& comm, const std::string& text) {
  const int n = comm.size();
  if (n == 1) return {text};
  at::Tensor length = at::empty({1}, at::kLong);
  length.data_ptr<int64_t>()[0] = static_cast<int64_t>(text.size());
  at::Tensor lengths = at::empty({n}, at::kLong);
  comm.allgather(lengths, length)->wait();
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths.data_ptr<int64_t>()[r]);
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::copy(text.begin(), text.end(), padded.data_ptr<uint8_t>());
  at::Tensor all = at::empty({n * longest}, at::kByte);
  comm.allgather(all, padded)->wait();
  std::vector<std::string> texts;
  for (int r = 0; r < n; ++r) {
    const char* base = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * longest;
    texts.emplace_back(base, static_cast<size_t>(lengths.data_ptr<int64_t>()[r]));
  }
  return texts;
}

void check_same_on_every_rank(Communicator& comm, const std::string& description,
                              const std::string& what, const std::string& fix) {
  const std::vector<std::string> texts = allgather_strings(comm, description);
  const auto reference = strings::split_lines(texts[0]);
  for (size_t r = 1; r < texts.size(); ++r) {
    const auto other = strings::split_lines(texts[r]);
    for (size_t i = 0; i < std::max(reference.size(), other.size()); ++i) {
      const std::string a = i < reference.size() ? reference[i] : "(nothing)";
      const std::string b = i < other.size() ? other[i] : "(nothing)";
      if (a == b) continue;
      throw ConfigError(what + ": first difference at line #" + std::to_string(i) + ": rank 0 '" +
                        a + "' vs rank " + std::to_string(r) + " '" + b + "'. " + fix);
    }
  }
}

}  // namespace tandem::detail
