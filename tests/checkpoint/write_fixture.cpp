// Writes a small checkpoint with known contents for tests/checkpoint/test_checkpoint_reader.py:
//   checkpoint_write_fixture DIR
// Step 7, one rank; state "t" holds arange-based tensors of every dtype, state "user" values.
#include <tandem/checkpoint/checkpoint_manager.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  try {
    tandem::posix_file_system()->remove_all(argv[1]);
    tandem::CheckpointManagerOptions o;
    o.directory = argv[1];
    o.async = false;
    o.metadata["purpose"] = "python reader fixture";
    tandem::CheckpointManager m(o);
    std::map<std::string, at::Tensor> t = {
        {"f32", at::arange(12, at::kFloat).reshape({3, 4})},
        {"f64", at::arange(5, at::kDouble) / 4},
        {"f16", at::arange(6, at::kHalf) - 2},
        {"bf16", at::arange(4, at::kBFloat16) * 3},
        {"i64", at::arange(-3, 3, at::kLong) * int64_t{1000000000000}},
        {"i32", at::arange(7, at::kInt)},
        {"i16", at::arange(3, at::kShort)},
        {"i8", at::arange(-2, 2, at::kChar)},
        {"u8", at::arange(250, 256, at::kLong).to(at::kByte)},
        {"bool", at::arange(4, at::kLong) % 2 == 0},
        {"empty", at::empty({0, 3})},
        {"scalar", at::full({}, 2.5)},
    };
    m.add_tensors("t", [&] { return t; }, [&](const std::map<std::string, at::Tensor>& v) { t = v; });
    m.set_value("step", int64_t{7});
    m.set_value("lr", 0.25);
    m.set_value("name", std::string("fixture \xe2\x9c\x93"));
    m.set_value("done", false);
    m.save(7);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_write_fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}
