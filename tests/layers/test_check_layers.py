#!/usr/bin/env python3
"""scripts/check-layers passes on the tree and fails on includes planted against the layers.

Each case copies the repository's source folders into a temporary directory, plants one include
and expects the check to fail naming the file, the line and the rule; the untouched copy passes.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHECK = os.path.join(ROOT, "scripts", "check-layers")
FOLDERS = ["include", "base", "memory", "collectives", "checkpoint", "runtime", "tools", "tests",
           "bench", "examples"]


def run_check(root):
    p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


class CheckLayers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-layers-")
        cls.clean = os.path.join(cls.tmp, "clean")
        for folder in FOLDERS:
            shutil.copytree(os.path.join(ROOT, folder), os.path.join(cls.clean, folder),
                            ignore=shutil.ignore_patterns("*.json", "*.safetensors", "*.png"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def planted(self, rel, include):
        """A copy of the clean tree with `include` added as the first line of `rel`."""
        root = tempfile.mkdtemp(dir=self.tmp)
        os.rmdir(root)
        shutil.copytree(self.clean, root)
        path = os.path.join(root, rel)
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(include + "\n" + text)
        return root

    def test_the_tree_passes(self):
        code, out = run_check(ROOT)
        self.assertEqual(code, 0, out)

    def test_collectives_including_runtime_fails(self):
        code, out = run_check(self.planted("collectives/communicator.cpp",
                                           "#include <tandem/runtime/context.h>"))
        self.assertEqual(code, 1, out)
        self.assertIn("collectives/communicator.cpp:1: collectives/ includes tandem/runtime/context.h "
                      "from runtime/", out)

    def test_base_including_memory_fails(self):
        code, out = run_check(self.planted("base/json.cpp", "#include <tandem/memory/memory_stats.h>"))
        self.assertEqual(code, 1, out)
        self.assertIn("base/json.cpp:1: base/ includes tandem/memory/memory_stats.h from memory/", out)

    def test_base_including_torch_fails(self):
        code, out = run_check(self.planted("base/json.cpp", "#include <ATen/core/Tensor.h>"))
        self.assertEqual(code, 1, out)
        self.assertIn("base/json.cpp:1: includes <ATen/core/Tensor.h>: base/ must build without libtorch",
                      out)

    def test_memory_core_including_torch_fails(self):
        code, out = run_check(self.planted("memory/caching_pool.cpp", "#include <c10/core/Allocator.h>"))
        self.assertEqual(code, 1, out)
        self.assertIn("memory/caching_pool.cpp:1: includes <c10/core/Allocator.h>", out)

    def test_public_header_including_private_fails(self):
        code, out = run_check(self.planted("include/tandem/collectives/communicator.h",
                                           '#include "collectives/async_work.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('include/tandem/collectives/communicator.h:1: public header includes private '
                      '"collectives/async_work.h"', out)

    def test_program_including_library_private_fails(self):
        code, out = run_check(self.planted("tools/tandemrun/main.cpp",
                                           '#include "checkpoint/step_directory.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('tools/tandemrun/main.cpp:1: a program includes "checkpoint/step_directory.h"', out)

    def test_component_including_another_components_private_header_fails(self):
        code, out = run_check(self.planted("runtime/init.cpp", '#include "collectives/async_work.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('runtime/init.cpp:1: runtime/ includes "collectives/async_work.h", a private '
                      'header of collectives/', out)

    def test_checkpoint_including_collectives_private_header_fails(self):
        # checkpoint/ may use collectives/ (rank agreement), but only through its public headers.
        code, out = run_check(self.planted("checkpoint/format.cpp",
                                           '#include "collectives/tensor_checks.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('checkpoint/format.cpp:1: checkpoint/ includes '
                      '"collectives/tensor_checks.h", a private header of collectives/', out)

    def test_component_including_base_private_header_passes(self):
        code, out = run_check(self.planted("checkpoint/format.cpp", '#include "base/strings.h"'))
        self.assertEqual(code, 0, out)

    def test_program_including_another_programs_header_fails(self):
        code, out = run_check(self.planted("tools/tandemrun/main.cpp",
                                           '#include "tools/tandem-tune/tune_plan.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('tools/tandemrun/main.cpp:1: the program tools/tandemrun/ includes '
                      '"tools/tandem-tune/tune_plan.h", a header of another program', out)

    def test_program_including_a_tool_library_passes(self):
        code, out = run_check(self.planted("tools/tandem-tune/tandem_tune.cpp",
                                           '#include "tools/trace-tools/trace_svg.h"'))
        self.assertEqual(code, 0, out)

    def test_tool_library_including_a_program_header_fails(self):
        code, out = run_check(self.planted("tools/trace-tools/trace_merge.cpp",
                                           '#include "tools/tandemrun/launch/fd_io.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('tools/trace-tools/trace_merge.cpp:1: the tool library tools/trace-tools/ '
                      'includes "tools/tandemrun/launch/fd_io.h"', out)

    def test_example_including_private_fails(self):
        code, out = run_check(self.planted("examples/train_mlp.cpp", '#include "base/json.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('examples/train_mlp.cpp:1: examples use public headers only', out)

    def test_relative_private_include_fails(self):
        code, out = run_check(self.planted("collectives/communicator.cpp", '#include "async_work.h"'))
        self.assertEqual(code, 1, out)
        self.assertIn('spell private includes from the repository root', out)

    def test_dynamic_cast_to_a_concrete_communicator_fails(self):
        code, out = run_check(self.planted(
            "collectives/codec_wire.cpp",
            "static auto* g(tandem::Communicator* c) { return dynamic_cast<tandem::GlooCommunicator*>(c); }"))
        self.assertEqual(code, 1, out)
        self.assertIn("collectives/codec_wire.cpp:1: dynamic_cast to GlooCommunicator: ask the "
                      "communicator for the capability", out)

    def test_dynamic_cast_in_a_test_passes(self):
        # Tests may look at a backend's internals.
        code, out = run_check(self.planted(
            "tests/unit/backend_test.cpp",
            "static auto* g(tandem::Communicator* c) { return dynamic_cast<tandem::GlooCommunicator*>(c); }"))
        self.assertEqual(code, 0, out)

    def assert_refused(self, rel, line, message):
        """Planting `line` in `rel` fails the check with `message` at rel:1."""
        code, out = run_check(self.planted(rel, line))
        self.assertEqual(code, 1, out)
        self.assertIn(f"{rel}:1: {message}", out)

    def test_getenv_outside_dist_env_and_the_launch_contract_fails(self):
        self.assert_refused("runtime/metrics.cpp",
                            'static const char* f() { return std::getenv("TANDEM_X"); }',
                            "reads the environment: only DistEnv")

    def test_environ_outside_the_launch_contract_fails(self):
        self.assert_refused("collectives/flight_recorder.cpp",
                            "static char** f() { return environ; }", "reads the environment")

    def test_launch_env_of_a_string_fails(self):
        self.assert_refused("runtime/metrics.cpp",
                            'static auto f() { return tandem::launch::env("TANDEM_X"); }',
                            "launch::env() of a string: name the variable")

    def assert_passes(self, rels, line):
        """Planting `line` in each of `rels` leaves the check passing."""
        for rel in rels:
            code, out = run_check(self.planted(rel, line))
            self.assertEqual(code, 0, rel + "\n" + out)

    def test_getenv_in_dist_env_and_in_a_test_passes(self):
        self.assert_passes(("runtime/dist_env.cpp", "tests/unit/backend_test.cpp"),
                           'static const char* f() { return std::getenv("RANK"); }')

    def test_a_process_group_outside_collectives_fails(self):
        for rel in ("checkpoint/checkpoint_manager.cpp", "runtime/ft/fault_tolerant_world.cpp",
                    "tools/tandemrun/main.cpp", "bench/sharded/bench_sharded.cpp"):
            self.assert_refused(rel, "static auto f(tandem::Communicator& c) { return c.split(0, 0); }",
                                "split() makes a process group outside collectives/")
        self.assert_refused("runtime/pipeline/pipeline_stats.cpp",
                            "static auto f(tandem::Communicator* c) { return c->new_group({0}); }",
                            "new_group() makes a process group outside collectives/")

    def test_a_process_group_in_device_mesh_and_in_a_test_passes(self):
        self.assert_passes(("collectives/device_mesh.cpp", "tests/unit/backend_test.cpp"),
                           "static auto f(tandem::Communicator& c) { return c.split(0, 0); }")


if __name__ == "__main__":
    unittest.main(verbosity=2)
