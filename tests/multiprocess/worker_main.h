// Shared main() of the multi-process test workers: connect with tandem::init(), run the
// scenario, and turn tandem errors into exit codes the tests check: 4 ConfigError,
// 5 TimeoutError, 6 CommError, 7 other tandem::Error, each printed as
// "tandem error (<Type>): <message>".
#pragma once

#include <tandem/tandem.h>

#include <cstdio>
#include <functional>

namespace tandem::testing {

inline int run_worker(const std::function<int(Distributed&)>& scenario) {
  try {
    auto dist = init();
    std::printf("connected %s\n", dist.env.describe().c_str());
    std::fflush(stdout);
    return scenario(dist);
  } catch (const ConfigError& e) {
    std::printf("tandem error (ConfigError): %s\n", e.what());
    return 4;
  } catch (const TimeoutError& e) {
    std::printf("tandem error (TimeoutError): %s\n", e.what());
    return 5;
  } catch (const CommError& e) {
    std::printf("tandem error (CommError): %s\n", e.what());
    return 6;
  } catch (const Error& e) {
    std::printf("tandem error (Error): %s\n", e.what());
    return 7;
  }
}

}  // namespace tandem::testing
