// Bucket planning (include/tandem/runtime/bucket_plan.h).
#include <tandem/runtime/bucket_plan.h>

#include <tandem/base/errors.h>

#include <algorithm>
#include <map>

namespace tandem {

BucketPlan plan_buckets(const std::vector<int64_t>& order,
                        const std::vector<at::ScalarType>& dtypes,
                        const std::vector<int64_t>& bytes, int64_t first_cap_bytes,
                        int64_t cap_bytes) {
  struct Open {
    std::vector<int64_t> params;
    int64_t bytes = 0;
    bool first = true;
  };
  std::map<at::ScalarType, Open> open;
  BucketPlan closed;
  for (int64_t p : order) {
    Open& b = open[dtypes.at(p)];
    b.params.push_back(p);
    b.bytes += bytes.at(p);
    if (b.bytes >= (b.first ? first_cap_bytes : cap_bytes)) {
      closed.push_back(std::move(b.params));
      b.params.clear();
      b.bytes = 0;
      b.first = false;
    }
  }
  for (auto& [dtype, b] : open) {
    if (!b.params.empty()) closed.push_back(std::move(b.params));
  }
  // Launch order follows the gradient order: sort by the position of each bucket's first param.
  std::vector<int64_t> position(order.size() ? *std::max_element(order.begin(), order.end()) + 1
                                             : 0);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int64_t>(i);
  std::stable_sort(closed.begin(), closed.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  return closed;
}

int64_t flat_alignment(c10::Device device) { return device.is_cuda() ? 256 : 64; }

std::vector<int64_t> flat_layout(const std::vector<int64_t>& numels, int64_t element_size,
                                 c10::Device device, int64_t* total) {
  // Element sizes (1, 2, 4, 8 bytes) divide both alignments.
  const int64_t step = std::max<int64_t>(1, flat_alignment(device) / element_size);
  std::vector<int64_t> offsets;
  int64_t end = 0;
  for (int64_t n : numels) {
    const int64_t offset = (end + step - 1) / step * step;
    offsets.push_back(offset);
    end = offset + n;
  }
  *total = end;
  return offsets;
}

std::vector<int64_t> reverse_registration_order(int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(order.size() - 1 - i);
  return order;
}

void check_bucket_plan(const BucketPlan& plan, const std::vector<at::ScalarType>& dtypes,
                       const std::vector<std::string>& names) {
  const int64_t n = static_cast<int64_t>(dtypes.size());
  std::vector<int> seen(dtypes.size(), 0);
  for (size_t b = 0; b < plan.size(); ++b) {
    for (int64_t p : plan[b]) {
      if (p < 0 || p >= n || seen[p]++) {
        throw ConfigError("tandem: bucket plan: bucket " + std::to_string(b) + " lists parameter " +
                          std::to_string(p) + ", which is out of range (the model has " +
                          std::to_string(n) + ") or already in a bucket. The plan was saved for "
                          "another model; resume with the model it was saved with.");
      }
      if (dtypes[p] != dtypes[plan[b].front()]) {
        throw ConfigError("tandem: bucket plan: bucket " + std::to_string(b) +
                          " mixes dtypes (parameter '" + names[p] + "'); the plan was saved "
                          "for another model.");
      }
    }
    if (plan[b].empty()) throw ConfigError("tandem: bucket plan: bucket " + std::to_string(b) + " is empty.");
  }
  for (int64_t p = 0; p < n; ++p) {
    if (!seen[p]) {
      throw ConfigError("tandem: bucket plan: parameter '" + names[p] +
                        "' is in no bucket; the plan was saved for another model.");
    }
  }
}

}  // namespace tandem
