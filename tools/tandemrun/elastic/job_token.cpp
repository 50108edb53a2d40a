#include "tools/tandemrun/elastic/job_token.h"

#include <xxhash.h>

#include <cstdio>
#include <fstream>
#include <random>

#include <tandem/base/errors.h>

namespace tandem::launcher {
namespace {

constexpr std::size_t kMinTokenLength = 8;

std::string random_hex(int digits) {
  std::random_device device;
  std::uniform_int_distribution<unsigned> digit(0, 15);
  std::string text;
  for (int i = 0; i < digits; ++i) text += "0123456789abcdef"[digit(device)];
  return text;
}

std::string checked(std::string token, const std::string& source) {
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t'))
    token.pop_back();
  if (token.size() < kMinTokenLength) {
    throw ConfigError("the job token from " + source + " has " + std::to_string(token.size()) +
                      " characters; use at least " + std::to_string(kMinTokenLength) +
                      " (e.g. the output of `head -c 16 /dev/urandom | xxd -p`)");
  }
  return token;
}

}  // namespace

std::string load_job_token(const std::vector<std::string>& env, const std::string& token_file) {
  const std::string key = "TANDEM_JOB_TOKEN=";
  for (const auto& entry : env) {
    if (entry.compare(0, key.size(), key) == 0)
      return checked(entry.substr(key.size()), "TANDEM_JOB_TOKEN");
  }
  if (token_file.empty()) return "";
  std::ifstream in(token_file);
  if (!in) {
    throw ConfigError("cannot read the job token file '" + token_file +
                      "' (--rdzv-token-file); check the path and its permissions");
  }
  std::string line;
  std::getline(in, line);
  return checked(line, "'" + token_file + "'");
}

std::string generate_nonce() { return random_hex(16); }

std::string token_digest(const std::string& token, const std::string& label,
                         const std::string& nonce) {
  std::string message = token;
  message += '\0';
  message += label;
  message += '\0';
  message += nonce;
  const XXH128_hash_t h = XXH3_128bits(message.data(), message.size());
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return text;
}

}  // namespace tandem::launcher
