// The job token: a shared secret that ties the agents of one multi-node job to its rendezvous.
//
// What: where the token comes from (TANDEM_JOB_TOKEN or --rdzv-token-file; single-node runs have
// no store and need none) and the keyed digest the rendezvous exchanges instead of the token.
// Ownership: plain values. Thread-safety: pure functions. Errors: tandem::ConfigError naming the
// variable or file and what to do.
//
// The digest is XXH3-128 over (token, label, nonce): it proves knowledge of the token without
// sending it, and a foreign job (another token) cannot produce it by accident. XXH3 is not a
// cryptographic MAC: the token guards against mix-ups between jobs, not against an attacker who
// can watch the rendezvous traffic (use a private network for that, like torchrun).
#pragma once

#include <string>
#include <vector>

namespace tandem::launcher {

// The token of this job: TANDEM_JOB_TOKEN from `env` ("KEY=VALUE" entries) when set, else the
// first line of `token_file` when that is not empty. Throws ConfigError when the file cannot be
// read or the token is empty or shorter than 8 characters. Returns "" when neither is given.
std::string load_job_token(const std::vector<std::string>& env, const std::string& token_file);

// A fresh random nonce (16 hex digits).
std::string generate_nonce();

// 32 hex digits: XXH3-128 of the token, `label` and `nonce`, separated by NUL bytes.
std::string token_digest(const std::string& token, const std::string& label,
                         const std::string& nonce);

}  // namespace tandem::launcher
